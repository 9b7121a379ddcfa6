"""The `galaxy` command line.

galaxy up                      run a control plane here (Ctrl-C stops it)
galaxy runtimes apply -f FILE  register a serving runtime (what functions may run)
galaxy deploy -f SPEC.yaml     deploy a function (naming a runtime)
galaxy invoke NAME --data X    call it (cold-starts an instance if needed)
galaxy status                  control instances, nodes, functions, instances
galaxy functions | delete NAME
galaxy calibrate               measure T_DF, T_SF, T_CMF here (for control autoscaling)
galaxy certs init --dir DIR    a CA and mutual-TLS certificates (`galaxy up` makes its own)
galaxy serve KIND ...          run one component (used by `up` and Kubernetes)
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import importlib
import os
import sys
import uuid
from pathlib import Path
from typing import Any

import grpc

from controlplane.launch.endpoints import default_run_dir
from controlplane.runtime.config import ConfigError
from controlplane.runtime.errors import GalaxyError
from controlplane.tools.common import CliError, find_controller  # noqa: F401 (re-exported)

SERVE_KINDS = ("controller", "dispatch", "schedule", "clustermgr", "nodeagent", "gateway")


def _component_module(kind: str) -> Any:
    return importlib.import_module(
        {
            "controller": "controlplane.controller.main",
            "dispatch": "functions.dispatch.main",
            "schedule": "functions.schedule.main",
            "clustermgr": "functions.clustermgr.main",
            "nodeagent": "controlplane.nodeagent.main",
            "gateway": "controlplane.gateway.main",
        }[kind]
    )


# -- commands ---------------------------------------------------------------


async def cmd_up(args: argparse.Namespace) -> int:
    import signal

    from controlplane.launch.endpoints import print_endpoints, read_endpoints
    from controlplane.launch.promsd import start_prometheus
    from controlplane.launch.restart import RestartPolicy
    from controlplane.launch.supervise import supervise
    from controlplane.launch.up import Supervisor
    from controlplane.launch.upconfig import UpConfig
    from controlplane.runtime import config, netaddr, procs
    from controlplane.runtime.metrics import register_component, serve_metrics

    cfg = config.from_args(UpConfig, args, run_dir=Path(args.run_dir))
    if read_endpoints(cfg.run_dir):
        raise CliError(
            f"a control plane already runs from {cfg.run_dir}; stop it (Ctrl-C) "
            "or pick another --run-dir"
        )
    sup = Supervisor(cfg)
    prom: procs.Spawned | None = None
    # Before the children, so endpoints.json and the Prometheus targets
    # name the supervisor's own /metrics from the first write.
    register_component("supervisor")
    sup.supervisor_metrics = serve_metrics(cfg.host, sup.metrics_port("supervisor"))
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)
    print(f"starting the control plane ({cfg.nodes} nodes) from {cfg.run_dir} ...", flush=True)

    async def start() -> tuple[dict[str, Any], int]:
        endpoints = await sup.start()
        return endpoints, await sup.wait_nodes_registered()

    try:
        # Ctrl-C or SIGTERM while the processes start (tens of seconds with
        # many nodes) stops at once rather than after start-up completes.
        starting = asyncio.ensure_future(start())
        stopper = asyncio.ensure_future(stop.wait())
        await asyncio.wait([starting, stopper], return_when=asyncio.FIRST_COMPLETED)
        stopper.cancel()
        if not starting.done():
            starting.cancel()
            await asyncio.gather(starting, return_exceptions=True)
            print("stopping before start-up completed...", flush=True)
            await sup.stop()
            print("stopped.", flush=True)
            return 0
        endpoints, alive = starting.result()
        if cfg.prometheus:
            prom = await start_prometheus(
                cfg.run_dir, cfg.host, cfg.prometheus_port, cfg.run_dir / "logs"
            )
            sup.prometheus = netaddr.join_host_port(cfg.host, cfg.prometheus_port)
            sup.write_run_files()
            endpoints = sup.endpoints()
        print_endpoints(endpoints, alive)
        why = await supervise(sup, stop, RestartPolicy())
    except RuntimeError as e:
        await sup.stop()
        raise CliError(str(e)) from None
    except BaseException:
        await sup.stop()
        raise
    print("stopping..." if why is None else f"stopping: {why}", flush=True)
    if prom is not None and prom.returncode is None:
        prom.terminate()
        await prom.wait()
    await sup.stop()
    print("stopped.", flush=True)
    return 0 if why is None else 1


def _cpu_limits(values: list[str]) -> dict[str, float]:
    from controlplane.controller.actuators.cpulimit import parse_limits

    try:
        return parse_limits(values)
    except ValueError as e:
        raise CliError(str(e)) from None


async def cmd_calibrate(args: argparse.Namespace) -> int:
    from controlplane.tools.calibrate import calibrate, default_path

    out = Path(args.out) if args.out else default_path()
    print(
        f"calibrating on this machine: {args.nodes} emulated nodes, concurrency "
        f"{args.concurrency}, {args.duration_s:g}s per kind ...",
        flush=True,
    )
    data = await calibrate(
        out,
        nodes=args.nodes,
        concurrency=args.concurrency,
        warmup_s=args.warmup_s,
        duration_s=args.duration_s,
        cpu_limits=_cpu_limits(args.cpu_limit),
    )
    for kind, key, op in (
        ("dispatch", "t_df", "dispatch requests/s"),
        ("schedule", "t_sf", "schedule requests/s (SRPS)"),
        ("clustermgr", "t_cmf", "node updates/s"),
    ):
        errs = data["details"][kind]["errors"]
        print(f"  {key.upper():<6} {data[key]:>9.1f} {op}" + (f" ({errs} errors)" if errs else ""))
    print(f"written to {out}; the controller reads it (--calibration {out})")
    return 0


async def cmd_serve(args: argparse.Namespace) -> int:
    from controlplane.runtime import config, host, rpc, tlsfiles
    from controlplane.runtime.config import GcConfig, RpcConfig

    mod = _component_module(args.kind)
    if args.kind != "controller" and not args.controller:
        raise CliError("--controller HOST:PORT is required")
    try:
        # Credentials loaded; tokens without TLS refused here, in one line.
        args.rpc = rpc_config = tlsfiles.resolve(config.from_args(RpcConfig, args), args.kind)
    except ValueError as e:
        raise CliError(str(e)) from None
    if args.kind == "gateway":  # HTTP, not a gRPC component
        return int(await mod.run(args))
    try:
        component = mod.build(args)
    except ConfigError:
        raise  # its own exit code (2)
    except ValueError as e:  # a flag's value, named in the message
        raise CliError(str(e)) from None
    proc = config.from_args(host.ServeConfig, args)
    await host.serve(
        component,
        instance_id=proc.id or args.id,
        listen=proc.listen,
        metrics_listen=proc.metrics_listen or None,
        controller=proc.controller or "",
        advertise_host=proc.advertise_host,
        lifeline=proc.lifeline,
        pool=rpc.ChannelPool.of(rpc_config),
        rpc_config=rpc_config,
        gc_config=config.from_args(GcConfig, args),
        load_report_s=proc.load_report_ms / 1000.0,
        health_listen=proc.health_listen or None,
        standby=proc.standby,
    )
    return 0


#: Commands registered by other modules: name -> (module, its registrar).
#: Imported only when the command line names one of their commands (or asks
#: for the full help), so that `galaxy serve KIND`, the command every
#: control-function instance starts with, does not import the simulator,
#: the bench, chaos and the other components (~0.8 s of a cold start).
#: tests/unit/test_cli_lazy.py checks the names against what each registers.
REGISTRARS: dict[str, tuple[str, str]] = {
    "bench": ("controlplane.bench.cli", "add_subparser"),
    "simulate": ("simulator.cli", "add_subparser"),
    "simulate-fidelity": ("simulator.cli", "add_subparser"),
    "simulate-calibrate": ("simulator.cli", "add_subparser"),
    "store": ("controlplane.tools.store_cmd", "add_subparser"),
    "revisions": ("controlplane.tools.revisions_cmd", "add_subparsers"),
    "traffic": ("controlplane.tools.revisions_cmd", "add_subparsers"),
    "runtimes": ("controlplane.tools.runtimes_cmd", "add_subparser"),
    "models": ("controlplane.tools.models_cmd", "add_subparser"),
    "graphs": ("controlplane.tools.graphs_cmd", "add_subparser"),
    "certs": ("controlplane.tools.certs_cmd", "add_subparser"),
    "chaos": ("controlplane.tools.chaos", "add_subparser"),
    "tokens": ("controlplane.tools.tokens_cmd", "add_subparser"),
    "logs": ("controlplane.tools.logs_cmd", "add_subparser"),
}
#: Commands that call the control plane (controlplane.tools.calls).
CALLS = {
    "deploy": "deploy a function from a YAML spec",
    "invoke": "call a function",
    "status": "show the control plane",
    "functions": "list functions",
    "delete": "delete a function and its instances",
}
_GLOBAL_VALUED = (
    "--run-dir",
    "--log-level",
    "--log-format",
    "--log-file",
    "--log-max-bytes",
    "--log-backups",
)


def _wanted(argv: list[str]) -> tuple[str | None, str | None]:
    """The command (and `serve`'s kind) a command line names, if any: the
    first words that are not the global options or their values."""
    words: list[str] = []
    skip = False
    for a in argv:
        if skip:
            skip = False
        elif a in _GLOBAL_VALUED:
            skip = True
        elif a.startswith("-"):
            if not words and not a.startswith(tuple(f"{g}=" for g in _GLOBAL_VALUED)):
                return None, None  # -h or an unknown option: the full parser answers
            if words:
                break
        else:
            words.append(a)
            if len(words) == 2:
                break
    cmd = words[0] if words else None
    kind = words[1] if len(words) > 1 and cmd == "serve" else None
    return cmd, kind


class _VersionAction(argparse.Action):
    """``--version``: the version and commit, looked up only when asked
    (asking git for the commit on every parse would slow every start)."""

    def __init__(self, option_strings: list[str], dest: str, **kwargs: Any) -> None:
        super().__init__(option_strings, dest, nargs=0, default=argparse.SUPPRESS, **kwargs)

    def __call__(self, parser: argparse.ArgumentParser, *_: Any) -> None:
        from controlplane.runtime.version import describe

        print(describe())
        parser.exit()


def build_parser(argv: list[str] | None = None) -> argparse.ArgumentParser:
    """The `galaxy` parser. Given the command line it will parse, only the
    command it names is registered (same result, a fraction of the
    imports); without one, or for a name it does not know, all of them."""
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
    p.add_argument(
        "--log-format",
        default=os.environ.get("GALAXY_LOG_FORMAT", "auto"),
        choices=("auto", "json", "text"),
        help="auto (default): JSON lines unless stderr is a terminal (docs/operations.md, Logs)",
    )
    p.add_argument("--log-file", default=None, help="log to this file, rotated by size")
    p.add_argument(
        "--log-max-bytes", type=int, default=10 * 1024 * 1024, help="rotate at this size"
    )
    p.add_argument("--log-backups", type=int, default=5, help="rotated files kept")
    p.add_argument("--version", action=_VersionAction, help="print the version and exit")
    sub = p.add_subparsers(dest="command", required=True)
    cmd, kind = _wanted(argv) if argv is not None else (None, None)
    local = {"up", "calibrate", "serve", "completion", *CALLS}
    if cmd not in local and cmd not in REGISTRARS:
        cmd = None
    done: set[tuple[str, str]] = set()
    for name, registrar in REGISTRARS.items():
        if registrar in done or (cmd is not None and cmd != name):
            continue
        done.add(registrar)
        getattr(importlib.import_module(registrar[0]), registrar[1])(sub)
    if cmd in (None, "up"):
        _add_up(sub)
    if cmd in (None, "calibrate"):
        _add_calibrate(sub)
    if cmd in (None, "completion"):
        _add_completion(sub)
    if cmd in (None, "serve"):
        _add_serve(sub, kind if kind in SERVE_KINDS else None)
    for name, helptext in CALLS.items():
        if cmd in (None, name):
            _add_call(sub, name, helptext)
    # `galaxy up --run-dir X` as well as `galaxy --run-dir X up`: the
    # command's copy sets the value only when given (SUPPRESS), so the
    # global one and its default stand otherwise.
    for parser in set(sub.choices.values()):
        with contextlib.suppress(argparse.ArgumentError):  # the command has its own
            parser.add_argument("--run-dir", default=argparse.SUPPRESS, help="as galaxy --run-dir")
    return p


def _add_up(sub: Any) -> None:
    from controlplane.launch.upconfig import UpConfig
    from controlplane.runtime import config

    up = sub.add_parser("up", help="run a control plane on this machine until Ctrl-C")
    config.add_arguments(up, UpConfig)
    up.set_defaults(func=cmd_up)


def _add_completion(sub: Any) -> None:
    c = sub.add_parser(
        "completion",
        help="print the shell completion script (bash or zsh)",
        description='bash: eval "$(galaxy completion bash)" (e.g. in ~/.bashrc); '
        'zsh: eval "$(galaxy completion zsh)" (e.g. in ~/.zshrc).',
    )
    c.add_argument("shell", choices=("bash", "zsh"))
    c.set_defaults(func=cmd_completion)


async def cmd_completion(args: argparse.Namespace) -> int:
    """Print argcomplete's completion script for the shell."""
    import argcomplete

    print(argcomplete.shellcode(["galaxy"], shell=args.shell))
    return 0


def _add_calibrate(sub: Any) -> None:
    cal = sub.add_parser("calibrate", help="measure T_DF, T_SF, T_CMF on this machine")
    cal.add_argument(
        "--out", default=None, help="file to write (default ~/.galaxy/calibration.json)"
    )
    cal.add_argument("--nodes", type=int, default=40, help="emulated nodes (default 40)")
    cal.add_argument("--concurrency", type=int, default=64, help="requests in flight")
    cal.add_argument("--warmup-s", type=float, default=0.5)
    cal.add_argument("--duration-s", type=float, default=3.0, help="measured seconds per kind")
    cal.add_argument(
        "--cpu-limit",
        action="append",
        default=[],
        help="[KIND=]CPUS per control function process (as `galaxy up --control-cpu-limit`)",
    )
    cal.set_defaults(func=cmd_calibrate)


def _add_serve(sub: Any, only: str | None) -> None:
    """`galaxy serve KIND`; with ``only``, just that kind (its module is
    the only component imported)."""
    from controlplane.runtime import config
    from controlplane.runtime.config import GcConfig, RpcConfig
    from controlplane.runtime.host import SERVE_FLAGS_FIRST, SERVE_FLAGS_LAST, ServeConfig

    serve = sub.add_parser("serve", help="run one component in the foreground")
    ssub = serve.add_subparsers(dest="kind", required=True)
    for kind in SERVE_KINDS:
        if only is not None and kind != only:
            continue
        sp = ssub.add_parser(kind, help=f"run a {kind}")
        standby = ("standby",) if kind in ("dispatch", "schedule", "clustermgr") else ()
        config.add_arguments(sp, ServeConfig, SERVE_FLAGS_FIRST + standby)
        sp.set_defaults(id=f"{kind}-{uuid.uuid4().hex[:6]}")
        # --no-connection-cache, deadline, sizes, --tls-dir, --insecure ...
        config.add_arguments(sp, RpcConfig, config.COMMON_RPC_FLAGS)
        config.add_arguments(sp, GcConfig)  # --no-gc-freeze, thresholds
        config.add_arguments(sp, ServeConfig, SERVE_FLAGS_LAST)
        _component_module(kind).add_arguments(sp)
        sp.set_defaults(func=cmd_serve)


async def _call(args: argparse.Namespace) -> int:
    from controlplane.tools import calls

    return int(await getattr(calls, f"cmd_{args.command}")(args))


def _add_call(sub: Any, name: str, helptext: str) -> None:
    sp = sub.add_parser(name, help=helptext)
    sp.add_argument(
        "--controller",
        default=None,
        help="controller host:port[,host:port] (default: $GALAXY_CONTROLLER or the "
        "running `galaxy up`)",
    )
    sp.set_defaults(func=_call)
    if name == "deploy":
        sp.add_argument("-f", "--file", required=True, help="function spec (YAML)")
    if name in ("invoke", "delete"):
        sp.add_argument("name", help="function name")
    if name == "invoke":
        sp.add_argument("--data", default=None, help="request body (default: stdin)")
        sp.add_argument("--path", default="/", help="HTTP path on the instance")
        sp.add_argument("--timeout", type=float, default=60.0, help="seconds")
    if name in ("status", "functions"):
        from controlplane.tools.output import add_output_flag

        add_output_flag(sp, json_alias=name == "status")
    if name == "status":
        sp.add_argument("--max-nodes", type=int, default=20)


def main(argv: list[str] | None = None) -> int:
    """Entry point of the `galaxy` command."""
    if argv is None and "_ARGCOMPLETE" in os.environ:
        # A shell asks for completions (galaxy completion bash|zsh): the
        # full parser, answered by argcomplete, which exits. Imported only
        # here, so ordinary starts pay nothing for it.
        import argcomplete

        argcomplete.autocomplete(build_parser())
        return 0
    try:
        return _main(argv)
    except BrokenPipeError:
        # `galaxy status | head -1`: the reader left. Exit as a Unix filter
        # killed by SIGPIPE would (128 + 13), without a traceback; stdout is
        # pointed at /dev/null so the interpreter's final flush cannot fail.
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        return 141


def _main(argv: list[str] | None = None) -> int:
    args = build_parser(sys.argv[1:] if argv is None else argv).parse_args(argv)
    from controlplane.runtime import logs

    try:
        logs.configure(
            level=args.log_level,
            fmt=args.log_format,
            component=getattr(args, "kind", None) or "cli",
            instance=getattr(args, "id", "") or "",
            file=args.log_file,
            max_bytes=args.log_max_bytes,
            backups=args.log_backups,
        )
    except (ValueError, OSError) as e:
        print(f"galaxy: {e}", file=sys.stderr)
        return 2
    from controlplane.runtime.host import install_uvloop

    install_uvloop()
    try:
        return asyncio.run(args.func(args))
    except CliError as e:
        print(f"galaxy: {e}", file=sys.stderr)
        return 1
    except ConfigError as e:
        print(f"galaxy: {e}", file=sys.stderr)
        return 2
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
