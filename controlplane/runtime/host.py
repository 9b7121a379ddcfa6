"""Runs one Galaxy component (a control function, the controller, or a node
agent pool) as a process: gRPC server with health and reflection, /metrics,
registration with the controller, a ready line for supervisors, and a clean
stop on SIGTERM/SIGINT or when the supervisor's lifeline pipe closes.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import os
import signal
import sys
import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Protocol, cast

from controlplane.runtime import authz, controllers, gctune, loadreport, netaddr, rpc, version
from controlplane.runtime.authn import AccessInterceptor
from controlplane.runtime.config import Config, GcConfig, RpcConfig, setting
from controlplane.runtime.membership import KIND_NAMES
from controlplane.runtime.metrics import register_component, serve_metrics, watch_gc
from controlplane.runtime.tls import IdentityInterceptor
from galaxy.v1 import common_pb2

log = logging.getLogger(__name__)

READY_PREFIX = "GALAXY_READY "


class ServeConfig(Config):
    """The process flags every `galaxy serve KIND` has (``RpcConfig`` adds
    the RPC ones, each kind its own config): where it listens, whom it
    registers with, how it is supervised."""

    id: str | None = setting(
        None, "instance id (stable across restarts is best; default KIND-RANDOM)"
    )
    listen: str = setting("127.0.0.1:0", "gRPC host:port (0 = any)")
    metrics_listen: str = setting("127.0.0.1:0", "Prometheus host:port ('' = off)")
    advertise_host: str | None = setting(
        None, "host others use to reach this process (default: listen host)"
    )
    controller: str | None = setting(
        None,
        "controller host:port, or several comma-separated (HA: any one that is up; "
        "default $GALAXY_CONTROLLER)",
        env="GALAXY_CONTROLLER",
    )
    lifeline: bool = setting(False, "exit when stdin closes (used by `galaxy up`)")
    standby: bool = setting(
        False, "register as a warm standby: the controller promotes it on a scale-out"
    )
    health_listen: str = setting(
        "",
        "also serve grpc.health.v1 alone in plaintext on host:port, for probes "
        "that cannot present a certificate (Kubernetes gRPC probes; '' = off)",
    )
    load_report_ms: float = setting(
        loadreport.DEFAULT_INTERVAL_S * 1000.0,
        "load report period of a control function (0 = off)",
        ge=0,
    )


#: ``ServeConfig`` flags before the ``RpcConfig`` ones, and after (the
#: order of `galaxy serve KIND --help`); ``standby`` only the control
#: functions have.
SERVE_FLAGS_FIRST = ("id", "listen", "metrics_listen", "advertise_host", "controller", "lifeline")
SERVE_FLAGS_LAST = ("health_listen", "load_report_ms")


@dataclass
class HostContext:
    """What a component learns from its host once the server is bound."""

    instance_id: str
    address: str
    metrics_address: str
    controller: str
    pool: rpc.ChannelPool
    extra: dict[str, Any] = field(default_factory=dict)
    #: Registered as a warm standby and not promoted yet (the controller's
    #: load report replies keep it current), so registering again after a
    #: controller restart registers what the instance is.
    standby: bool = False


class Component(Protocol):
    """A unit the host can run."""

    #: ControlKind to register with the controller; 0 = do not register.
    kind: int

    def services(self) -> list[tuple[Callable[[Any, Any], None], Any, str]]:
        """(add_to_server, servicer, service full name) triples to serve."""
        ...

    async def start(self, ctx: HostContext) -> None:
        """Called after the server is listening, before registration."""
        ...

    def on_membership(self, membership: common_pb2.Membership) -> None:
        """Called with the membership returned by registration."""
        ...

    async def stop(self) -> None:
        """Release resources (child processes, background tasks)."""
        ...


def serve_command(
    kind: str, instance_id: str, host: str, *extra: str, python: str = sys.executable
) -> list[str]:
    """The command line that runs one component as a child process: listens
    on any free port of host (gRPC and /metrics), ready line on stdout, and a
    lifeline on stdin (used by `galaxy up` and the local actuator)."""
    return [
        python,
        "-m",
        "controlplane.tools.cli",
        "serve",
        kind,
        "--id",
        instance_id,
        "--listen",
        f"{host}:0",
        "--metrics-listen",
        f"{host}:0",
        "--lifeline",
        *extra,
    ]


def install_uvloop() -> None:
    """Use uvloop when it is installed (it is a dependency; this keeps tests
    runnable in a plain interpreter too)."""
    try:
        import uvloop
    except ImportError:  # pragma: no cover
        return
    asyncio.set_event_loop_policy(uvloop.EventLoopPolicy())


async def _register(ctx: HostContext, kind: int, deadline_s: float) -> common_pb2.Membership:
    """Register with the controller, retrying until it answers or deadline_s passes."""
    me = common_pb2.ControlInstance(
        id=ctx.instance_id,
        kind=cast(common_pb2.ControlKind, kind),
        address=ctx.address,
        metrics_address=ctx.metrics_address,
        standby=ctx.standby,
    )
    loop = asyncio.get_running_loop()
    end = loop.time() + deadline_s
    delay = 0.05
    while True:
        try:
            # Any controller of an HA set will do (a follower forwards).
            return await controllers.call(  # type: ignore[no-any-return]
                ctx.pool, ctx.controller, "RegisterInstance", me, timeout_s=2.0
            )
        except Exception as e:  # grpc.aio.AioRpcError and connection errors
            if loop.time() + delay > end:
                raise RuntimeError(
                    f"could not register with controller {ctx.controller}: {e}"
                ) from e
            await asyncio.sleep(delay)  # backoff between connection attempts
            delay = min(delay * 2, 1.0)


async def _deregister(ctx: HostContext, kind: int) -> None:
    me = common_pb2.ControlInstance(
        id=ctx.instance_id, kind=cast(common_pb2.ControlKind, kind), address=ctx.address
    )
    try:
        await controllers.call(ctx.pool, ctx.controller, "DeregisterInstance", me, timeout_s=2.0)
    except Exception as e:
        log.warning("deregistration failed (controller gone?): %s", e)


def _load_reporter(
    component: Component, ctx: HostContext, interval_s: float
) -> loadreport.LoadReporter:
    """The periodic load reporter of a registered component; it registers
    again when the controller has forgotten the instance (restart, failover)."""
    me = common_pb2.ControlInstance(
        id=ctx.instance_id,
        kind=cast(common_pb2.ControlKind, component.kind),
        address=ctx.address,
        metrics_address=ctx.metrics_address,
    )
    return loadreport.LoadReporter(
        component,
        me,
        ctx.controller,
        ctx.pool,
        interval_s=interval_s,
        reregister=lambda: _register(ctx, component.kind, 5.0),
        on_membership=component.on_membership,
        on_reply=lambda reply: setattr(ctx, "standby", reply.standby),
    )


def watch_lifeline(stop: asyncio.Event) -> None:
    """Stop when stdin reaches EOF: the supervisor died or closed our pipe.

    This is what keeps `galaxy up` from leaving orphans even if it is killed
    with SIGKILL.
    """
    loop = asyncio.get_running_loop()

    def reader() -> None:
        # os.read on the raw fd, not sys.stdin.buffer: a daemon thread blocked
        # inside a buffered reader aborts the interpreter at exit.
        try:
            while os.read(0, 4096):
                pass
        except OSError:
            pass
        finally:
            # The loop may already be closed if we are exiting for another reason.
            with contextlib.suppress(RuntimeError):
                loop.call_soon_threadsafe(stop.set)

    # A daemon thread, not the executor: a blocked read must not hold up exit.
    threading.Thread(target=reader, name="lifeline", daemon=True).start()


async def serve(
    component: Component,
    *,
    instance_id: str,
    listen: str,
    metrics_listen: str | None,
    controller: str,
    advertise_host: str | None = None,
    lifeline: bool = False,
    register_timeout_s: float = 30.0,
    pool: rpc.ChannelPool | None = None,
    stop: asyncio.Event | None = None,
    on_ready: Callable[[dict[str, Any]], None] | None = None,
    load_report_s: float = loadreport.DEFAULT_INTERVAL_S,
    health_listen: str | None = None,
    standby: bool = False,
    rpc_config: RpcConfig | None = None,
    gc_config: GcConfig | None = None,
) -> None:
    """Serve component until a stop signal; see module docstring.

    stop / on_ready let a caller run components in-process (tests,
    embedding): serving ends when stop is set, and on_ready receives the
    ready record instead of it being printed. Signal handlers are installed
    only when no stop event is given. A registered component reports its
    load every load_report_s seconds (0 = never; see controlplane.runtime.loadreport).
    health_listen: also serve grpc.health.v1 alone, in plaintext, there
    (for probes without a certificate; see rpc.health_only_server).
    standby: register as a warm standby (kept out of every membership until
    a scale-out promotes it).
    rpc_config: the server's message size limit and credentials, and the
    default pool's settings (a given pool should be made from the same:
    ``ChannelPool.of``). With ``rpc_config.tls`` the server is mutual TLS
    and checks callers' identities; without, it serves plaintext.
    gc_config: tune the garbage collector once ready (``gctune``); None
    leaves it alone (a component run in a process that is not its own).
    """
    rpc_config = rpc_config or RpcConfig()
    tls = rpc_config.tls
    pool = pool or rpc.ChannelPool.of(rpc_config)
    # With TLS, callers are also checked by identity: internal RPCs accept
    # component certificates only (controlplane.runtime.authz).
    # A component with a public API checks bearer tokens too (its
    # `authenticator`, set when --auth is on; controlplane.runtime.authn).
    services = component.services()  # builds the component (and its authenticator)
    auth = getattr(component, "authenticator", None)
    guards: list[Any] = []
    if tls is not None:
        guards = [
            AccessInterceptor(auth) if auth is not None else IdentityInterceptor(authz.allowed)
        ]
    server, port, health_servicer = rpc.create_server(
        listen, services, config=rpc_config, interceptors=guards
    )
    listen_host, _ = netaddr.split_host_port(listen)
    address = netaddr.join_host_port(netaddr.advertised_host(listen_host, advertise_host), port)
    metrics_address = ""
    # The families this kind owns (and the common ones), before the first scrape.
    kind_name = getattr(component, "name", None) or KIND_NAMES.get(component.kind, "nodeagent")
    register_component(kind_name)
    if metrics_listen:
        mhost, mport = netaddr.split_host_port(metrics_listen)
        metrics_address = serve_metrics(mhost, mport)
        watch_gc()
    ctx = HostContext(instance_id, address, metrics_address, controller, pool, standby=standby)
    health_only = None
    if health_listen:
        health_only, _ = rpc.health_only_server(health_listen, health_servicer)
    await server.start()
    if health_only is not None:
        await health_only.start()
    loop = asyncio.get_running_loop()
    if stop is None:
        stop = asyncio.Event()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, stop.set)
    if lifeline:
        watch_lifeline(stop)
    reporter: loadreport.LoadReporter | None = None
    try:
        await component.start(ctx)
        if component.kind:
            component.on_membership(await _register(ctx, component.kind, register_timeout_s))
            if load_report_s > 0:
                reporter = _load_reporter(component, ctx, load_report_s)
                reporter.start()
        names = [s[2] for s in component.services()]
        if gc_config is not None:
            # Start-up is over: what exists now lives as long as the process.
            gctune.tune(gc_config)
        await rpc.set_serving(health_servicer, names)
        ready = {
            "kind": kind_name,
            "id": instance_id,
            "address": address,
            "metrics": metrics_address,
            "pid": os.getpid(),
            "version": version.version(),
            **ctx.extra,
        }
        if on_ready is not None:
            on_ready(ready)
        else:
            print(READY_PREFIX + json.dumps(ready), flush=True)
        log.info(
            "%s %s serving on %s (metrics %s)", kind_name, instance_id, address, metrics_address
        )
        await stop.wait()
    finally:
        log.info("%s %s stopping", kind_name, instance_id)
        if reporter is not None:
            await reporter.stop()
        await rpc.set_serving(health_servicer, [s[2] for s in component.services()], False)
        if component.kind:
            await _deregister(ctx, component.kind)
        await server.stop(grace=1.0)
        if health_only is not None:
            await health_only.stop(grace=0)
        await component.stop()
        await pool.close()
