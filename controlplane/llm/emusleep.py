"""Sleep for the emulated LLM server, with the real server's routes
(``realserver``): ``POST /v1/galaxy/sleep``, ``POST /v1/galaxy/wake``,
``GET /v1/galaxy/state`` (with how long it has slept, ``asleep_s``). An
emulation: no weights or context exist, so sleeping empties the prefix
cache (the KV cache goes with the context) and waking costs the profile's
``wake_s`` (a timer, no CPU), paid by the wake call or by the first
request that finds the instance asleep.
"""

from __future__ import annotations

import asyncio
import time

from aiohttp import web

from controlplane.llm.engine import Engine


class EmulatedSleep:
    """Whether one emulated engine is asleep, and its wake."""

    def __init__(self, engine: Engine) -> None:
        self.engine = engine
        self.asleep = False
        self.sleeps = 0
        self.wakes = 0
        #: time.monotonic() when it fell asleep (while asleep)
        self.asleep_since = 0.0
        #: ``POST /v1/galaxy/wake`` calls that found it asleep (the other
        #: wakes: a request's)
        self.wake_calls = 0
        self._waking: asyncio.Task[None] | None = None

    def sleep(self) -> bool:
        """Fall asleep (requests already running finish); False when asleep."""
        if self.asleep:
            return False
        self.asleep = True
        self.asleep_since = time.monotonic()
        self.sleeps += 1
        self.engine.prefix.clear()
        return True

    async def awake(self) -> float:
        """Wake if asleep; the seconds this caller waited (0 when awake).
        Concurrent callers share one wake, which a caller going away does
        not cancel."""
        if not self.asleep:
            return 0.0
        t0 = time.monotonic()
        if self._waking is None:
            self._waking = asyncio.create_task(self._wake())
        await asyncio.shield(self._waking)
        return time.monotonic() - t0

    async def _wake(self) -> None:
        try:
            await asyncio.sleep(self.engine.profile.wake_s)  # the emulated wake cost
            self.asleep = False
            self.wakes += 1
        finally:
            self._waking = None

    def install(self, app: web.Application) -> None:
        """Add the sleep routes to the server's app."""

        async def sleep(_r: web.Request) -> web.Response:
            return web.json_response({"asleep": True, "changed": self.sleep()})

        async def wake(_r: web.Request) -> web.Response:
            self.wake_calls += self.asleep
            return web.json_response({"asleep": False, "woke_s": await self.awake()})

        async def state(_r: web.Request) -> web.Response:
            asleep_s = time.monotonic() - self.asleep_since if self.asleep else 0.0
            state = {"asleep": self.asleep, "sleeps": self.sleeps, "wakes": self.wakes,
                     "wake_calls": self.wake_calls, "asleep_s": asleep_s}  # fmt: skip
            return web.json_response(state | {"emulated": True})

        app.router.add_post("/v1/galaxy/sleep", sleep)
        app.router.add_post("/v1/galaxy/wake", wake)
        app.router.add_get("/v1/galaxy/state", state)
