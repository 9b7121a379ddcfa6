"""The `galaxy` command line.

galaxy up                      run a control plane here (Ctrl-C stops it)
galaxy deploy -f SPEC.yaml     deploy a function
galaxy invoke NAME --data X    call it (cold-starts an instance if needed)
galaxy status                  control instances, nodes, functions, instances
galaxy functions | delete NAME
galaxy serve KIND ...          run one component (used by `up` and Kubernetes)
"""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import os
import sys
import uuid
from pathlib import Path
from typing import Any

import grpc
from google.protobuf import json_format

from controlplane import spec as specs
from controlplane.errors import GalaxyError
from controlplane.up import (
    Supervisor,
    UpConfig,
    default_run_dir,
    print_endpoints,
    read_endpoints,
)

SERVE_KINDS = ("controller", "dispatch", "schedule", "clustermgr", "nodeagent")


def _component_module(kind: str) -> Any:
    import importlib

    return importlib.import_module(
        {
            "controller": "controlplane.controller.main",
            "dispatch": "functions.dispatch.main",
            "schedule": "functions.schedule.main",
            "clustermgr": "functions.clustermgr.main",
            "nodeagent": "controlplane.nodeagent.main",
        }[kind]
    )


class CliError(Exception):
    """A user-facing error: printed without a traceback, exit code 1."""


def find_controller(args: argparse.Namespace) -> str:
    """--controller, else $GALAXY_CONTROLLER, else the running `galaxy up`."""
    if getattr(args, "controller", None):
        return str(args.controller)
    if os.environ.get("GALAXY_CONTROLLER"):
        return os.environ["GALAXY_CONTROLLER"]
    ep = read_endpoints(Path(args.run_dir))
    if ep and ep.get("controller"):
        return str(ep["controller"])
    raise CliError(
        f"no running control plane found in {args.run_dir}; start one with `galaxy up` "
        "or pass --controller HOST:PORT"
    )


# -- commands ---------------------------------------------------------------


async def cmd_up(args: argparse.Namespace) -> int:
    cfg = UpConfig(
        dispatch=args.dispatch,
        schedule=args.schedule,
        clustermgr=args.clustermgr,
        nodes=args.nodes,
        sandbox=args.sandbox,
        nodes_per_agent=args.nodes_per_agent,
        state=args.state,
        host=args.host,
        run_dir=Path(args.run_dir),
        connection_cache=not args.no_connection_cache,
        probe_cache=not args.no_probe_cache,
        node_cpu_millis=args.node_cpu_millis,
        node_memory_mib=args.node_memory_mib,
        node_gpus=args.node_gpus,
        start_delay_ms=args.start_delay_ms,
    )
    if read_endpoints(cfg.run_dir):
        raise CliError(
            f"a control plane already runs from {cfg.run_dir}; stop it (Ctrl-C) "
            "or pick another --run-dir"
        )
    sup = Supervisor(cfg)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    import signal

    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)
    try:
        endpoints = await sup.start()
        alive = await sup.wait_nodes_registered()
        print_endpoints(endpoints, alive)
        why = await sup.watch(stop)
    except RuntimeError as e:
        await sup.stop()
        raise CliError(str(e)) from None
    except BaseException:
        await sup.stop()
        raise
    print("stopping..." if why is None else f"stopping: {why}", flush=True)
    await sup.stop()
    print("stopped.", flush=True)
    return 0 if why is None else 1


async def cmd_serve(args: argparse.Namespace) -> int:
    from controlplane import host, rpc

    mod = _component_module(args.kind)
    if args.kind != "controller" and not args.controller:
        raise CliError("--controller HOST:PORT is required")
    component = mod.build(args)
    await host.serve(
        component,
        instance_id=args.id,
        listen=args.listen,
        metrics_listen=args.metrics_listen or None,
        controller=args.controller or "",
        advertise_host=args.advertise_host,
        lifeline=args.lifeline,
        pool=rpc.ChannelPool(enabled=not args.no_connection_cache),
    )
    return 0


async def cmd_deploy(args: argparse.Namespace) -> int:
    from controlplane.client import GalaxyClient

    spec = specs.load_file(args.file)
    async with GalaxyClient(find_controller(args)) as c:
        stored = await c.deploy(spec)
    print(f"deployed {stored.name} (version {stored.version})")
    return 0


async def cmd_invoke(args: argparse.Namespace) -> int:
    from controlplane.client import GalaxyClient

    data = args.data.encode() if args.data is not None else sys.stdin.buffer.read()
    async with GalaxyClient(find_controller(args), timeout=args.timeout) as c:
        r = await c.invoke(args.name, data, path=args.path)
    kind = "cold" if r.instance.cold_start else "warm"
    print(
        f"instance {r.instance.instance_id} at {r.instance.address} on {r.instance.node_id} "
        f"({kind}, dispatch {r.instance.wait_ms:.2f} ms)"
    )
    print(f"HTTP {r.status}: {r.text()}")
    return 0 if 200 <= r.status < 300 else 1


async def cmd_status(args: argparse.Namespace) -> int:
    from controlplane.client import GalaxyClient
    from controlplane.membership import KIND_NAMES

    async with GalaxyClient(find_controller(args)) as c:
        st = await c.status()
    if args.json:
        print(json_format.MessageToJson(st, preserving_proto_field_name=True))
        return 0
    print(f"control functions (epoch {st.membership.epoch}):")
    for i in st.membership.instances:
        print(f"  {KIND_NAMES.get(i.kind, '?'):<11} {i.id:<14} {i.address}")
    alive = sum(1 for n in st.nodes if n.alive)
    print(f"nodes: {len(st.nodes)} ({alive} alive)")
    for n in st.nodes[: args.max_nodes]:
        s = n.status
        print(
            f"  {s.node_id:<12} {'alive' if n.alive else 'DEAD ':<5} schedule={n.schedule_id:<11}"
            f" cpu {s.allocated.cpu_millis}/{s.capacity.cpu_millis}m"
            f" mem {s.allocated.memory_mib}/{s.capacity.memory_mib}Mi"
            f" gpu {s.allocated.gpus}/{s.capacity.gpus} instances {s.instances}"
        )
    if len(st.nodes) > args.max_nodes:
        print(f"  ... {len(st.nodes) - args.max_nodes} more (--max-nodes)")
    print(f"functions: {len(st.functions)}")
    for f in st.functions:
        print(
            f"  {f.name:<16} v{f.version} concurrency={f.concurrency} "
            f"scale={f.min_scale}..{f.max_scale} cpu={f.resources.cpu_millis}m "
            f"mem={f.resources.memory_mib}Mi gpu={f.resources.gpus}"
        )
    print(f"instances: {len(st.instances)}")
    for s in st.instances:
        i = s.instance
        print(
            f"  {i.instance_id:<28} {i.function:<12} {i.node_id:<10} {i.address:<21} "
            f"in-flight {s.in_flight}/{i.concurrency}{' draining' if s.draining else ''}"
        )
    for w in st.warnings:
        print(f"warning: {w}")
    return 0


async def cmd_functions(args: argparse.Namespace) -> int:
    from controlplane.client import GalaxyClient

    async with GalaxyClient(find_controller(args)) as c:
        fns = await c.list_functions()
    for f in fns:
        print(json.dumps(json_format.MessageToDict(f, preserving_proto_field_name=True)))
    return 0


async def cmd_delete(args: argparse.Namespace) -> int:
    from controlplane.client import GalaxyClient

    async with GalaxyClient(find_controller(args)) as c:
        await c.delete_function(args.name)
    print(f"deleted {args.name}")
    return 0


# -- parser -----------------------------------------------------------------


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="galaxy", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument(
        "--run-dir",
        default=str(default_run_dir()),
        help="where `galaxy up` keeps endpoints.json and logs "
        "(default $GALAXY_RUN_DIR or ~/.galaxy/run)",
    )
    p.add_argument("--log-level", default=os.environ.get("GALAXY_LOG_LEVEL", "INFO"))
    sub = p.add_subparsers(dest="command", required=True)

    up = sub.add_parser("up", help="run a control plane on this machine until Ctrl-C")
    up.add_argument("--nodes", type=int, default=4, help="worker nodes (default 4)")
    up.add_argument(
        "--sandbox",
        choices=["process", "emulated"],
        default="process",
        help="process: real subprocesses (default); emulated: no process",
    )
    up.add_argument(
        "--nodes-per-agent",
        type=int,
        default=0,
        help="nodes hosted by one node agent process (default: 1 for "
        "process sandboxes, 105 for emulated)",
    )
    up.add_argument("--dispatch", type=int, default=1, help="Dispatch instances")
    up.add_argument("--schedule", type=int, default=1, help="Schedule instances")
    up.add_argument("--clustermgr", type=int, default=1, help="ClusterMgr instances")
    up.add_argument(
        "--state", default="memory://", help="memory:// (default) or etcd://host:port[,host:port]"
    )
    up.add_argument("--host", default="127.0.0.1", help="address every component listens on")
    up.add_argument(
        "--no-connection-cache", action="store_true", help="ablation: a new gRPC channel per call"
    )
    up.add_argument(
        "--no-probe-cache", action="store_true", help="ablation: Schedule probes on every placement"
    )
    up.add_argument("--node-cpu-millis", type=int, default=4000)
    up.add_argument("--node-memory-mib", type=int, default=8192)
    up.add_argument("--node-gpus", type=int, default=0)
    up.add_argument(
        "--start-delay-ms", type=int, default=0, help="modelled cold start of emulated sandboxes"
    )
    up.set_defaults(func=cmd_up)

    serve = sub.add_parser("serve", help="run one component in the foreground")
    ssub = serve.add_subparsers(dest="kind", required=True)
    for kind in SERVE_KINDS:
        sp = ssub.add_parser(kind, help=f"run a {kind}")
        sp.add_argument(
            "--id",
            default=f"{kind}-{uuid.uuid4().hex[:6]}",
            help="instance id (stable across restarts is best)",
        )
        sp.add_argument("--listen", default="127.0.0.1:0", help="gRPC host:port (0 = any)")
        sp.add_argument(
            "--metrics-listen", default="127.0.0.1:0", help="Prometheus host:port ('' = off)"
        )
        sp.add_argument(
            "--advertise-host",
            default=None,
            help="host others use to reach this process (default: listen host)",
        )
        sp.add_argument(
            "--controller", default=os.environ.get("GALAXY_CONTROLLER"), help="controller host:port"
        )
        sp.add_argument(
            "--lifeline", action="store_true", help="exit when stdin closes (used by `galaxy up`)"
        )
        sp.add_argument(
            "--no-connection-cache",
            action="store_true",
            help="ablation: a new gRPC channel per call",
        )
        _component_module(kind).add_arguments(sp)
        sp.set_defaults(func=cmd_serve)

    for name, helptext, func in (
        ("deploy", "deploy a function from a YAML spec", cmd_deploy),
        ("invoke", "call a function", cmd_invoke),
        ("status", "show the control plane", cmd_status),
        ("functions", "list functions (JSON lines)", cmd_functions),
        ("delete", "delete a function and its instances", cmd_delete),
    ):
        sp = sub.add_parser(name, help=helptext)
        sp.add_argument(
            "--controller",
            default=None,
            help="controller host:port (default: $GALAXY_CONTROLLER or the running `galaxy up`)",
        )
        sp.set_defaults(func=func)
        if name == "deploy":
            sp.add_argument("-f", "--file", required=True, help="function spec (YAML)")
        if name in ("invoke", "delete"):
            sp.add_argument("name", help="function name")
        if name == "invoke":
            sp.add_argument("--data", default=None, help="request body (default: stdin)")
            sp.add_argument("--path", default="/", help="HTTP path on the instance")
            sp.add_argument("--timeout", type=float, default=60.0, help="seconds")
        if name == "status":
            sp.add_argument("--json", action="store_true")
            sp.add_argument("--max-nodes", type=int, default=20)
    return p


def main(argv: list[str] | None = None) -> int:
    """Entry point of the `galaxy` command."""
    args = build_parser().parse_args(argv)
    logging.basicConfig(
        level=args.log_level.upper(), format="%(asctime)s %(levelname)s %(name)s: %(message)s"
    )
    from controlplane.host import install_uvloop

    install_uvloop()
    try:
        return asyncio.run(args.func(args))
    except CliError as e:
        print(f"galaxy: {e}", file=sys.stderr)
        return 1
    except GalaxyError as e:
        print(f"galaxy: {e.code.name}: {e.message}", file=sys.stderr)
        return 1
    except grpc.aio.AioRpcError as e:
        print(f"galaxy: {e.code().name}: {e.details()}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":
    sys.exit(main())
