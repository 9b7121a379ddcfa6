"""`galaxy up` survives kill -9 of its children: each comes back, and the
quick tour works afterwards. Real processes, killed by PID."""

from __future__ import annotations

import json
import os
import signal

import pytest

from tests.integration.upctl import REPO, GalaxyUp

# Real `galaxy` processes: the full suite, not the fast tier.
pytestmark = [pytest.mark.integration, pytest.mark.slow]


@pytest.fixture
def up(tmp_path):
    g = GalaxyUp(tmp_path / "run", "--nodes", "2", "--node-cpu-millis", "1000")
    g.start()
    yield g
    g.reload_endpoints()
    pids = g.pids()
    g.stop()
    assert not g.kill_leftovers(pids), "processes left after shutdown"


@pytest.mark.parametrize("victims", [("schedule-0", "agent-0"), ("dispatch-0", "clustermgr-0")])
def test_killed_children_are_restarted_and_serve(up, victims):
    r = up.cli("deploy", "-f", str(REPO / "examples" / "echo.yaml"))
    assert r.returncode == 0, r.stderr
    for name in victims:
        old = int(up.component(name)["pid"])
        os.kill(old, signal.SIGKILL)
        up.wait_line(f"{name} exited with code -9; restarting")
        up.wait_line(f"{name} restarted")
        up.reload_endpoints()
        assert int(up.component(name)["pid"]) != old
    first = up.cli("invoke", "echo", "--data", "after", timeout=90)
    assert first.returncode == 0, first.stderr + "".join(up.output[-20:])
    body = json.loads(first.stdout.split("HTTP 200: ", 1)[1])
    assert body["echo"] == "after"
    assert up.proc is not None and up.proc.poll() is None  # still running
