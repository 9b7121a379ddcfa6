"""High availability: several controllers, one leader elected with an etcd
lease. Real etcd (the session fixture), real controller processes, and the
Kubernetes actuator against the recorded-contract fake API server as the
shared, external thing both controllers scale."""

from __future__ import annotations

import asyncio
import contextlib
import json
import signal
import subprocess
import sys
import time
import uuid

import grpc
import pytest

pytest.importorskip("kubernetes_asyncio")

from controlplane.controller.leader import (
    Fenced,
    LeaderElector,
    LeaderInfo,
    ScaleLedger,
)
from controlplane.runtime.host import READY_PREFIX
from galaxy.v1 import (
    common_pb2,
    controller_pb2,
    controller_pb2_grpc,
    schedule_pb2_grpc,
)
from statestore import EventType, open_store
from tests.controller.conftest import ScheduleStandIn, serve
from tests.controller.fake_k8s_api import FakeKubernetesAPI
from tests.integration.upctl import REPO

S = common_pb2.CONTROL_KIND_SCHEDULE
TTL_S = 2.0
pytestmark = [pytest.mark.etcd, pytest.mark.timeout(90)]


@pytest.mark.slow
async def test_a_paused_leader_is_fenced_off_and_applies_nothing(etcd_server):
    prefix = f"/t-{uuid.uuid4().hex[:8]}/controller/"
    s1, s2 = open_store(etcd_server.url), open_store(etcd_server.url)
    e1 = LeaderElector(s1, LeaderInfo("c1", "h:1"), prefix=prefix, ttl_s=TTL_S)
    e2 = LeaderElector(s2, LeaderInfo("c2", "h:2"), prefix=prefix, ttl_s=TTL_S)
    try:
        e1.start()
        await asyncio.wait_for(e1.elected.wait(), 10)
        e2.start()
        l1 = ScaleLedger(s1, prefix)
        await l1.adopt(e1.term, "c1")
        await l1.commit(
            "schedule", 2, code="overload", reason="test", leader_id="c1", action=f"{e1.term}-1"
        )
        assert await l1.still_mine("schedule")
        # c1 "pauses": its keepalive stops, its lease expires, c2 takes over.
        t0 = time.monotonic()
        await e1.stop(resign=False)
        await asyncio.wait_for(e2.elected.wait(), TTL_S + 5)
        took = time.monotonic() - t0
        assert took <= TTL_S + 1.5, took
        assert e2.term > e1.term
        l2 = ScaleLedger(s2, prefix)
        assert await l2.adopt(e2.term, "c2") == {"schedule": 2}
        assert l2.adopted == {"schedule": f"{e1.term}-1"}  # c2 never applies it again
        # c1, about to apply what it committed, finds the target taken over.
        assert not await l1.still_mine("schedule") and await l2.still_mine("schedule")
        # c1 wakes up and tries to act on what it decided before: fenced.
        with pytest.raises(Fenced):
            await l1.commit("schedule", 3, code="overload", reason="stale", leader_id="c1")
        await l2.commit("schedule", 3, code="overload", reason="new leader", leader_id="c2")
        actions = await l2.actions()
        assert [(a["leader"], a["desired"]) for a in actions] == [("c1", 2), ("c2", 3)]
    finally:
        await e2.stop()
        await e1.stop()
        await s1.delete_prefix(prefix)
        await s1.close()
        await s2.close()


async def test_a_new_leader_prepares_before_it_counts_as_leader(etcd_server):
    prefix = f"/t-{uuid.uuid4().hex[:8]}/controller/"
    store = open_store(etcd_server.url)
    seen: list[tuple[bool, int, LeaderInfo | None]] = []
    e: LeaderElector

    async def prepare() -> None:
        # What a call arriving now would see: not the leader yet, the term known.
        seen.append((e.is_leader, e.term, e.leader))
        await asyncio.sleep(0.2)  # a slow load of the predecessor's state
        seen.append((e.is_leader, e.term, e.leader))

    e = LeaderElector(store, LeaderInfo("c1", "h:1"), prefix=prefix, ttl_s=TTL_S, prepare=prepare)
    try:
        e.start()
        await asyncio.wait_for(e.elected.wait(), 10)
        assert e.is_leader and e.term > 0
        assert seen == [(False, e.term, None), (False, e.term, None)]
        assert e.leader == LeaderInfo("c1", "h:1", e.term)
    finally:
        await e.stop()
        await store.delete_prefix(prefix)
        await store.close()


async def test_a_deposed_leaders_late_first_commit_does_not_fence_the_new_one(etcd_server):
    prefix = f"/t-{uuid.uuid4().hex[:8]}/controller/"
    s1, s2 = open_store(etcd_server.url), open_store(etcd_server.url)
    try:
        old, new = ScaleLedger(s1, prefix), ScaleLedger(s2, prefix)
        await old.adopt(5, "c1")
        await new.adopt(9, "c2")  # no key yet: nothing rewritten
        # The deposed leader, paused mid-tick, writes the kind's first target.
        await old.commit("dispatch", 3, code="overload", reason="late", leader_id="c1")
        # The new leader's commit overwrites the older term's record...
        await new.commit("dispatch", 4, code="overload", reason="new", leader_id="c2")
        assert not await old.still_mine("dispatch") and await new.still_mine("dispatch")
        # ...and fences the old one off, not the other way round.
        with pytest.raises(Fenced):
            await old.commit("dispatch", 5, code="overload", reason="stale", leader_id="c1")
        await new.commit("dispatch", 5, code="overload", reason="again", leader_id="c2")
    finally:
        await s1.delete_prefix(prefix)
        await s1.close()
        await s2.close()


class ControllerProc:
    def __init__(self, cid: str, log_dir, *flags: str) -> None:
        self.id = cid
        self.log = log_dir / f"{cid}.log"
        with open(self.log, "wb") as err:
            self.proc = subprocess.Popen(
                [
                    sys.executable,
                    "-m",
                    "controlplane.tools.cli",
                    "serve",
                    "controller",
                    "--id",
                    cid,
                    "--insecure",  # plaintext: this test is about leadership, not TLS
                    *flags,
                ],
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                stderr=err,
                cwd=REPO,
            )
        self.address = ""

    async def ready(self) -> str:
        assert self.proc.stdout is not None
        while True:
            line = await asyncio.to_thread(self.proc.stdout.readline)
            if not line:
                raise AssertionError(f"controller {self.id} exited early")
            text = line.decode().strip()
            if text.startswith(READY_PREFIX):
                self.address = json.loads(text[len(READY_PREFIX) :])["address"]
                return self.address

    def kill(self) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGKILL)
        self.proc.wait(10)


async def leader_events(store, key: str, out: list[tuple[float, str | None]]) -> None:
    async with store.watch_prefix(key) as w:
        kv = await store.get(key)
        out.append((time.monotonic(), json.loads(kv.value)["id"] if kv else None))
        async for ev in w:
            who = json.loads(ev.value)["id"] if ev.type is EventType.PUT else None
            out.append((time.monotonic(), who))


async def until(pred, within_s: float, what: str) -> None:
    end = time.monotonic() + within_s
    while not pred():
        if time.monotonic() > end:
            raise AssertionError(f"timed out waiting for {what}")
        await asyncio.sleep(0.05)  # state of other processes: look again shortly


@pytest.mark.slow
async def test_follower_takes_over_within_the_ttl_and_no_action_runs_twice(etcd_server, tmp_path):
    prefix = f"/t-{uuid.uuid4().hex[:8]}/controller/"
    api = FakeKubernetesAPI()
    api.add_deployment("galaxy", "galaxy-schedule", 1)
    url = await api.start()
    flags = [
        "--state", etcd_server.url, "--ha", "--ha-prefix", prefix, "--ha-ttl-s", str(TTL_S),
        "--autoscale-control", "--actuator", "kubernetes", "--k8s-api", url,
        "--k8s-namespace", "galaxy", "--t-sf", "100", "--max-step-out", "1",
        "--scale-out-cooldown-s", "1", "--scale-in-cooldown-s", "600",
        "--scale-tick-s", "0.2", "--member-timeout-s", "60", "--metrics-listen", "",
        "--lifeline",
    ]  # fmt: skip
    store = open_store(etcd_server.url)
    events: list[tuple[float, str | None]] = []
    watcher = asyncio.create_task(leader_events(store, prefix + "leader", events))
    a = ControllerProc("ctl-a", tmp_path, *flags)
    b: ControllerProc | None = None
    servers: dict[str, tuple] = {}
    loads: dict[str, float] = {}
    channel = None
    tasks: set[asyncio.Task] = set()
    try:
        await a.ready()
        await until(lambda: events and events[-1][1] == "ctl-a", 20, "ctl-a to lead")
        b = ControllerProc("ctl-b", tmp_path, *flags)
        await b.ready()
        # Everything below talks to the follower: it forwards to the leader.
        channel = grpc.aio.insecure_channel(b.address)
        ctl = controller_pb2_grpc.ControllerStub(channel)

        async def pod_started(name: str) -> None:
            server, addr = await serve(
                schedule_pb2_grpc.add_ScheduleServicer_to_server,
                ScheduleStandIn(name),
                "galaxy.v1.Schedule",
            )
            servers[name] = (server, addr)
            me = common_pb2.ControlInstance(id=name, kind=S, address=addr)
            await ctl.RegisterInstance(me, timeout=5)

        def on_pods(dep, names):  # the fake "kubelet" starts the new pods
            for n in names:
                if n not in loads:
                    loads[n] = 0.0
                    tasks.add(asyncio.ensure_future(pod_started(n)))

        async def report_forever():
            while True:
                for name, (_, addr) in list(servers.items()):
                    me = common_pb2.ControlInstance(id=name, kind=S, address=addr)
                    with contextlib.suppress(grpc.aio.AioRpcError):  # no leader for a moment
                        await ctl.ReportLoad(
                            controller_pb2.LoadReport(
                                instance=me, ops_per_second={"schedule": loads[name]}
                            ),
                            timeout=2,
                        )
                await asyncio.sleep(0.2)  # periodic, like the host's reporter

        api.on_pods = on_pods
        on_pods(None, ["galaxy-schedule-0"])
        await asyncio.gather(*tasks)
        tasks.add(asyncio.create_task(report_forever()))
        loads["galaxy-schedule-0"] = 250.0  # 250% of T: the leader scales out once
        await until(lambda: "galaxy-schedule-1" in servers, 20, "the scale-out")
        loads["galaxy-schedule-0"] = loads["galaxy-schedule-1"] = 60.0  # 60%: settled

        async def scaling():
            st = await ctl.GetClusterStatus(controller_pb2.GetClusterStatusRequest(), timeout=5)
            return st, next(k for k in st.scaling if k.kind == S)

        for _ in range(100):
            st, sk = await scaling()
            if sk.instances == 2 and sk.decisions and sk.decisions[0].outcome == "done":
                break
            await asyncio.sleep(0.1)
        assert st.controller.id == "ctl-a" and st.controller.leader
        assert [p["body"] for p in api.scale_patches()] == [{"spec": {"replicas": 2}}]

        # The leader dies.
        t_kill = time.monotonic()
        a.kill()
        await until(lambda: events[-1][1] == "ctl-b", TTL_S + 5, "ctl-b to lead")
        took = events[-1][0] - t_kill
        assert took <= TTL_S + 1.5, f"takeover took {took:.2f}s"
        # The new leader adopts the committed target (2) and does not apply it
        # again, although it has seen no scale-out of its own.
        await asyncio.sleep(2.0)  # ten ticks of the new leader under steady load
        st, sk = await scaling()
        assert st.controller.id == "ctl-b" and st.controller.leader
        assert sk.instances == 2 and sk.desired == 2, (loads, sk)
        assert len(api.scale_patches()) == 1
        ledger = ScaleLedger(store, prefix)
        assert [(x["leader"], x["desired"]) for x in await ledger.actions()] == [("ctl-a", 2)]
        # And it acts on new load by itself: one more action, not two.
        loads["galaxy-schedule-0"] = loads["galaxy-schedule-1"] = 150.0
        await until(lambda: "galaxy-schedule-2" in servers, 20, "the new leader's scale-out")
        assert [p["body"]["spec"]["replicas"] for p in api.scale_patches()] == [2, 3]
        acts = await ledger.actions()
        assert [(x["leader"], x["desired"]) for x in acts] == [("ctl-a", 2), ("ctl-b", 3)]
        assert acts[1]["term"] > acts[0]["term"]
    finally:
        for t in tasks:
            t.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        watcher.cancel()
        await asyncio.gather(watcher, return_exceptions=True)
        for p in (a, b):
            if p is not None:
                p.kill()
        if channel is not None:
            await channel.close()
        for server, _ in servers.values():
            await server.stop(None)
        await api.stop()
        await store.delete_prefix(prefix)
        await store.close()
