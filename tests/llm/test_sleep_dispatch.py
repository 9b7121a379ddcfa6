"""Sleeping instances under a real `galaxy up` (the emulated LLM server:
its wake cost is a timer): a function scaled out by a burst scales in to
sleeping instances (still running, asleep on their own `/v1/galaxy/state`,
shown asleep by `galaxy status`, counted by `galaxy_llm_instances_asleep`,
sent no request), the next burst wakes them before any cold start (no new
instance id, no new cold start counted), and an instance asleep longer than
`keep_asleep_ms` is removed (its process gone). A Dispatch killed while
instances sleep finds them asleep when it restarts: they stay listed (the
node agents' orphan checks stop the unrouted awake one, not them) and the
next burst wakes them. Requests go through the gateway with the official
`openai` client."""

from __future__ import annotations

import asyncio
import json
import os
import re
import signal
import sys
import time
import urllib.request
from collections.abc import Callable, Iterator
from pathlib import Path

import aiohttp
import openai
import pytest

from controlplane.runtime import leasetoken
from tests.etcd_server import EtcdServer, require_etcd, running_etcd
from tests.integration.upctl import REPO, GalaxyUp

pytestmark = [pytest.mark.integration, pytest.mark.slow]

SPEC = """\
name: sleepy-llm
public: true
runtime: llm-emulated
artifact: {artifact}
args: [--profile=smollm2-135m-cpu]
concurrency: 1
min_scale: 0
max_scale: 3
autoscaling:
  stable_window_ms: 6000
  # (a panic window of at least the 2 s autoscaler tick)
  panic_window_percent: 50
  scale_to_zero_grace_ms: 600000
  max_asleep: 2
  keep_asleep_ms: {keep_ms}
"""
KEEP_MS = 25_000
BURST_TOKENS = 300  # ~5 s a request at the profile's ~15 ms per token


def status(g: GalaxyUp) -> list[dict]:
    """The function's instances as `galaxy status -o json` shows them."""
    r = g.cli("status", "-o", "json")
    assert r.returncode == 0, r.stderr
    return [
        s
        for s in json.loads(r.stdout).get("instances", [])
        if s["instance"]["function"].startswith("sleepy-llm-")
    ]


def dispatch_metric(g: GalaxyUp, name: str, component: str = "dispatch-0") -> float:
    url = f"http://{g.component(component)['metrics']}/metrics"
    text = urllib.request.urlopen(url, timeout=5).read().decode()
    m = re.search(rf"^{re.escape(name)} (\S+)$", text, re.M)
    return float(m.group(1)) if m else 0.0


async def until(what: str, check: Callable[[], bool], timeout_s: float) -> None:
    """Poll the control plane's view (status, metrics) until ``check``: the
    autoscaler acts on its own ticks, with no event to wait on from here."""
    deadline = time.monotonic() + timeout_s
    while not await asyncio.to_thread(check):
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        await asyncio.sleep(0.5)


async def engine_state(g: GalaxyUp, instance: dict) -> dict:
    """The instance's own answer, through its node's entry (which asks for
    a lease token, as Dispatch's calls carry)."""
    key = leasetoken.load(g.endpoints["tls_dir"])
    assert key is not None
    token = key.sign(instance["instance_id"], time.time_ns() // 1_000_000 + 5_000)
    async with aiohttp.ClientSession() as s:
        async with s.get(
            f"http://{instance['address']}/v1/galaxy/state",
            headers={leasetoken.HEADER: token},
            timeout=aiohttp.ClientTimeout(total=5),
        ) as r:
            assert r.status == 200, await r.text()
            return await r.json()


async def test_idle_instances_sleep_wake_before_cold_starts_and_expire(tmp_path, monkeypatch):
    monkeypatch.setenv("PATH", f"{Path(sys.executable).parent}:{os.environ['PATH']}")
    spec = tmp_path / "sleepy.yaml"
    spec.write_text(SPEC.format(artifact=REPO / "examples" / "llm_emulated.py", keep_ms=KEEP_MS))
    g = GalaxyUp(tmp_path / "run", "--nodes", "1")
    g.start()
    try:
        r = g.cli("deploy", "-f", str(spec))
        assert r.returncode == 0, r.stderr
        client = openai.AsyncOpenAI(
            base_url=f"http://{g.endpoints['gateway']}/v1", api_key=g.token, timeout=120
        )

        async def ask(n: int) -> str:
            c = await client.chat.completions.create(
                model="sleepy-llm", messages=[{"role": "user", "content": "hi"}], max_tokens=n
            )
            return c.choices[0].message.content or ""

        # A burst of three scales it out to three instances.
        await asyncio.gather(*(ask(BURST_TOKENS) for _ in range(3)))
        await until("three instances", lambda: len(status(g)) == 3, 30)
        ids = {s["instance"]["instance_id"] for s in status(g)}
        cold = dispatch_metric(g, "galaxy_cold_starts_total")

        # Idle: the scale-in puts two to sleep (max_asleep), one stays awake.
        await until("two asleep", lambda: sum(s.get("asleep", False) for s in status(g)) == 2, 60)
        now = status(g)
        asleep = [s["instance"] for s in now if s.get("asleep")]
        awake = [s["instance"] for s in now if not s.get("asleep")]
        assert len(awake) == 1 and {s["instance"]["instance_id"] for s in now} == ids
        assert dispatch_metric(g, "galaxy_llm_instances_asleep") == 2
        assert dispatch_metric(g, "galaxy_llm_sleeps_total") == 2
        for i in asleep:  # still running, and asleep by its own account
            assert (await engine_state(g, i)) == {
                "asleep": True, "sleeps": 1, "emulated": True
            }  # fmt: skip
        # One request at a time: the awake instance serves, no sleeper is sent one.
        for _ in range(3):
            assert (await ask(2)) == "tok1 tok2"
        for i in asleep:
            assert (await engine_state(g, i))["asleep"] is True

        # The next burst wakes the sleepers before any cold start.
        assert len(await asyncio.gather(*(ask(BURST_TOKENS) for _ in range(3)))) == 3
        assert dispatch_metric(g, "galaxy_llm_wakes_total") == 2
        assert dispatch_metric(g, "galaxy_cold_starts_total") == cold
        assert {s["instance"]["instance_id"] for s in status(g)} == ids
        for i in asleep:
            assert (await engine_state(g, i))["asleep"] is False

        # Idle again: two sleep, then stay asleep past keep_asleep_ms and go.
        await until("asleep again", lambda: dispatch_metric(g, "galaxy_llm_sleeps_total") == 4, 60)
        slept_at = time.monotonic()
        gone = [s["instance"] for s in status(g) if s.get("asleep")]
        assert len(gone) == 2
        await until(
            "the sleepers removed",
            lambda: dispatch_metric(g, "galaxy_llm_instances_asleep") == 0,
            KEEP_MS / 1000 + 30,
        )
        assert time.monotonic() - slept_at >= KEEP_MS / 1000 - 3  # (not removed early)
        left = {s["instance"]["instance_id"] for s in status(g)}
        assert left == ids - {i["instance_id"] for i in gone}
        for i in gone:  # stopped on the node: nothing answers for it
            await until(f"{i['instance_id']} stopped", lambda i=i: _down(g, i), 30)
        assert dispatch_metric(g, "galaxy_cold_starts_total") == cold
        await client.close()
    finally:
        g.stop()


def _down(g: GalaxyUp, instance: dict) -> bool:
    try:
        got = asyncio.run(engine_state(g, instance))
    except (aiohttp.ClientError, AssertionError):
        return True
    return "asleep" not in got


@pytest.fixture
def etcd(tmp_path: Path) -> Iterator[EtcdServer]:
    """An etcd of this test's own: instance records outlive a Dispatch only
    in a shared store (the default one lives in the process)."""
    require_etcd()
    with running_etcd(tmp_path / "etcd") as server:
        yield server


@pytest.mark.etcd
async def test_sleepers_survive_a_dispatch_restart(tmp_path, monkeypatch, etcd) -> None:
    monkeypatch.setenv("PATH", f"{Path(sys.executable).parent}:{os.environ['PATH']}")
    spec = tmp_path / "sleepy.yaml"
    spec.write_text(SPEC.format(artifact=REPO / "examples" / "llm_emulated.py", keep_ms=600_000))
    g = GalaxyUp(tmp_path / "run", "--state", etcd.url, "--nodes", "1")
    g.start()
    try:
        r = g.cli("deploy", "-f", str(spec))
        assert r.returncode == 0, r.stderr
        client = openai.AsyncOpenAI(
            base_url=f"http://{g.endpoints['gateway']}/v1", api_key=g.token, timeout=120
        )

        async def ask(n: int) -> str:
            c = await client.chat.completions.create(
                model="sleepy-llm", messages=[{"role": "user", "content": "hi"}], max_tokens=n
            )
            return c.choices[0].message.content or ""

        await asyncio.gather(*(ask(BURST_TOKENS) for _ in range(3)))
        await until("two asleep", lambda: sum(s.get("asleep", False) for s in status(g)) == 2, 60)
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
        assert len(await asyncio.gather(*(ask(BURST_TOKENS) for _ in range(3)))) == 3
        assert dispatch_metric(g, "galaxy_llm_wakes_total") == 2
        ids = {s["instance"]["instance_id"] for s in status(g)}
        assert {i["instance_id"] for i in asleep} <= ids
        for i in asleep:
            assert (await engine_state(g, i))["asleep"] is False
        await client.close()
    finally:
        g.stop()
