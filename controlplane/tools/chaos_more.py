"""Two more faults of `galaxy chaos` (issue #14's last goals), beside
chaos_faults.py's:

- ``controller-then-dispatch``: kill -9 the (single, non-HA) controller on
  etcd, wait until it is back and serving, then kill -9 one Dispatch
  instance. The membership epoch is sampled meanwhile from two sides: the
  controller's answer to GetMembership (a probe client of its own), and the
  view the load's SDK client holds. Goal (beyond no failed request): neither
  ever goes backwards, and the repartition after the Dispatch kill happens.
- ``delete-many``: deploy a function with ``min_scale`` = ``--instances``
  (5,000 by default) on the emulated sandbox, wait until the node agents
  run them all, delete it, and count its instances on the node agents
  (``ListNodeInstances`` of every node) until none is left and again at the
  end of the grace period. Goal: 0 left after the grace period.
"""

from __future__ import annotations

import asyncio
import contextlib
import math
import os
import signal
from collections.abc import Awaitable, Callable
from typing import Any

from controlplane.runtime import rpc
from controlplane.runtime import spec as specs
from controlplane.runtime.revisions import routing_key
from controlplane.sdk.client import GalaxyClient
from controlplane.tools import chaos_faults
from controlplane.tools.chaos_checks import agent_pool, epoch_check, list_node, metric_sum
from controlplane.tools.chaos_faults import ECHO, POLL_S, Found, Run, _child, _now, _until
from galaxy.v1 import common_pb2

DISPATCH = common_pb2.CONTROL_KIND_DISPATCH

#: delete-many: how often each node agent asks the owning Dispatch which
#: instances it routes (its --orphan-check-s; `galaxy chaos
#: --orphan-check-s`). An instance unknown to its owner is stopped after 2
#: checks and at least one period of life, so within GRACE_CHECKS periods:
#: the grace period the goal counts.
ORPHAN_CHECK_S = 10.0
GRACE_CHECKS = 3
#: delete-many: CPU millicores and MiB of each of its instances.
MANY_CPU_MILLIS = 1
MANY_MEMORY_MIB = 1
#: controller-then-dispatch: bound on the wait for each step.
STEP_S = 30.0


def config_for(
    fault: str, instances: int, nodes: int, orphan_check_s: float = ORPHAN_CHECK_S
) -> dict[str, Any]:
    """UpConfig fields a fault needs beyond the run's (pure): room for
    ``instances`` more on ``nodes`` nodes, the controller's limits raised
    to let one function have them, and the orphan check period."""
    if fault != "delete-many":
        return {}
    per_node = math.ceil(instances / max(1, nodes))
    return {
        # The load's functions keep their room (the defaults), plus the burst.
        "node_cpu_millis": 4000 + 2 * per_node * MANY_CPU_MILLIS,
        "node_memory_mib": 8192 + 2 * per_node * MANY_MEMORY_MIB,
        "controller_args": [
            "--max-instances-per-function", str(max(instances, 1000)),
            "--max-reserved-instances", str(max(instances, 5000)),
            # One namespace may keep them all (the default quota: half).
            "--default-quota-fraction", "1",
        ],
        "extra": {"nodeagent": ["--orphan-check-s", str(orphan_check_s)]},
    }  # fmt: skip


async def _membership_epoch(probe: GalaxyClient) -> tuple[int, list[str]]:
    """The controller's current epoch and Dispatch ids (a fresh view each time)."""
    await probe.refresh_membership(retry_s=1.0)
    return probe.membership.epoch, probe.membership.ids(DISPATCH)


async def controller_then_dispatch(run: Run) -> Found:
    """kill -9 the controller, wait until it serves again, then kill -9 a
    Dispatch instance and wait for the repartition, sampling the epochs
    all along. Detected: when the supervisor saw the controller exit."""
    ctl = _child(run.sup, "controller")
    if ctl is None:
        raise RuntimeError("no running controller (the fault needs a non-HA control plane)")
    samples: list[tuple[str, int]] = []  # (source, epoch), in the order seen
    ids_seen: list[list[str]] = []
    probe = GalaxyClient(
        run.client.controllers, timeout=2.0, tls=run.sup.client_tls(),
        token=run.sup.client_token(),
    )  # fmt: skip
    stop = asyncio.Event()

    async def sample() -> None:
        while not stop.is_set():
            samples.append(("client", run.client.membership.epoch))
            with contextlib.suppress(Exception):  # the controller is down for a while
                epoch, ids = await _membership_epoch(probe)
                samples.append(("controller", epoch))
                ids_seen.append(ids)
            await asyncio.sleep(POLL_S)  # another process's state: look again shortly

    async with probe:
        epoch0, dispatch0 = await _membership_epoch(probe)
        sampler = asyncio.create_task(sample())
        try:
            run.fault_at = _now()
            os.kill(ctl.proc.pid, signal.SIGKILL)

            async def exited() -> bool:
                return ctl.proc.returncode is not None

            detect = await _until(exited, 10.0)
            ctl_back = await chaos_faults._replaced_after(run, ctl.name, ctl.proc.pid, STEP_S)

            async def serving() -> bool:
                _, ids = await _membership_epoch(probe)
                return ids == dispatch0

            serves = await _until(serving, STEP_S)
            serves_s = None if serves is None else _now() - run.fault_at
            epoch_mid, _ = await _membership_epoch(probe)
            victim = _child(run.sup, dispatch0[0]) if dispatch0 else None
            if victim is None:
                raise RuntimeError(f"no running Dispatch process named {dispatch0[:1]}")
            killed_at = _now()
            os.kill(victim.proc.pid, signal.SIGKILL)
            d_back = await chaos_faults._replaced_after(run, victim.name, victim.proc.pid, STEP_S)

            async def repartitioned() -> bool:
                # The restarted instance registered again: a newer epoch
                # than the one at the kill, with every Dispatch id in it.
                epoch, ids = await _membership_epoch(probe)
                return epoch > epoch_mid and ids == dispatch0

            repart = await _until(repartitioned, STEP_S)
            repart_s = None if repart is None else _now() - killed_at
            # A few more samples after the repartition (the load runs on).
            await asyncio.sleep(1.0)
            epoch_end, _ = await _membership_epoch(probe)
        finally:
            stop.set()
            await sampler
    check = epoch_check(samples)
    return Found(
        f"{ctl.name}, then {victim.name}", detect, ctl_back is not None and d_back is not None,
        {"epoch_before": epoch0, "epoch_after_controller_restart": epoch_mid,
         "epoch_end": epoch_end,
         "controller_replaced_s": None if ctl_back is None else round(ctl_back, 3),
         "controller_serving_s": None if serves_s is None else round(serves_s, 3),
         "dispatch_killed_at_s": round(killed_at - run.fault_at, 3),
         "dispatch_replaced_s": None if d_back is None
         else round(d_back - (killed_at - run.fault_at), 3),
         "repartitioned_after_dispatch_kill_s": None if repart_s is None else round(repart_s, 3),
         "epoch_sources": "controller GetMembership (a probe client) and the load "
         "client's MembershipView", **check},
        goal="the controller back and serving; the repartition after the Dispatch kill; "
        "epochs never go backwards",
        goal_met=serves_s is not None and repart_s is not None
        and check["epochs_backwards"] == 0,
    )  # fmt: skip


async def _count(pool: rpc.ChannelPool, run: Run, function: str) -> int:
    """Instances of function (any revision) ready on the node agents (every
    node asked)."""
    n = 0
    for c in list(run.sup.children):
        if not c.name.startswith("agent-") or c.proc.returncode is not None:
            continue
        for node in c.ready.get("nodes", []):
            r = await list_node(pool, c.ready["address"], node)
            n += sum(1 for i in r.instances if routing_key(i.function) == function)
    return n


async def delete_many(run: Run) -> Found:
    """Deploy a function of ``run.instances`` instances (min_scale), wait
    until they all run, delete it, and count what the node agents still run
    of it until none, and at the end of the grace period."""
    n = run.instances
    grace_s = GRACE_CHECKS * run.orphan_check_s
    spec = specs.load_file(ECHO)
    spec.name, spec.min_scale, spec.max_scale = "chaos-many", n, n
    spec.resources.cpu_millis, spec.resources.memory_mib = MANY_CPU_MILLIS, MANY_MEMORY_MIB
    pool = agent_pool(run.sup)
    peak = 0
    try:
        t0 = _now()
        await run.client.deploy(spec)
        # Its first request makes its owner route it, and the autoscaler
        # then holds it at min_scale.
        await run.client.invoke(spec.name, b"x")

        async def all_running() -> bool:
            nonlocal peak
            peak = max(peak, await _count(pool, run, spec.name))
            return peak >= n

        # Bounded: a minute plus 20 ms an instance on a loaded machine.
        started = await _until(all_running, 60.0 + 0.02 * n)
        run.fault_at = _now()
        await run.client.delete_function(spec.name)
        left_at: list[tuple[float, int]] = []

        async def none_left() -> bool:
            left_at.append((_now() - run.fault_at, await _count(pool, run, spec.name)))
            return left_at[-1][1] == 0

        zero = await _until(none_left, grace_s)
        await asyncio.sleep(max(0.0, run.fault_at + grace_s - _now()))  # the grace period
        left = await _count(pool, run, spec.name)
        # Of those gone, how many the node agents' orphan checks stopped
        # (the rest Dispatch deleted).
        reaped = await metric_sum(run.sup, ("agent-",), "galaxy_orphan_instances_reaped_total")
    finally:
        await pool.close()
    return Found(
        spec.name, zero, None,
        {"instances_wanted": n, "instances_running_before_delete": peak,
         "running_after_s": None if started is None else round(started, 2),
         "deploy_to_delete_s": round(run.fault_at - t0, 2),
         "left_first_look": left_at[0][1] if left_at else None,
         # (seconds after the delete, instances left), about 10 looks.
         "left_curve": [(round(t, 1), k) for t, k in left_at[:: max(1, len(left_at) // 10)]],
         "zero_left_after_s": None if zero is None else round(zero, 3),
         "grace_s": grace_s, "left_after_grace": left, "reaped_by_orphan_checks": reaped},
        goal=f"all {n} instances running, then 0 left on the nodes "
        f"{grace_s:g} s ({GRACE_CHECKS} orphan checks) after the delete",
        goal_met=peak >= n and left == 0,
    )  # fmt: skip


MORE: dict[str, Callable[[Run], Awaitable[Found]]] = {
    "controller-then-dispatch": controller_then_dispatch,
    "delete-many": delete_many,
}
#: Every fault of `galaxy chaos`, and those that need etcd.
FAULTS = (*chaos_faults.FAULTS[:-1], *MORE, "none")
NEEDS_ETCD = (*chaos_faults.NEEDS_ETCD, "controller-then-dispatch")


def fault(kind: str) -> Callable[[Run], Awaitable[Found]]:
    """The fault named kind (chaos_faults.py's or one of these)."""
    return MORE.get(kind) or chaos_faults.fault(kind)
