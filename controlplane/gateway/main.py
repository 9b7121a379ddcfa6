"""`galaxy serve gateway`: flags, and the process that serves HTTP."""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import os
import signal
import ssl
import sys

from aiohttp import web

from controlplane.gateway.config import GatewayConfig
from controlplane.gateway.conns import Connections
from controlplane.gateway.proxy import Proxy
from controlplane.runtime import config, gctune, leasetoken, netaddr
from controlplane.runtime.config import GcConfig, RpcConfig
from controlplane.runtime.host import READY_PREFIX, watch_lifeline
from controlplane.runtime.metrics import (
    QUEUE_LIMIT,
    register_component,
    serve_metrics,
    watch_gc,
)
from controlplane.sdk.client import GalaxyClient
from controlplane.sdk.entryroute import EntryRouter
from controlplane.sdk.http import HttpPool

log = logging.getLogger(__name__)


def add_arguments(p: argparse.ArgumentParser) -> None:
    """Gateway flags (common ones are added by the CLI), from ``GatewayConfig``."""
    config.add_arguments(p, GatewayConfig)
    config.add_arguments(p, RpcConfig, ["auth"])


def make_app(proxy: Proxy, cfg: GatewayConfig) -> web.Application:
    """The aiohttp application: every path goes to the proxy's router."""
    app = web.Application(client_max_size=cfg.max_body_bytes)
    app.router.add_route("*", "/{tail:.*}", proxy.handle)
    return app


def https_context(cfg: GatewayConfig) -> ssl.SSLContext | None:
    """The server TLS context of --https-cert/--https-key (None: plain HTTP);
    ValueError naming the flag when only one is given or a file is unusable."""
    if not cfg.https_cert and not cfg.https_key:
        return None
    if not (cfg.https_cert and cfg.https_key):
        raise ValueError("--https-cert and --https-key: give both or neither")
    ctx = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    ctx.minimum_version = ssl.TLSVersion.TLSv1_2
    try:
        ctx.load_cert_chain(cfg.https_cert, cfg.https_key)
    except (OSError, ssl.SSLError) as e:
        raise ValueError(f"--https-cert/--https-key: cannot load: {e}") from None
    return ctx


async def start(
    cfg: GatewayConfig,
    controller: str,
    host: str,
    port: int,
    rpc: RpcConfig | None = None,
    require_token: bool = False,
) -> tuple[web.AppRunner, Proxy, str]:
    """Start serving on host:port (0: any free port); returns the runner,
    the proxy and the bound address. rpc: what the gateway's channels to the
    control plane take (its certificate: ``rpc.tls``; the connection cache,
    size limits); their deadline is ``cfg.request_timeout_s``.
    require_token: every request but health checks needs a bearer token,
    passed on to the control plane, which judges it (401 without one)."""
    rpc = (rpc or RpcConfig()).replace(deadline_s=cfg.request_timeout_s)
    client = GalaxyClient(controller, rpc=rpc)
    # With the cluster's route key, the gateway's connections to instances
    # are routed through the kernel where a node agrees (sdk/entryroute.py).
    key = leasetoken.load_route(rpc.tls_dir) if cfg.route_entries and rpc.tls is not None else None
    if key is not None:
        client.http = HttpPool(router=EntryRouter(key))
    proxy = Proxy(client, cfg, require_token=require_token)
    QUEUE_LIMIT.labels("galaxy_gateway_in_flight").set(cfg.max_in_flight)
    ssl_context = https_context(cfg)
    # aiohttp's own bounds: header sizes, idle keep-alive connections.
    runner = web.AppRunner(
        make_app(proxy, cfg),
        access_log=None,
        handle_signals=False,
        max_line_size=cfg.max_header_bytes,
        max_field_size=cfg.max_header_bytes,
        keepalive_timeout=cfg.idle_timeout_s,
        read_bufsize=2**14,
    )
    await runner.setup()
    # Not a TCPSite: its protocol factory is wrapped by the connection bound
    # and the head deadline (controlplane/gateway/conns.py).
    assert runner.server is not None
    proxy.connections = Connections(
        runner.server, cfg.max_connections, cfg.header_timeout_s, proxy.refusals
    )
    proxy.server = await asyncio.get_running_loop().create_server(
        proxy.connections, host or None, port, ssl=ssl_context, reuse_address=True, backlog=4096
    )
    bound = proxy.server.sockets[0].getsockname()[1]
    return runner, proxy, netaddr.join_host_port(host, bound)


async def stop(runner: web.AppRunner, proxy: Proxy) -> None:
    """Stop accepting, let requests in flight finish (bounded), close."""
    if proxy.server is not None:
        proxy.server.close()
    await runner.cleanup()
    await proxy.slots.close()
    await proxy.client.close()


async def run(args: argparse.Namespace) -> int:
    """Serve until SIGTERM/SIGINT or the lifeline closes."""
    cfg = config.from_args(GatewayConfig, args)
    rpc = config.rpc_of(args)
    host, port = netaddr.split_host_port(args.listen)
    try:
        runner, proxy, bound = await start(
            cfg, args.controller, host, port, rpc, require_token=rpc.tokens_enabled()
        )
    except ValueError as e:
        print(f"galaxy: {e}", file=sys.stderr)
        return 2
    except OSError as e:
        # A taken port is a usage error, not a crash: one line, no traceback.
        print(f"galaxy: --listen {args.listen}: cannot listen ({e.strerror or e})", file=sys.stderr)
        return 2
    address = netaddr.join_host_port(
        netaddr.advertised_host(host, args.advertise_host), netaddr.split_host_port(bound)[1]
    )
    metrics = ""
    register_component("gateway")
    if args.metrics_listen:
        mhost, mport = netaddr.split_host_port(args.metrics_listen)
        metrics = serve_metrics(mhost, mport)
        watch_gc()
    stop_event = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop_event.set)
    if args.lifeline:
        watch_lifeline(stop_event)
    # As every `galaxy serve` process once ready (controlplane.runtime.gctune).
    gctune.tune(config.from_args(GcConfig, args))
    ready = {"kind": "gateway", "id": args.id, "address": address, "http": address,
             "metrics": metrics, "pid": os.getpid()}  # fmt: skip
    print(READY_PREFIX + json.dumps(ready), flush=True)
    log.info("gateway %s serving HTTP on %s (controller %s)", args.id, address, args.controller)
    try:
        await stop_event.wait()
    finally:
        await stop(runner, proxy)
    return 0
