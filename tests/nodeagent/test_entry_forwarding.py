"""IPv4 forwarding for routed entries, in a network namespace of its own
(its settings and Galaxy's markers are its own): Galaxy allows forwarding
only where the host did not, says so, and the last agent out disallows it
again; an interface the host set itself is left as it was."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import uuid
from pathlib import Path

import pytest

from controlplane.nodeagent.entry import netns

pytestmark = pytest.mark.skipif(
    not netns.can_enter() or shutil.which("ip") is None, reason="needs root and iproute2"
)

REPO = Path(__file__).resolve().parents[2]
STEPS = """
import json
from controlplane.nodeagent.entry import forwarding as f
def conf(i): return open(f"/proc/sys/net/ipv4/conf/{i}/forwarding").read().strip()
out = {}
out["galaxy_allows"] = f.allow("d0")
out["again"] = f.allow("d0")
out["hosts_own"] = f.allow("d1")
out["on"] = [conf("d0"), conf("d1")]
f.restore(others=True)
out["others_left"] = [conf("d0"), conf("d1")]
f.restore(others=False)
out["last_out"] = [conf("d0"), conf("d1")]
out["markers"] = [p.name for p in f._marker("*").parent.glob(f._marker("*").name)]
out["interface_of"] = f.interface_of("10.77.0.1")
print(json.dumps(out))
"""


def test_galaxy_allows_forwarding_where_the_host_did_not_and_undoes_it_last():
    ns = f"gxfwd-{uuid.uuid4().hex[:8]}"
    subprocess.run(["ip", "netns", "add", ns], check=True)
    try:
        ip = ["ip", "-n", ns]
        for d in ("d0", "d1"):
            # (a veth pair: this kernel may have no dummy interfaces)
            subprocess.run([*ip, "link", "add", d, "type", "veth", "peer", f"{d}p"], check=True)
        subprocess.run([*ip, "addr", "add", "10.77.0.1/24", "dev", "d0"], check=True)
        subprocess.run(
            ["ip", "netns", "exec", ns, "sysctl", "-qw", "net.ipv4.conf.d1.forwarding=1"],
            check=True,
        )
        done = subprocess.run(
            ["ip", "netns", "exec", ns, sys.executable, "-c", STEPS],
            capture_output=True, text=True, cwd=REPO, check=True,
        )  # fmt: skip
        got = json.loads(done.stdout)
    finally:
        subprocess.run(["ip", "netns", "del", ns], check=False)
    assert got["galaxy_allows"] is True and got["again"] is True
    assert got["hosts_own"] is False
    assert got["on"] == ["1", "1"] and got["others_left"] == ["1", "1"]
    assert got["last_out"] == ["0", "1"]  # the host's own setting stays
    assert got["markers"] == []
    assert got["interface_of"] == "d0"
