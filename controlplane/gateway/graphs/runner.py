"""The gateway running inference graphs: the planner's calls made through
the same slot cache as every proxied request (so Dispatch's auth, slots,
revision splits and the caller's token apply to each step), each within its
step's deadline; the first failing step ends the request with an error that
names the graph, the step and the function.

Why the gateway and not a router function: the gateway already holds the
request, its deadline and a slot cache; a router function would hold a slot
of its own for the whole graph and add a hop to every step.
"""

from __future__ import annotations

import asyncio
import random
from collections.abc import Callable
from pathlib import Path
from typing import Any

import orjson
import yaml
from aiohttp import web

from controlplane.gateway import guard
from controlplane.gateway.config import GatewayConfig
from controlplane.gateway.graphs.planner import Call, Plan
from controlplane.gateway.graphs.source import GraphSource
from controlplane.gateway.slots import SlotCache
from controlplane.runtime import graphspec as spec
from controlplane.runtime.errors import GalaxyError, InvalidArgument

#: gRPC refusals of a step's Dispatch call -> HTTP status of the graph's answer
_STATUS = {"NOT_FOUND": 404, "PERMISSION_DENIED": 403, "UNAUTHENTICATED": 401,
           "RESOURCE_EXHAUSTED": 429, "DEADLINE_EXCEEDED": 504}  # fmt: skip


class StepFailed(Exception):
    """A step that did not answer with JSON in time: what the client is told."""

    def __init__(self, status: int, call: Call, message: str) -> None:
        super().__init__(message)
        self.status = status
        self.call = call


def load_dir(path: str) -> dict[str, spec.Graph]:
    """Every graph in a directory's ``*.yaml`` files, by name; ValueError
    naming the file and the field of the first bad one."""
    graphs: dict[str, spec.Graph] = {}
    for f in sorted(Path(path).glob("*.yaml")):
        try:
            g = spec.parse(yaml.safe_load(f.read_text()))
        except (InvalidArgument, yaml.YAMLError, OSError) as e:
            raise ValueError(f"--graphs-dir: {f.name}: {e}") from None
        if g.name in graphs:
            raise ValueError(f"--graphs-dir: {f.name}: name: graph {g.name} defined twice")
        graphs[g.name] = g
    return graphs


class GraphRunner:
    """Runs the gateway's graphs (``graphs``: where they are found)."""

    def __init__(
        self,
        slots: SlotCache,
        cfg: GatewayConfig,
        graphs: GraphSource,
        draw: Callable[[], float] = random.random,
    ) -> None:
        self.slots = slots
        self.cfg = cfg
        self.graphs = graphs
        self.draw = draw

    async def run(
        self, name: str, body: bytes | bytearray, headers: dict[str, str], token: str | None
    ) -> web.Response:
        """Run graph ``name`` on a request body; its answer, or the error of
        the step that failed."""
        graph = await self.graphs.find(name, token)
        try:
            request = guard.parse_json(body)
        except guard.BadJson as e:
            raise InvalidArgument(str(e)) from None
        plan = Plan(graph, request, self.draw)
        try:
            # The whole graph within the gateway's request deadline, however
            # its steps' own deadlines add up.
            async with asyncio.timeout(self.cfg.request_timeout_s):
                await self._drive(plan, headers, token)
        except TimeoutError:
            message = f"graph {name}: not done within {self.cfg.request_timeout_s:g}s"
            return web.json_response(
                {"error": {"message": message, "code": 504, "type": "graph_timeout",
                           "graph": name}}, status=504,
            )  # fmt: skip
        except StepFailed as e:
            c = e.call
            return web.json_response(
                {"error": {"message": f"graph {name}: step {c.step} (function {c.function}): "
                           f"{e}"[:512], "code": e.status, "type": "graph_step_failed",
                           "graph": name, "step": c.step, "function": c.function}},
                status=e.status,
            )  # fmt: skip
        return web.json_response(plan.result, headers={"X-Galaxy-Graph": name})

    async def _drive(self, plan: Plan, headers: dict[str, str], token: str | None) -> None:
        """Make the plan's calls, concurrently where it allows, until it is
        finished; the first failure cancels the calls still running."""
        pending: dict[asyncio.Task[Any], Call] = {}

        def launch(calls: list[Call]) -> None:
            for c in calls:
                pending[asyncio.create_task(self._call(c, headers, token))] = c

        launch(plan.start())
        try:
            while pending:
                done, _ = await asyncio.wait(pending, return_when=asyncio.FIRST_COMPLETED)
                for t in done:
                    launch(plan.answer(pending.pop(t), t.result()))
        finally:
            for t in pending:
                t.cancel()
            await asyncio.gather(*pending, return_exceptions=True)

    async def _call(self, c: Call, headers: dict[str, str], token: str | None) -> Any:
        """One step's call: its answer's JSON, or StepFailed."""
        data = orjson.dumps(c.body)

        async def body() -> bytes:
            return data

        try:
            async with asyncio.timeout(c.timeout_s):
                async with self.slots.slot(
                    c.function, c.path, body, headers, "POST", "", token
                ) as (slot, upstream):
                    if upstream is None:  # an emulated sandbox: no process to call
                        return {"echo": c.body}
                    length = upstream.content_length
                    if length is not None and length > self.cfg.max_body_bytes:
                        raise StepFailed(502, c, f"answer larger than {self.cfg.max_body_bytes} B")
                    raw = bytearray()
                    async for chunk in upstream.content.iter_any():
                        raw += chunk
                        if len(raw) > self.cfg.max_body_bytes:
                            raise StepFailed(
                                502, c, f"answer larger than {self.cfg.max_body_bytes} B"
                            )
                    slot.reusable = True
                    status = upstream.status
        except TimeoutError:
            raise StepFailed(504, c, f"no answer within {c.timeout_s:g}s") from None
        except GalaxyError as e:
            raise StepFailed(_STATUS.get(e.code.name, 503), c, e.message) from None
        text = raw[:200].decode("utf-8", "replace")
        if status >= 300:
            # A step's 4xx is about what it was sent: the client's to see.
            raise StepFailed(status if status < 500 else 502, c, f"answered {status}: {text}")
        try:
            return guard.parse_json(raw)
        except guard.BadJson:
            raise StepFailed(502, c, f"answer is not JSON: {text!r}") from None
