"""A Dispatch killed (SIGKILL) while instances of an LLM function sleep,
under a real `galaxy up` whose records live in an etcd of the test's own:
restarted, it finds them asleep (their own `/v1/galaxy/state`), lists them,
so the node agents' orphan checks stop the recovered awake instance (no
request made its router yet, as for any idle instance) and not them, and
the next burst wakes both."""

from __future__ import annotations

import asyncio
import os
import signal
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.etcd_server import EtcdServer, require_etcd, running_etcd
from tests.llm.sleepyup import (
    burst,
    dispatch_metric,
    engine_state,
    sleepy_up,
    slept,
    status,
    until,
)

pytestmark = [pytest.mark.integration, pytest.mark.slow, pytest.mark.etcd]


@pytest.fixture
def etcd(tmp_path: Path) -> Iterator[EtcdServer]:
    """An etcd of this test's own: instance records outlive a Dispatch only
    in a shared store (the default one lives in the process)."""
    require_etcd()
    with running_etcd(tmp_path / "etcd") as server:
        yield server


async def test_sleepers_survive_a_dispatch_restart(tmp_path, monkeypatch, etcd) -> None:
    async with sleepy_up(tmp_path, monkeypatch, 600_000, "--state", etcd.url) as (g, ask):
        await burst(ask)
        await until("two asleep", lambda: slept(g) == 2, 60)
        asleep = [s["instance"] for s in status(g) if s.get("asleep")]

        old = int(g.component("dispatch-0")["pid"])
        os.kill(old, signal.SIGKILL)
        await asyncio.to_thread(g.wait_line, "dispatch-0 restarted")
        g.reload_endpoints()
        # The orphan checks run: they stop the awake instance (recovered,
        # not routed before a request, as any idle instance), not the sleepers.
        await until(
            "an orphan check",
            lambda: dispatch_metric(g, "galaxy_orphan_instances_reaped_total", "agent-0") >= 1,
            60,
        )
        now = status(g)
        assert sorted(s["instance"]["instance_id"] for s in now if s.get("asleep")) == sorted(
            i["instance_id"] for i in asleep
        )
        assert dispatch_metric(g, "galaxy_llm_instances_asleep") == 2
        for i in asleep:
            assert (await engine_state(g, i))["asleep"] is True

        # The next burst wakes both (the third instance is a new start).
        await burst(ask)
        assert dispatch_metric(g, "galaxy_llm_wakes_total") == 2
        ids = {s["instance"]["instance_id"] for s in status(g)}
        assert {i["instance_id"] for i in asleep} <= ids
        for i in asleep:  # (woken once: the scale-in may put it back to sleep already)
            assert (await engine_state(g, i))["wakes"] == 1
