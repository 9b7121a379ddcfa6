"""The faults of `galaxy chaos`: each one acts on a running control plane
(by PID only) while the load runs, and says when the fault was noticed,
whether the dead part was replaced, and what the checks found.

A fault is ``async def fault(run: Run) -> Found``; it starts at ``--at-s``
and must return within the run (bounded waits only).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import signal
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from controlplane.controller.leader import DEFAULT_PREFIX, DEFAULT_TTL_S
from controlplane.launch.etcd import LocalEtcd
from controlplane.launch.restart import RestartPolicy
from controlplane.launch.supervise import supervise
from controlplane.launch.up import Supervisor, UpConfig, is_controller
from controlplane.runtime import spec as specs
from controlplane.runtime.errors import GalaxyError
from controlplane.runtime.membership import MembershipView
from controlplane.sdk.client import GalaxyClient
from controlplane.tools.chaos_checks import (
    agent_pool,
    busiest_agent,
    cluster_check,
    ghost_ids,
    pending_writes,
    scale_actions,
)
from statestore import EventType, StoreError, open_store

ECHO = Path(__file__).resolve().parents[2] / "examples" / "echo.yaml"
#: Kill -9 of one process of a kind (the supervisor restarts it).
KILL_KINDS = ("dispatch", "schedule", "clustermgr", "agent", "controller")
#: Seconds between two looks at the cluster while waiting for a change.
POLL_S = 0.05
#: Node agents' heartbeat interval (ClusterMgr's default, --heartbeat-ms).
HEARTBEAT_S = 1.0
#: Beyond a bound by design, the time to observe an event: a status poll
#: (POLL_S) and its round trip on a loaded machine.
DETECT_SLACK_S = 0.15
#: etcd revokes expired leases in a sweep every 500 ms (its lessor's loop).
LEASE_SWEEP_S = 0.5
#: A follower's campaign once the dead leader's key is gone: the watch
#: event reaching it, then two etcd writes (grant a lease, compare-and-swap
#: the key), each a raft commit with an fsync. Measured 0.006-0.012 s at a
#: load average of 42 (docs/reliability.md, "Leader takeover: its bound");
#: 0.25 s leaves room for two slow fsyncs on a loaded disk.
CAMPAIGN_S = 0.25
#: The takeover's bound from the kill, by design: the victim's lease lasts
#: the TTL after its last keepalive (sent before the kill), etcd's sweep
#: removes it within LEASE_SWEEP_S, a follower campaigns (CAMPAIGN_S), and
#: the run sees the new term within a poll and its round trip.
TAKEOVER_BOUND_S = DEFAULT_TTL_S + LEASE_SWEEP_S + CAMPAIGN_S + DETECT_SLACK_S
#: After a node agent's restart is seen: the time for its registration (a
#: heartbeat) and ClusterMgr's word to Dispatch, with a poll's slack.
AGREE_WITHIN_S = 2 * HEARTBEAT_S


@dataclass
class Run:
    """The control plane of one chaos run, as the faults see it. A fault
    may replace ``sup`` (restart); the run stops whatever is current."""

    cfg: UpConfig
    sup: Supervisor
    client: GalaxyClient
    etcd: LocalEtcd | None
    outage_s: float
    stop: asyncio.Event = field(default_factory=asyncio.Event)
    watcher: asyncio.Task[str | None] | None = None
    #: When the fault happened (loop time), set by the fault.
    fault_at: float = 0.0
    #: agent: when the restarted agent's registration was first seen (loop time).
    registered_at: float = 0.0
    #: delete-many: instances of its function, and the node agents' orphan check period.
    instances: int = 5000
    orphan_check_s: float = 10.0

    def supervise(self) -> None:
        """Restart dead children of ``sup`` from now on."""
        self.stop = asyncio.Event()
        self.watcher = asyncio.create_task(supervise(self.sup, self.stop, RestartPolicy()))

    async def unsupervise(self) -> None:
        """Stop restarting children (before stopping them on purpose)."""
        self.stop.set()
        if self.watcher is not None:
            with contextlib.suppress(Exception):
                await self.watcher
        self.watcher = None


@dataclass
class Found:
    """What a fault observed."""

    victim: str = ""
    #: Seconds from the fault until the system noticed it (None: not measured).
    detect_s: float | None = None
    #: The dead part is running again (None: nothing died).
    replaced: bool | None = None
    extra: dict[str, Any] = field(default_factory=dict)
    #: The fault's own goal (beyond no failed request), and whether it is met.
    goal: str = ""
    goal_met: bool = True


def _now() -> float:
    return asyncio.get_running_loop().time()


async def _until(pred: Callable[[], Awaitable[bool]], within_s: float) -> float | None:
    """Seconds until pred() holds, polling; None if not within within_s."""
    t0 = _now()
    while _now() - t0 < within_s:
        with contextlib.suppress(GalaxyError, StoreError):
            if await pred():
                return _now() - t0
        await asyncio.sleep(POLL_S)  # another process's state: look again shortly
    return None


def _child(sup: Supervisor, name: str) -> Any:
    return next((c for c in sup.children if c.name == name and c.proc.returncode is None), None)


async def _replaced(run: Run, name: str, old_pid: int, within_s: float = 20.0) -> bool:
    return await _replaced_after(run, name, old_pid, within_s) is not None


async def _replaced_after(
    run: Run, name: str, old_pid: int, within_s: float = 20.0
) -> float | None:
    """Seconds from the fault until a new process of name was up (ready);
    None if not within within_s."""

    async def new_pid() -> bool:
        c = _child(run.sup, name)
        return c is not None and c.proc.pid != old_pid and bool(c.ready)

    if await _until(new_pid, within_s) is None:
        return None
    return _now() - run.fault_at


async def kill(run: Run, kind: str) -> Found:
    """kill -9 one process of kind; detected when the supervisor sees it exit."""
    prefix = {"agent": "agent-", "controller": "controller"}.get(kind, f"{kind}-")
    alive = [c for c in run.sup.children if c.name.startswith(prefix) and c.proc.returncode is None]
    child = alive[0] if alive else None
    lives: dict[str, int] = {}  # the victim's nodes -> their agent's incarnation
    if kind == "agent" and alive:
        # The agent that hosts the measured functions' instances: killing an
        # idle one would show nothing.
        st = await run.client.status()
        agents = {c.name: c.ready.get("nodes", []) for c in alive}
        name = busiest_agent(agents, (i.instance.node_id for i in st.instances))
        child = next((c for c in alive if c.name == name), child)
        if child is not None:
            mine = set(agents[child.name])
            lives = {n.status.node_id: n.status.incarnation for n in st.nodes}
            lives = {k: v for k, v in lives.items() if k in mine}
    if child is None:
        raise RuntimeError(f"no running {kind} process to kill")
    run.fault_at = _now()
    os.kill(child.proc.pid, signal.SIGKILL)

    async def exited() -> bool:
        return child.proc.returncode is not None

    detect = await _until(exited, 10.0)
    back_s = await _replaced_after(run, child.name, child.proc.pid)
    # Up again = restarted and ready (serving); registered with the
    # controller and repartitioned follows within a push.
    extra: dict[str, Any] = {} if back_s is None else {"replaced_s": round(back_s, 3)}
    if kind != "agent":
        return Found(child.name, detect, back_s is not None, extra)

    # A restarted agent runs none of its old instances: Dispatch must stop
    # routing to them at its registration, not when its node would be
    # declared dead (which a quick restart never lets happen). Compared by
    # id (``ghost_ids``), not by the heartbeats' counts.
    pool = agent_pool(run.sup)

    async def views_agree() -> bool:
        # Only once the new agent registered: until then ClusterMgr still
        # shows the old agent's incarnation.
        st = await run.client.status()
        new = all(
            n.status.incarnation != lives[n.status.node_id]
            for n in st.nodes
            if n.status.node_id in lives
        )
        if new and not run.registered_at:
            run.registered_at = _now()
        return new and not await ghost_ids(run.client, run.sup, pool)

    try:
        agree = await _until(views_agree, AGREE_WITHIN_S)
        check = await cluster_check(run.client)
        ghosts = await ghost_ids(run.client, run.sup, pool)
    finally:
        await pool.close()
    extra.update(check)
    extra.update(ghost_instances=len(ghosts), ghost_ids=ghosts[:5])
    extra["views_agree_s"] = None if agree is None else round(agree, 2)
    return Found(
        child.name, detect, back_s is not None, extra,
        goal=f"Dispatch routes no instance the agents do not run within {AGREE_WITHIN_S:.0f} s "
        "of the restart; no duplicate instance",
        goal_met=agree is not None and check["duplicate_instances"] == 0,
    )  # fmt: skip


async def controller_leader(run: Run) -> Found:
    """kill -9 the leading controller (--ha); detected when another leads
    (read from etcd's leader key). Goal: takeover within the lease TTL.
    A watch on the key times its two parts: the victim's lease expiring
    (the key deleted) and a follower winning it (the key written again)."""
    assert run.etcd is not None
    store = open_store(run.etcd.url)
    key = DEFAULT_PREFIX + "leader"
    seen: dict[EventType, float] = {}  # the first DELETE and the first PUT after it

    async def watch(events: Any) -> None:
        async for ev in events:
            if ev.key == key and (ev.type is EventType.DELETE or EventType.DELETE in seen):
                seen.setdefault(ev.type, _now())
            if EventType.PUT in seen:
                return

    try:
        kv = await store.get(key)
        leader = json.loads(kv.value)["id"] if kv else ""
        term = kv.version if kv else 0
        child = _child(run.sup, leader)
        if child is None or not is_controller(leader):
            raise RuntimeError(f"no running leading controller (leader key: {leader!r})")
        async with store.watch_prefix(key) as events:
            watcher = asyncio.create_task(watch(events))
            try:
                run.fault_at = _now()
                os.kill(child.proc.pid, signal.SIGKILL)

                async def other_leads() -> bool:
                    # A new term (the key won again, maybe by the restarted victim).
                    kv = await store.get(key)
                    return kv is not None and kv.version != term

                took = await _until(other_leads, DEFAULT_TTL_S * 5)
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(asyncio.shield(watcher), 1.0)  # its events are in
            finally:
                watcher.cancel()
                with contextlib.suppress(asyncio.CancelledError, StoreError):
                    await watcher
        kv = await store.get(key)
        new_leader = json.loads(kv.value)["id"] if kv else ""
    finally:
        await store.close()
    back = await _replaced(run, child.name, child.proc.pid)
    acts = await scale_actions(run.etcd.url)
    expired = seen.get(EventType.DELETE)
    won = seen.get(EventType.PUT)
    return Found(
        child.name, took, back,
        {"lease_ttl_s": DEFAULT_TTL_S, "takeover_bound_s": TAKEOVER_BOUND_S,
         # The victim's lease gone (its key deleted), from the kill; then a
         # follower's campaign until it holds the key (from the deletion).
         "lease_expired_s": None if expired is None else round(expired - run.fault_at, 3),
         "campaign_s": None if expired is None or won is None else round(won - expired, 3),
         "new_leader": new_leader, **acts},
        goal=f"takeover within the lease TTL ({DEFAULT_TTL_S:.0f} s); no scale action "
        "applied twice",
        goal_met=took is not None and took <= DEFAULT_TTL_S
        and acts["scale_actions_applied_twice"] == 0
        and acts["scale_actions_after_a_newer_term"] == 0,
    )  # fmt: skip


async def sigstop_nodeagent(run: Run) -> Found:
    """SIGSTOP a node agent for ``outage_s`` (past the dead-node timeout),
    then SIGCONT; detected when ClusterMgr declares its node dead. Goal:
    within 3 heartbeats; on resume no duplicate instance, no leak."""
    child = next((c for c in run.sup.children if c.name.startswith("agent-")), None)
    if child is None:
        raise RuntimeError("no node agent to stop")
    nodes = set(child.ready.get("nodes", []))

    #: The stopped node's silence (since its last beat) when first seen dead.
    silence: list[float] = []

    async def node_alive(alive: bool) -> bool:
        st = await run.client.status()
        found = [n for n in st.nodes if n.status.node_id in nodes and n.alive == alive]
        if found and not alive:
            silence.append(max(n.last_seen_ms for n in found) / 1000.0)
        return bool(found)

    run.fault_at = _now()
    os.kill(child.proc.pid, signal.SIGSTOP)
    try:

        async def dead() -> bool:
            return await node_alive(False)

        detect = await _until(dead, run.outage_s)
        await asyncio.sleep(max(0.0, run.fault_at + run.outage_s - _now()))  # the outage
    finally:
        os.kill(child.proc.pid, signal.SIGCONT)
    resumed = _now()

    async def alive() -> bool:
        return await node_alive(True)

    back_s = await _until(alive, 15.0)
    check = await cluster_check(run.client)
    # The goal counts from the stop. ClusterMgr declares a node dead at its
    # last heartbeat + 3 heartbeats (a timer on that deadline); the last
    # heartbeat came before the stop, so detection from the stop is at most
    # 3 heartbeats, plus the time to see it (a status poll every POLL_S).
    limit = 3 * HEARTBEAT_S + DETECT_SLACK_S
    return Found(
        child.name, detect, back_s is not None,
        {"stopped_s": round(resumed - run.fault_at, 2), "detect_bound_s": limit,
         # Silence since the last beat when first seen dead: 3 heartbeats
         # plus the lag of declaring and of the poll that saw it.
         "silence_when_seen_dead_s": round(silence[0], 3) if silence else None,
         "alive_again_s": None if back_s is None else round(back_s, 2), **check},
        goal=f"detected within 3 heartbeats ({3 * HEARTBEAT_S:.0f} s, +{DETECT_SLACK_S:.2f} s "
        "to see it) of the stop; no duplicate or leaked instance",
        goal_met=detect is not None and detect <= limit
        and check["duplicate_instances"] == 0 and check["leaked_instances"] == 0,
    )  # fmt: skip


async def etcd_outage(run: Run) -> Found:
    """Stop (kill -9) the run's etcd for ``outage_s`` and start it again on
    the same data and port, deploying a new function every second
    meanwhile; detected at the first deploy refused. Goal: deploys refused
    with UNAVAILABLE while down, none acknowledged lost, the write-behind
    queues drained after the restart."""
    etcd = run.etcd
    assert etcd is not None and etcd.proc is not None
    base = specs.load_file(ECHO)
    acked: list[str] = []
    probes: list[tuple[float, str]] = []  # (seconds after the fault, "" or code)
    first_refused: float | None = None
    peak = 0

    async def probe(i: int) -> None:
        nonlocal first_refused
        spec = type(base)()
        spec.CopyFrom(base)
        spec.name = f"chaos-probe-{i}"
        t = _now() - run.fault_at
        try:
            await asyncio.wait_for(run.client.deploy(spec), 5.0)
        except GalaxyError as e:
            probes.append((t, e.code.name))
            if first_refused is None:
                first_refused = t
            return
        except TimeoutError:
            probes.append((t, "HUNG"))
            return
        probes.append((t, ""))
        acked.append(spec.name)

    # A function first called while etcd is down: its cold start writes
    # instance records, which wait in the write-behind queues.
    cold = type(base)()
    cold.CopyFrom(base)
    cold.name = "chaos-cold"
    await run.client.deploy(cold)
    acked.append(cold.name)
    run.fault_at = _now()
    pid = etcd.proc.pid
    os.kill(pid, signal.SIGKILL)
    await etcd.proc.wait()
    cold_code = ""
    try:
        await asyncio.wait_for(run.client.invoke(cold.name, b"cold"), 10.0)
    except GalaxyError as e:
        cold_code = e.code.name
    except TimeoutError:
        cold_code = "HUNG"
    i = 0
    while _now() - run.fault_at < run.outage_s:
        await probe(i)
        peak = max(peak, await pending_writes(run.sup))
        i += 1
        await asyncio.sleep(max(0.0, run.fault_at + i - _now()))  # one deploy a second
    await etcd.start()
    restarted = _now() - run.fault_at
    # Deploys again: recovered at the first one acknowledged after the restart.
    while True:
        await probe(i)
        i += 1
        if probes[-1][1] == "" or _now() - run.fault_at > restarted + 20:
            break
        await asyncio.sleep(0.2)  # the controller's etcd client reconnects in its time

    async def drained() -> bool:
        return await pending_writes(run.sup) == 0

    drained_s = await _until(drained, 20.0)
    during = [code for t, code in probes if t < run.outage_s]
    deploys_back = probes[-1][0] - restarted if probes[-1][1] == "" else None
    present = {f.name for f in await run.client.list_functions()}
    lost = [n for n in acked if n not in present]
    refused = sum(1 for code in during if code == "UNAVAILABLE")
    return Found(
        "etcd", first_refused, etcd.running,
        {"outage_s": round(restarted, 2), "deploys_during_outage": len(during),
         "deploys_refused_unavailable": refused,
         "deploys_during_outage_other": sorted({c for c in during if c != "UNAVAILABLE"}),
         "deploys_back_after_s": None if deploys_back is None else round(deploys_back, 2),
         "acknowledged_deploys": len(acked), "acknowledged_deploys_lost": len(lost),
         "cold_start_during_outage": cold_code or "OK", "write_behind_peak": peak,
         "write_behind_drained_after_s": None if drained_s is None else round(drained_s, 2)},
        goal="deploys refused with UNAVAILABLE while etcd is down; a cold start still works; "
        "0 acknowledged deploys lost; write-behind drained after the restart",
        goal_met=refused == len(during) and not lost and deploys_back is not None
        and drained_s is not None and not cold_code,
    )  # fmt: skip


async def _revisions(c: GalaxyClient) -> dict[str, int]:
    out = {}
    for f in await c.list_functions():
        out[f.name] = len((await c.list_revisions(f.name)).revisions)
    return out


async def restart(run: Run) -> Found:
    """Stop the whole control plane and start it again on the same etcd;
    compares the functions and revisions before and after and looks for
    leaked instances. Goal: all back, none leaked."""
    before = await _revisions(run.client)
    run.fault_at = _now()
    await run.unsupervise()
    await run.sup.stop()
    stopped = _now() - run.fault_at
    run.sup = Supervisor(run.cfg)
    ep = await run.sup.start()
    await run.sup.wait_nodes_registered()
    run.supervise()
    # A user would read endpoints.json again: the controllers moved.
    run.client.controllers = list(ep["controllers"])
    run.client.membership = MembershipView()
    down = _now() - run.fault_at
    after = await _revisions(run.client)
    check = await cluster_check(run.client)
    return Found(
        "control plane", None, True,
        {"restart_s": round(down, 2), "stop_s": round(stopped, 2),
         "revisions_before": sum(before.values()), "revisions_after": sum(after.values()),
         **check},
        goal="every function and revision back; no leaked instance",
        goal_met=before == after and check["leaked_instances"] == 0,
    )  # fmt: skip


def fault(kind: str) -> Callable[[Run], Awaitable[Found]]:
    """The fault named kind."""
    special: dict[str, Callable[[Run], Awaitable[Found]]] = {
        "controller-leader": controller_leader,
        "sigstop-nodeagent": sigstop_nodeagent,
        "etcd": etcd_outage,
        "restart": restart,
    }
    if kind in special:
        return special[kind]
    if kind in KILL_KINDS:

        async def run_kill(run: Run) -> Found:
            return await kill(run, kind)

        return run_kill
    raise ValueError(f"unknown fault {kind}")


FAULTS = (*KILL_KINDS, *("controller-leader", "sigstop-nodeagent", "etcd", "restart"), "none")
#: Faults that need etcd (the run starts its own), and those that need --ha.
NEEDS_ETCD = ("controller-leader", "etcd", "restart")
NEEDS_HA = ("controller-leader",)
