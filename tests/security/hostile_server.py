"""A hostile function for the escape suite (tests/security/test_escape.py).

An HTTP server on $HOST:$PORT that, asked on POST /probe with a JSON list of
host paths, pids and URLs, reports from inside its instance what it can see
and do (direct HTTP calls to other instances included); POST /forkbomb forks
until the kernel refuses; POST /memhog allocates until something stops it.
It only reports: the test decides what is an escape.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import sys
import time
import urllib.error
import urllib.request
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer


def status_fields() -> dict[str, str]:
    with open("/proc/self/status") as f:
        return dict(line.rstrip("\n").split(":\t", 1) for line in f if ":\t" in line)


def try_read(path: str) -> str:
    """'read', 'listed' or the error's name."""
    try:
        if os.path.isdir(path):
            os.listdir(path)
            return "listed"
        with open(path, "rb") as f:
            f.read(1)
        return "read"
    except OSError as e:
        return type(e).__name__


def try_kill(pid: int) -> str:
    try:
        os.kill(pid, signal.SIGKILL)
        return "sent"
    except OSError as e:
        return type(e).__name__


def try_http(url: str) -> str:
    """The HTTP status a plain GET (no lease) gets, or the error's name."""
    try:
        with urllib.request.urlopen(url, timeout=3) as resp:
            return str(resp.status)
    except urllib.error.HTTPError as e:
        return str(e.code)
    except (urllib.error.URLError, OSError) as e:
        return type(getattr(e, "reason", e)).__name__


def try_bound(target: str) -> str:
    """A TCP connect, from a socket bound to a device when one is named
    ("[udp:]DEV|HOST:PORT", DEV may be empty; SO_BINDTODEVICE, which an
    unprivileged process may set): "connected", or the error's name
    ("timeout": nothing answered, not even a refusal). With "udp:", one
    datagram is sent instead ("sent")."""
    udp = target.startswith("udp:")
    dev, _, addr = target.removeprefix("udp:").partition("|")
    host, _, port = addr.rpartition(":")
    s = socket.socket(type=socket.SOCK_DGRAM if udp else socket.SOCK_STREAM)
    s.settimeout(3)
    try:
        if dev:
            s.setsockopt(socket.SOL_SOCKET, socket.SO_BINDTODEVICE, dev.encode())
        if udp:
            s.sendto(b"escaped", (host, int(port)))
            return "sent"
        s.connect((host, int(port)))
        return "connected"
    except OSError as e:
        return "timeout" if isinstance(e, TimeoutError) else type(e).__name__
    finally:
        s.close()


#: Inodes of the sockets this server made or accepted.
OWN: set[int] = set()


def foreign_sockets() -> list[str]:
    """This process's socket descriptors that it neither made nor accepted:
    what reached the sandbox from outside."""
    out = []
    for fd in os.listdir("/proc/self/fd"):
        try:
            target = os.readlink(f"/proc/self/fd/{fd}")
        except OSError:
            continue  # listdir's own descriptor, closed since
        if target.startswith("socket:[") and int(target[8:-1]) not in OWN:
            out.append(f"{fd} -> {target}")
    return out


def probe(req: dict) -> dict:
    st = status_fields()
    pids = sorted(int(p) for p in os.listdir("/proc") if p.isdigit())
    foreign = foreign_sockets()  # before the HTTP probes open sockets of their own
    return {
        "foreign_sockets": foreign,
        "uid": os.getuid(),
        "euid": os.geteuid(),
        "cap_eff": st["CapEff"].strip(),
        "cap_bnd": st["CapBnd"].strip(),
        "no_new_privs": st["NoNewPrivs"].strip(),
        "seccomp": st["Seccomp"].strip(),
        "paths": {p: try_read(p) for p in req.get("paths", [])},
        "kills": {str(p): try_kill(p) for p in req.get("kill", [])},
        "http": {u: try_http(u) for u in req.get("http", [])},
        "bound": {t: try_bound(t) for t in req.get("bound", [])},
        "proc_pids": pids,
        "proc_cmdlines": [try_read(f"/proc/{p}/environ") for p in pids],
        "root": sorted(os.listdir("/")),
        # What a home directory shown on the way to the interpreter holds.
        "homes": {d: sorted(os.listdir(d)) for d in ("/root", "/home") if os.path.isdir(d)},
        "environ_keys": sorted(os.environ),
    }


def forkbomb() -> dict:
    children = []
    error = ""
    try:
        for _ in range(100_000):
            pid = os.fork()
            if pid == 0:
                # A small process per pid: the pids limit, not the memory
                # one, is what must stop the loop.
                try:
                    os.execv("/bin/sleep", ["sleep", "30"])
                finally:
                    os._exit(1)
            children.append(pid)
    except OSError as e:
        error = type(e).__name__
    for pid in children:
        os.kill(pid, signal.SIGKILL)
        os.waitpid(pid, 0)
    return {"forked": len(children), "error": error}


def memhog() -> dict:
    hog = []
    for _ in range(100_000):
        hog.append(bytearray(1 << 20))  # 1 MiB at a time, touched (zeroed)
    return {"allocated_mib": len(hog)}


def diskhog() -> dict:
    """Fill the private directory ($HOME) 1 MiB a file, up to 1 GiB, then
    hold the request: the node agent kills the instance at its limit."""
    home = os.environ["HOME"]
    chunk = os.urandom(1 << 20)
    for i in range(1024):
        with open(os.path.join(home, f"hog-{i}"), "wb") as f:
            f.write(chunk)
        time.sleep(0.002)  # ~0.5 GB/s at most: the agent looks every few seconds
    time.sleep(60)
    return {"written_mib": 1024}


def loghog() -> dict:
    """Fill the node's disk through stdout (its log file), 1 MiB a line."""
    line = "x" * ((1 << 20) - 1) + "\n"
    for _ in range(1024):
        sys.stdout.write(line)
        sys.stdout.flush()
        time.sleep(0.002)
    time.sleep(60)
    return {"written_mib": 1024}


class Server(ThreadingHTTPServer):
    def get_request(self) -> tuple:
        conn, addr = super().get_request()
        OWN.add(os.fstat(conn.fileno()).st_ino)
        return conn, addr


class Handler(BaseHTTPRequestHandler):
    def do_GET(self) -> None:
        self._reply({"ok": True})

    def do_POST(self) -> None:
        body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
        req = json.loads(body or b"{}")
        action = {
            "/probe": lambda: probe(req),
            "/forkbomb": forkbomb,
            "/memhog": memhog,
            "/diskhog": diskhog,
            "/loghog": loghog,
        }
        self._reply(action[self.path]())

    def _reply(self, doc: dict) -> None:
        data = json.dumps(doc).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def log_message(self, *args: object) -> None:
        pass


if __name__ == "__main__":
    server = Server((os.environ["HOST"], int(os.environ["PORT"])), Handler)
    OWN.add(os.fstat(server.fileno()).st_ino)
    server.serve_forever()
