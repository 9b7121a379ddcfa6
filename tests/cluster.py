"""An in-process Galaxy cluster for tests: every component is the real one
(real servicers, real gRPC servers on loopback ports, the same `galaxy serve`
flags), run as tasks of the test's event loop instead of as processes, so a
test can reach into a component's state and stop one at a chosen moment.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

from controlplane.nodeagent.config import NodeAgentConfig
from controlplane.runtime import config, host, rpc
from controlplane.runtime.config import RpcConfig
from controlplane.tools.cli import _component_module, build_parser


@dataclass
class Running:
    """One running component."""

    name: str
    component: Any
    ready: dict[str, Any]
    stop: asyncio.Event
    task: asyncio.Task[None]

    @property
    def address(self) -> str:
        return str(self.ready["address"])


class InProcessCluster:
    """Start components with `add(kind, id, *flags)`; `close()` stops all."""

    def __init__(self) -> None:
        self.parts: dict[str, Running] = {}
        self.controller = ""

    async def add(
        self, kind: str, instance_id: str, *flags: str, listen: str = "127.0.0.1:0"
    ) -> Running:
        """Start a component on listen and wait until it is serving (and registered)."""
        argv = ["serve", kind, "--id", instance_id, "--metrics-listen", ""]
        if kind != "controller":
            argv += ["--controller", self.controller]
        full = [*argv, *flags]
        args = build_parser(full).parse_args(full)
        component = _component_module(kind).build(args)
        rpc_config = config.from_args(RpcConfig, args)
        stop = asyncio.Event()
        ready: asyncio.Future[dict[str, Any]] = asyncio.get_running_loop().create_future()
        task = asyncio.create_task(
            host.serve(
                component,
                instance_id=instance_id,
                listen=listen,
                metrics_listen=None,
                controller=self.controller,
                stop=stop,
                on_ready=ready.set_result,
                pool=rpc.ChannelPool.of(rpc_config),
                rpc_config=rpc_config,
            )
        )
        done, _ = await asyncio.wait({ready, task}, timeout=30, return_when=asyncio.FIRST_COMPLETED)
        if ready not in done:
            task.cancel()
            if task in done:
                task.result()  # raises the start-up error
            raise TimeoutError(f"{kind} {instance_id} did not become ready on {listen}")
        r = Running(instance_id, component, ready.result(), stop, task)
        self.parts[instance_id] = r
        if kind == "controller":
            self.controller = r.address
        return r

    async def remove(self, instance_id: str) -> None:
        """Stop one component cleanly (deregisters it)."""
        r = self.parts.pop(instance_id)
        r.stop.set()
        await asyncio.wait_for(r.task, 30)

    async def close(self) -> None:
        """Stop everything, controller last."""
        for name in [n for n in self.parts if n != "controller"] + (
            ["controller"] if "controller" in self.parts else []
        ):
            with contextlib.suppress(Exception):
                await self.remove(name)


async def eventually(cond: Callable[[], bool], within_s: float = 10.0, what: str = "") -> None:
    """Wait for a condition that other components make true asynchronously
    (no event crosses the component boundary to await); bounded."""
    loop = asyncio.get_running_loop()
    end = loop.time() + within_s
    while not cond():
        if loop.time() > end:
            raise AssertionError(f"timed out waiting for {what or cond}")
        await asyncio.sleep(0.01)


async def eventually_async(
    check: Callable[[], Awaitable[bool]], within_s: float = 10.0, what: str = ""
) -> None:
    """Like eventually, for a condition that needs an RPC to evaluate."""
    loop = asyncio.get_running_loop()
    end = loop.time() + within_s
    while not await check():
        if loop.time() > end:
            raise AssertionError(f"timed out waiting for {what or check}")
        await asyncio.sleep(0.01)


async def small_cluster(
    *agent_flags: str, dispatch_flags: tuple[str, ...] = ()
) -> InProcessCluster:
    """controller, cm-0, s-0, d-0 and agent-0 (one emulated node unless
    agent_flags say otherwise): the cluster most tests need. Close it."""
    c = InProcessCluster()
    try:
        await c.add("controller", "controller")
        await c.add("clustermgr", "cm-0")
        await c.add("schedule", "s-0")
        await c.add("dispatch", "d-0", *dispatch_flags)
        flags = agent_flags or config.to_flags(NodeAgentConfig(nodes=1, sandbox="emulated"))
        await c.add("nodeagent", "agent-0", *flags)
    except BaseException:
        await c.close()
        raise
    return c
