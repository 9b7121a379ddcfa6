"""`galaxy up --ha`: two leader-elected controllers on shared state (here a
local etcd child it starts itself); the leader's death (kill -9) is a
restart like any other child's, and the CLI, given both controllers in
endpoints.json, keeps working. Refused without shared state."""

from __future__ import annotations

import json
import os
import signal

import pytest

from controlplane.launch import etcd
from controlplane.launch.up import Supervisor, UpConfig
from tests.etcd_server import require_etcd
from tests.integration.upctl import REPO, GalaxyUp


async def test_ha_needs_shared_state(tmp_path, monkeypatch) -> None:
    sup = Supervisor(UpConfig.for_tool(ha=True, state="redis://somewhere", run_dir=tmp_path))
    with pytest.raises(RuntimeError, match=r"--ha needs shared state: --state etcd://"):
        await sup.start()
    # memory:// means "start a local etcd", which needs the binary.
    monkeypatch.setattr(etcd, "etcd_binary", lambda: None)
    sup = Supervisor(UpConfig.for_tool(ha=True, run_dir=tmp_path))
    with pytest.raises(RuntimeError, match=r"pass --state etcd://"):
        await sup.start()
    assert sup.children == []


@pytest.mark.integration
@pytest.mark.slow
@pytest.mark.etcd
def test_up_ha_survives_the_leading_controllers_death(tmp_path) -> None:
    require_etcd()
    up = GalaxyUp(tmp_path / "run", "--ha", "--nodes", "2", "--sandbox", "emulated")
    up.start()
    try:
        ctls = up.endpoints["controllers"]
        assert len(ctls) == 2 and up.controller == ",".join(ctls)
        assert up.component("etcd") and (tmp_path / "run" / "etcd").is_dir()
        # Dispatch and ClusterMgr keep their state in that etcd too, not in
        # their own memory (a restarted one would forget its leases).
        for kind in ("dispatch-0", "clustermgr-0"):
            argv = _argv(int(up.component(kind)["pid"]))
            state = argv[argv.index("--state") + 1]
            assert state.startswith("etcd://"), (kind, state)
        r = up.cli("deploy", "-f", str(REPO / "examples" / "echo.yaml"))
        assert r.returncode == 0, r.stderr
        st = json.loads(up.cli("status", "--json").stdout)
        leader = st["controller"]["leader_id"]
        old = int(up.component(leader)["pid"])
        os.kill(old, signal.SIGKILL)
        up.wait_line(f"{leader} restarted")
        # Right after: the other controller may still wait for the lease to
        # expire; the CLI retries its reads and the call succeeds.
        r = up.cli("invoke", "echo", "--data", "after", timeout=90)
        assert r.returncode == 0, r.stderr + "".join(up.output[-20:])
        up.reload_endpoints()
        assert int(up.component(leader)["pid"]) != old
        assert up.endpoints["controllers"] == ctls  # the restarted one kept its port
    finally:
        up.reload_endpoints()
        pids = up.pids()
        up.stop()
        assert not up.kill_leftovers(pids), "processes left after shutdown"


def _argv(pid: int) -> list[str]:
    """A process's command line, as the kernel holds it."""
    with open(f"/proc/{pid}/cmdline", "rb") as f:
        return [a.decode() for a in f.read().split(b"\0") if a]
