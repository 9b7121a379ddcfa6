"""What an instance can reach: a function (run as ``python -c PROBE``) that
answers any GET with, for each target in ``$PROBE_TARGETS`` (comma-
separated), what it found: for ``host:port`` what a TCP connection there
read (``ok:<first bytes>``), for ``dns:host:port`` whether a DNS query for
``localhost`` there was answered (``ok:answered``), for ``dev:host:port``
the same as ``host:port`` from a socket bound to the tap device
(``SO_BINDTODEVICE``, which passes routes by), for ``file:PATH`` the
file (``ok:<text>``), or the error's name; and a TCP server that greets
whoever connects, to be reached. Shared by the egress tests as the root
agent (tests/nodeagent/test_egress.py) and as an agent that is not root
(tests/nodeagent/egress_agent.py)."""

from __future__ import annotations

import os
import shutil
import struct
import subprocess
import sys

import pytest

#: A DNS query for localhost's address (id 0x4761, recursion desired).
DNS_QUERY = (
    struct.pack(">HHHHHH", 0x4761, 0x0100, 1, 0, 0, 0)
    + b"\x09localhost\x00"
    + struct.pack(">HH", 1, 1)
)

PROBE = (
    "import http.server, json, os, socket\n"
    f"QUERY = {DNS_QUERY!r}\n"
    "def reach(target):\n"
    "    if target.startswith('file:'):\n"
    "        return 'ok:' + open(target[5:]).read()\n"
    "    kind = target[:3] if target[:4] in ('dns:', 'dev:') else ''\n"
    "    host, port = target[len(kind) + bool(kind):].rsplit(':', 1)\n"
    "    try:\n"
    "        if kind == 'dns':\n"
    "            with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:\n"
    "                s.settimeout(3); s.sendto(QUERY, (host, int(port)))\n"
    "                got = s.recv(512)\n"
    "            return 'ok:answered' if got[:2] == QUERY[:2] else 'ok:other'\n"
    "        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:\n"
    "            s.settimeout(3)\n"
    "            if kind == 'dev':  # past the routing table, as if on the link\n"
    "                s.setsockopt(socket.SOL_SOCKET, socket.SO_BINDTODEVICE, b'tap0')\n"
    "            s.connect((host, int(port)))\n"
    "            return 'ok:' + s.recv(64).decode()\n"
    "    except OSError as e:\n"
    "        return type(e).__name__\n"
    "class H(http.server.BaseHTTPRequestHandler):\n"
    "    def do_GET(self):\n"
    "        targets = [t for t in os.environ.get('PROBE_TARGETS', '').split(',') if t]\n"
    "        body = json.dumps({t: reach(t) for t in targets}).encode()\n"
    "        self.send_response(200); self.end_headers(); self.wfile.write(body)\n"
    "    def log_message(self, *a): pass\n"
    "http.server.HTTPServer((os.environ['HOST'], int(os.environ['PORT'])), H).serve_forever()\n"
)

#: Run as ``python -c GREETER HOST``: prints its port, then greets each caller.
GREETER = (
    "import socket, sys\n"
    "s = socket.create_server((sys.argv[1], 0))\n"
    "print(s.getsockname()[1], flush=True)\n"
    "while True:\n"
    "    c, _ = s.accept()\n"
    "    c.sendall(b'hello from ' + sys.argv[1].encode())\n"
    "    c.close()\n"
)


def greeter(prefix: list[str], host: str) -> tuple[subprocess.Popen[str], str]:
    """A GREETER on host, run with prefix (``ip netns exec NS`` for another
    host); returns it and its ``host:port`` once it listens."""
    proc = subprocess.Popen(
        [*prefix, sys.executable, "-c", GREETER, host], stdout=subprocess.PIPE, text=True
    )
    assert proc.stdout is not None
    port = proc.stdout.readline().strip()  # printed once listening
    assert port.isdigit(), f"the greeter on {host} did not start"
    return proc, f"{host}:{port}"


def require_slirp() -> None:
    """Skip (in CI: fail) where slirp4netns is missing."""
    if shutil.which("slirp4netns") is None:
        if os.environ.get("CI"):
            pytest.fail("slirp4netns is missing; CI must run this test (.ci/run installs it)")
        pytest.skip("needs slirp4netns")
