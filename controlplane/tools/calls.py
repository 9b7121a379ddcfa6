"""The commands a user runs against a running control plane: deploy,
invoke, status, functions, delete."""

from __future__ import annotations

import argparse
import sys
import time
from typing import Any

from controlplane.runtime import servingruntime
from controlplane.runtime import spec as specs
from controlplane.runtime.errors import InvalidArgument, NotFound
from controlplane.runtime.validation import short
from controlplane.tools.common import connect
from controlplane.tools.output import as_dict, emit, print_table


async def cmd_deploy(args: argparse.Namespace) -> int:
    spec = specs.load_file(args.file)
    async with connect(args) as c:
        try:
            rt = await c.get_runtime(spec.runtime)
        except NotFound:
            raise InvalidArgument(
                f"runtime: no runtime {short(spec.runtime)} is registered "
                "(see `galaxy runtimes list`)"
            ) from None
        # The controller's rules, checked here first for an earlier error;
        # the controller resolves the spec again (the runtime may change).
        servingruntime.resolve(spec, rt)
        stored = await c.deploy(spec)
        print(f"deployed {stored.name} (revision {stored.revision}, version {stored.version})")
        if stored.HasField("model") and stored.model.warm_nodes:
            from controlplane.tools.models_cmd import warm  # only for a spec that warms

            args.timeout_s = 600.0
            return await warm(c, stored, stored.model.warm_nodes, args)
    return 0


async def cmd_invoke(args: argparse.Namespace) -> int:
    data = args.data.encode() if args.data is not None else sys.stdin.buffer.read()
    async with connect(args, timeout=args.timeout) as c:
        r = await c.invoke(args.name, data, path=args.path)
    kind = "cold" if r.instance.cold_start else "warm"
    print(
        f"instance {r.instance.instance_id} at {r.instance.address} on {r.instance.node_id} "
        f"({kind}, dispatch {r.instance.wait_ms:.2f} ms)"
    )
    print(f"HTTP {r.status}: {r.text()}")
    return 0 if 200 <= r.status < 300 else 1


async def cmd_status(args: argparse.Namespace) -> int:

    async with connect(args) as c:
        st = await c.status()
    emit(args.output, as_dict(st), lambda: _print_status(st, args.max_nodes))
    return 0


def _print_status(st: Any, max_nodes: int) -> None:
    from controlplane.runtime.membership import KIND_NAMES
    from controlplane.runtime.revisions import routing_key

    print(f"control functions (epoch {st.membership.epoch}):")
    for i in st.membership.instances:
        print(f"  {KIND_NAMES.get(i.kind, '?'):<11} {i.id:<14} {i.address}")
    _print_scaling(st)
    alive = sum(1 for n in st.nodes if n.alive)
    print(f"nodes: {len(st.nodes)} ({alive} alive)")
    for n in st.nodes[:max_nodes]:
        s = n.status
        print(
            f"  {s.node_id:<12} {'alive' if n.alive else 'DEAD ':<5} schedule={n.schedule_id:<11}"
            f" cpu {s.allocated.cpu_millis}/{s.capacity.cpu_millis}m"
            f" mem {s.allocated.memory_mib}/{s.capacity.memory_mib}Mi"
            f" gpu {s.allocated.gpus}/{s.capacity.gpus} instances {s.instances}"
        )
    if len(st.nodes) > max_nodes:
        print(f"  ... {len(st.nodes) - max_nodes} more (--max-nodes)")
    print(f"functions: {len(st.functions)}")
    failing = {r.function: r for r in st.routing if r.start_failures}
    for f in st.functions:
        print(
            f"  {f.name:<16} v{f.version} concurrency={f.concurrency} "
            f"scale={f.min_scale}..{f.max_scale} cpu={f.resources.cpu_millis}m "
            f"mem={f.resources.memory_mib}Mi gpu={f.resources.gpus}"
        )
        for name in sorted(n for n in failing if n == f.name or routing_key(n) == f.name):
            print(f"    {_backoff_text(failing[name])}")
    print(f"instances: {len(st.instances)}")
    for s in st.instances:
        i = s.instance
        print(
            f"  {i.instance_id:<28} {i.function:<12} {i.node_id:<10} {i.address:<21} "
            f"in-flight {s.in_flight}/{i.concurrency}{' draining' if s.draining else ''}"
            f"{' asleep' if s.asleep else ''}"
        )
    for w in st.warnings:
        print(f"warning: {w}")


def _backoff_text(r: Any) -> str:
    """A function's start backoff (a FunctionRouting row), e.g. ``f-00001:
    backoff 4.0s: ... process exited with code 1 ... (3 failed starts in a
    row)``; ``retrying`` once the next start may go."""
    wait = f"backoff {r.backoff_ms / 1000:.1f}s" if r.backoff_ms else "retrying"
    return (
        f"{r.function}: {wait}: {r.start_error} "
        f"({r.start_failures} failed start{'s' if r.start_failures != 1 else ''} in a row)"
    )


def _print_scaling(st: Any) -> None:
    """Per control function kind: instances, load vs T, recent decisions."""
    from controlplane.runtime.membership import KIND_NAMES

    c = st.controller
    if c.id:
        role = "leader" if c.leader else f"follower of {c.leader_id or '?'} {c.leader_address}"
        mode = "on" if c.autoscale else "off"
        term = f", term {c.term}" if c.term else ""
        print(f"controller {c.id}: {role}{term}; autoscaling {mode} (actuator {c.actuator})")
    for k in st.scaling:
        extra = "".join(
            f", {n} {what}" for n, what in ((k.warming, "warming"), (k.draining, "draining")) if n
        )
        print(
            f"  {KIND_NAMES.get(k.kind, '?'):<11} instances {k.instances}/{k.desired} desired"
            f" [{k.min_instances}..{k.max_instances}]{extra}  load {k.load:.0f} {k.load_op}/s"
            f" vs T {k.capacity:.0f}/s per instance = {k.utilization:.0%}  queue {k.queue_depth}"
        )
        for d in list(k.decisions)[:3]:
            when = time.strftime("%H:%M:%S", time.localtime(d.decided_at_unix))
            took = f" in {d.duration_s:.2f}s" if d.duration_s else ""
            print(f"    {when} {d.from_instances}->{d.to_instances} {d.outcome}{took}: {d.reason}")


async def cmd_functions(args: argparse.Namespace) -> int:
    async with connect(args) as c:
        fns = await c.list_functions()
    rows = [
        (f.name, f.namespace or "-", f.runtime or "-", f.revision, f"{f.min_scale}..{f.max_scale}",
         f.concurrency, "yes" if f.public else "no")
        for f in fns
    ]  # fmt: skip
    header = ("NAME", "NAMESPACE", "RUNTIME", "REVISION", "SCALE", "CONCURRENCY", "PUBLIC")
    emit(args.output, [as_dict(f) for f in fns], lambda: print_table(header, rows))
    return 0


async def cmd_delete(args: argparse.Namespace) -> int:
    async with connect(args) as c:
        await c.delete_function(args.name)
    print(f"deleted {args.name}")
    return 0


# -- parser -----------------------------------------------------------------
