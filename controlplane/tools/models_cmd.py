"""`galaxy models warm|status`: prefetch a function's model to N nodes
(warm-up, as Fluid's DataLoad; the nodes from ``controlplane.runtime.warmup``)
and show which nodes hold it, in which tier. `galaxy deploy` warms a spec's
``model.warm: {nodes: N}`` the same way (docs/models.md, "Warm-up")."""

from __future__ import annotations

import argparse
import asyncio
from typing import Any

import grpc

from controlplane.runtime import models, rpc, warmup
from controlplane.runtime.errors import FailedPrecondition
from controlplane.runtime.resources import Res
from controlplane.runtime.scoring import NodeInfo, Placing
from controlplane.tools.common import connect, find_tls, find_token
from controlplane.tools.output import add_output_flag, emit, print_table
from functions.schedule.service import node_info
from galaxy.v1 import common_pb2, nodeagent_pb2, nodeagent_pb2_grpc

_CONTROLLER_HELP = "controller host:port (default: $GALAXY_CONTROLLER or the running `galaxy up`)"
#: Most nodes one warm-up may name (a model is copied to each).
MAX_WARM_NODES = 1024


def add_subparser(sub: Any) -> None:
    """``galaxy models ...``."""
    p = sub.add_parser("models", help="model caches: warm a function's model, show who holds it")
    msub = p.add_subparsers(dest="models_command", required=True)
    w = msub.add_parser("warm", help="prefetch a function's model to N nodes' caches")
    w.add_argument("name", help="function name")
    w.add_argument("--nodes", type=int, default=1, help="how many nodes should hold it")
    w.add_argument(
        "--timeout-s", type=float, default=600.0, help="deadline of each node's fetch, seconds"
    )
    w.set_defaults(func=cmd_warm)
    st = msub.add_parser("status", help="which nodes hold a function's model, in which tier")
    st.add_argument("name", help="function name")
    add_output_flag(st)
    st.set_defaults(func=cmd_status)
    for sp in (w, st):
        sp.add_argument("--controller", default=None, help=_CONTROLLER_HELP)


def placing_of(fn: common_pb2.FunctionSpec) -> Placing:
    """The function's model as placement sees it; refuses one without."""
    if not fn.HasField("model"):
        raise FailedPrecondition(f"function {fn.name} names no model")
    return Placing(fn.name, models.digest(fn.model), fn.model.size_bytes)


async def _nodes(c: Any) -> list[NodeInfo]:
    status = await c.status()
    return [node_info(n.status) for n in status.nodes if n.alive]


async def _warm_one(
    n: NodeInfo, ref: common_pb2.ModelRef, args: argparse.Namespace
) -> nodeagent_pb2.WarmModelReply | str:
    req = nodeagent_pb2.WarmModelRequest(node_id=n.node_id, model=ref)
    token = find_token(args)
    meta = (("authorization", f"Bearer {token}"),) if token else None
    async with rpc.insecure_channel(n.address, find_tls(args)) as ch:
        try:
            stub = nodeagent_pb2_grpc.NodeAgentStub(ch)
            reply: nodeagent_pb2.WarmModelReply = await stub.WarmModel(
                req, timeout=args.timeout_s, metadata=meta
            )
            return reply
        except grpc.aio.AioRpcError as e:
            return f"{e.code().name}: {e.details()}"


async def warm(c: Any, fn: common_pb2.FunctionSpec, count: int, args: argparse.Namespace) -> int:
    """Warm ``fn``'s model to ``count`` nodes; one line per node. Returns
    the exit code (1 when a node's fetch failed or too few nodes fit)."""
    if not 1 <= count <= MAX_WARM_NODES:
        raise FailedPrecondition(f"nodes: 1 to {MAX_WARM_NODES}")
    want = placing_of(fn)
    p = warmup.plan(await _nodes(c), want, count, Res.from_proto(fn.resources))
    for n in p.holding:
        print(f"{n.node_id}: holds {fn.name}'s model already ({n.models[want.model][0]})")  # type: ignore[index]
    replies = await asyncio.gather(*(_warm_one(n, fn.model, args) for n in p.fetch))
    failed = 0
    for n, r in zip(p.fetch, replies, strict=True):
        if isinstance(r, str):
            failed += 1
            print(f"{n.node_id}: not warmed: {r}")
        else:
            how = "fetched" if r.fetched else "held already"
            print(f"{n.node_id}: {how}, in the {r.tier} tier ({r.seconds:.2f} s)")
    got = len(p.holding) + len(p.fetch) - failed
    if got < count:
        print(f"{fn.name}'s model is on {got} of the {count} nodes asked for")
        return 1
    return 0


async def cmd_warm(args: argparse.Namespace) -> int:
    """``galaxy models warm NAME --nodes N``."""
    async with connect(args) as c:
        fn = await c.get_function(args.name)
        return await warm(c, fn, args.nodes, args)


async def cmd_status(args: argparse.Namespace) -> int:
    """Nodes that hold (or are fetching) a function's model."""
    async with connect(args) as c:
        fn = await c.get_function(args.name)
        want = placing_of(fn)
        nodes = await _nodes(c)
    held = [
        (n.node_id, *n.models[want.model]) for n in nodes if n.models and want.model in n.models
    ]
    rows = [(nid, tier, size) for nid, tier, size in sorted(held)]
    emit(
        args.output,
        [{"node": nid, "tier": tier, "size_bytes": size} for nid, tier, size in rows],
        lambda: print_table(("NODE", "TIER", "BYTES"), rows),
    )
    return 0
