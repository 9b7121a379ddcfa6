"""The HA membership mirror (`HA_PREFIX/members/KIND/ID`) is leased: the
leading controller's records carry an etcd lease of at most
``members_ttl_s`` that it keeps alive, so a successor can adopt them, and a
cleanly stopped control plane leaves none behind for longer than that lease.
A real controller process and a real etcd, read with etcdctl (a client we
did not write)."""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import signal
import subprocess
import uuid

import grpc
import pytest

from controlplane.controller.main import members_ttl_s
from galaxy.v1 import common_pb2, controller_pb2_grpc, schedule_pb2_grpc
from statestore import open_store
from tests.controller.conftest import ScheduleStandIn, serve
from tests.controller.test_ha import ControllerProc

pytestmark = [pytest.mark.etcd, pytest.mark.slow, pytest.mark.timeout(90)]


def _etcdctl(endpoint: str, *args: str) -> str:
    if shutil.which("etcdctl") is None:
        if os.environ.get("CI"):
            pytest.fail("etcdctl is missing; .ci/run installs etcd-client")
        pytest.skip("needs etcdctl (Debian etcd-client)")
    r = subprocess.run(["etcdctl", f"--endpoints={endpoint}", *args], capture_output=True,
                       text=True, timeout=30, env={**os.environ, "ETCDCTL_API": "3"})  # fmt: skip
    assert r.returncode == 0, r.stderr
    return r.stdout


async def poll(check, within_s: float, what: str) -> None:  # type: ignore[no-untyped-def]
    """Ask another process's state until check() is true (no event to await)."""
    end = asyncio.get_running_loop().time() + within_s
    while not await check():
        if asyncio.get_running_loop().time() > end:
            raise AssertionError(f"timed out waiting for {what}")
        await asyncio.sleep(0.05)


def _lease_of(endpoint: str, key: str) -> int:
    out = json.loads(_etcdctl(endpoint, "get", key, "-w", "json"))
    return int(out["kvs"][0].get("lease", 0))


async def test_member_records_are_leased_and_outlive_a_clean_stop_only_briefly(
    etcd_server, tmp_path
) -> None:
    prefix = f"/t-{uuid.uuid4().hex[:8]}/controller/"
    ctl = ControllerProc(
        "ctl-m", tmp_path, "--state", etcd_server.url, "--ha", "--ha-prefix", prefix,
        "--ha-ttl-s", "2", "--metrics-listen", "", "--lifeline",
    )  # fmt: skip
    store = open_store(etcd_server.url)
    server = None
    try:
        address = await ctl.ready()
        server, addr = await serve(
            schedule_pb2_grpc.add_ScheduleServicer_to_server,
            ScheduleStandIn("sched-m"),
            "galaxy.v1.Schedule",
        )
        me = common_pb2.ControlInstance(
            id="sched-m", kind=common_pb2.CONTROL_KIND_SCHEDULE, address=addr
        )
        async with grpc.aio.insecure_channel(address) as ch:
            stub = controller_pb2_grpc.ControllerStub(ch)

            async def registered() -> bool:
                try:
                    await stub.RegisterInstance(me, timeout=5)
                    return True
                except grpc.aio.AioRpcError:  # not leader yet, a moment after start
                    return False

            await poll(registered, 20, "the registration")
        key = f"{prefix}members/schedule/sched-m"

        async def mirrored() -> bool:
            return await store.get(key) is not None

        await poll(mirrored, 20, f"{key} to be written")
        lease = _lease_of(etcd_server.endpoint, key)
        assert lease != 0, "the member record carries no lease"
        ctl.proc.send_signal(signal.SIGTERM)  # a clean stop
        ctl.proc.wait(30)
        ttl = json.loads(_etcdctl(etcd_server.endpoint, "lease", "timetolive", f"{lease:x}",
                                  "-w", "json"))["ttl"]  # fmt: skip
        # Still there for a successor, and gone within the mirror's lease.
        assert 0 < ttl <= members_ttl_s(2.0), ttl
    finally:
        if server is not None:
            await server.stop(None)
        ctl.kill()
        await store.close()
