"""Sleeping instances under a real `galaxy up` (the emulated LLM server:
its wake cost is a timer): a function scaled out by a burst scales in to
sleeping instances (still running, asleep on their own `/v1/galaxy/state`,
shown asleep by `galaxy status`, counted by `galaxy_llm_instances_asleep`,
sent no request), the next burst wakes them before any cold start (no new
instance id, no new cold start counted; woken by the requests the burst
routed to them, with no wake call ahead), and an instance asleep longer than
`keep_asleep_ms` is removed (its process gone). Requests go through the
gateway with the official `openai` client."""

from __future__ import annotations

import asyncio
import functools
import time

import aiohttp
import pytest

from tests.integration.upctl import GalaxyUp
from tests.llm import sleepyup as su

pytestmark = [pytest.mark.integration, pytest.mark.slow]

KEEP_MS = 12_000


async def test_idle_instances_sleep_wake_before_cold_starts_and_expire(tmp_path, monkeypatch):
    async with su.sleepy_up(tmp_path, monkeypatch, KEEP_MS) as (g, ask):
        # A burst of three scales it out to three instances.
        await su.burst(ask)
        await su.until("three instances", lambda: len(su.status(g)) == 3, 30)
        ids = {s["instance"]["instance_id"] for s in su.status(g)}
        cold = su.dispatch_metric(g, "galaxy_cold_starts_total")

        # Idle: the scale-in puts two to sleep (max_asleep), one stays awake.
        # (Counted once each instance answered its sleep call.)
        await su.until("two asleep", lambda: su.slept(g) == 2, 60)
        now = su.status(g)
        asleep = [s["instance"] for s in now if s.get("asleep")]
        awake = [s["instance"] for s in now if not s.get("asleep")]
        assert len(awake) == 1 and {s["instance"]["instance_id"] for s in now} == ids
        assert su.dispatch_metric(g, "galaxy_llm_instances_asleep") == 2
        for i in asleep:  # still running, and asleep by its own account
            state = await su.engine_state(g, i)
            assert state.pop("asleep_s") > 0
            assert state == {
                "asleep": True, "sleeps": 1, "wakes": 0, "wake_calls": 0, "emulated": True
            }  # fmt: skip
        # One request at a time: the awake instance serves, no sleeper is sent one.
        for _ in range(3):
            assert (await ask(2)) == "tok1 tok2"
        for i in asleep:
            assert (await su.engine_state(g, i))["asleep"] is True

        # The next burst wakes the sleepers before any cold start.
        await su.burst(ask)
        assert su.dispatch_metric(g, "galaxy_llm_wakes_total") == 2
        assert su.dispatch_metric(g, "galaxy_cold_starts_total") == cold
        assert {s["instance"]["instance_id"] for s in su.status(g)} == ids
        for i in asleep:  # (woken once: the scale-in may put it back to sleep already)
            state = await su.engine_state(g, i)
            # by the request routed to it: no wake call went ahead of it
            assert (state["wakes"], state["wake_calls"]) == (1, 0)

        # Idle again: two sleep, then stay asleep past keep_asleep_ms and go.
        await su.until("asleep again", lambda: su.slept(g) == 4, 60)
        slept_at = time.monotonic()
        gone = [s["instance"] for s in su.status(g) if s.get("asleep")]
        assert len(gone) == 2
        await su.until(
            "the sleepers removed",
            lambda: su.dispatch_metric(g, "galaxy_llm_instances_asleep") == 0,
            KEEP_MS / 1000 + 30,
        )
        assert time.monotonic() - slept_at >= KEEP_MS / 1000 - 3  # (not removed early)
        left = {s["instance"]["instance_id"] for s in su.status(g)}
        assert left == ids - {i["instance_id"] for i in gone}
        for i in gone:  # stopped on the node: nothing answers for it
            await su.until(f"{i['instance_id']} stopped", functools.partial(_down, g, i), 30)
        assert su.dispatch_metric(g, "galaxy_cold_starts_total") == cold


def _down(g: GalaxyUp, instance: dict) -> bool:
    try:
        got = asyncio.run(su.engine_state(g, instance))
    except (aiohttp.ClientError, AssertionError):
        return True
    return "asleep" not in got
