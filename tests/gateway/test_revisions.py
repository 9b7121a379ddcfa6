"""Revisions and traffic with real function processes: a rollout under a
steady stream of requests (SDK and gateway) drops none and sends none to the
old revision once the new one serves; a canary split, a tag through the
gateway header, and a rollback with the `galaxy` CLI."""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
import time
from dataclasses import dataclass

import aiohttp
import pytest

from controlplane.runtime import revisions
from controlplane.runtime import spec as specs
from galaxy.v1 import common_pb2
from tests.cluster import eventually
from tests.gateway.conftest import EXAMPLES, Gateway
from tests.gateway.test_gateway import curl


@dataclass
class Answer:
    started: float
    ended: float
    revision: int
    error: str = ""


def echo_v(n: int) -> common_pb2.FunctionSpec:
    """The echo example, changed so that each n is a different revision."""
    s = specs.load_file(str(EXAMPLES / "echo.yaml"))
    s.env["APP_VERSION"] = str(n)  # the python runtime admits APP_*
    return s


async def sdk_worker(gw: Gateway, out: list[Answer], stop: asyncio.Event) -> None:
    while not stop.is_set():
        t0 = time.monotonic()
        try:
            r = await gw.client.invoke("echo", b"sdk")
            rev = json.loads(r.body)["revision"] if r.status == 200 else -1
            out.append(Answer(t0, time.monotonic(), rev, "" if r.status == 200 else str(r.status)))
        except Exception as e:  # any failure is what the test counts
            out.append(Answer(t0, time.monotonic(), -1, repr(e)))


async def _gateway_worker(gw: Gateway, out: list[Answer], stop: asyncio.Event) -> None:
    async with aiohttp.ClientSession() as http:
        while not stop.is_set():
            t0 = time.monotonic()
            try:
                async with http.post(f"{gw.url}/functions/echo", data=b"gw") as resp:
                    body = await resp.read()
                ok = resp.status == 200
                rev = json.loads(body)["revision"] if ok else -1
                out.append(Answer(t0, time.monotonic(), rev, "" if ok else body.decode()[:200]))
            except Exception as e:
                out.append(Answer(t0, time.monotonic(), -1, repr(e)))


@pytest.mark.slow
async def test_rollout_under_load_drops_nothing_and_leaves_the_old_revision(
    gw: Gateway,
) -> None:
    first = await gw.client.deploy(echo_v(1))
    assert first.revision == 2  # the fixture deployed revision 1 (no VERSION)
    answers: list[Answer] = []
    stop = asyncio.Event()
    workers = [asyncio.create_task(sdk_worker(gw, answers, stop)) for _ in range(2)]
    workers += [asyncio.create_task(_gateway_worker(gw, answers, stop)) for _ in range(2)]
    try:
        await eventually(lambda: sum(a.revision == 2 for a in answers) >= 20, 60, "rev 2 serves")
        n_before = len(answers)
        second = await gw.client.deploy(echo_v(2))
        assert second.revision == 3
        await eventually(lambda: sum(a.revision == 3 for a in answers) >= 1, 60, "rev 3 serves")
        await eventually(lambda: len(answers) >= n_before + 100, 60, "requests after rollout")
    finally:
        stop.set()
        await asyncio.gather(*workers)
    assert_switched(answers, 3)
    # The old revision drains and retires: no instance of echo-00002 remains.
    d0 = gw.cluster.parts["d-0"].component.servicer
    await eventually(
        lambda: revisions.revision_name("echo", 2) not in d0.routers, 30, "old revision retired"
    )


def assert_switched(answers: list[Answer], new: int) -> None:
    """No request failed, and none that started after revision new first
    answered was answered by another revision."""
    failed = [a for a in answers if a.error]
    assert not failed, failed[:3]
    switched = min(a.ended for a in answers if a.revision == new)
    late = [a for a in answers if a.started > switched and a.revision != new]
    assert not late, f"{len(late)} requests answered by another revision after {new} served"


def galaxy(gw: Gateway, *args: str) -> subprocess.CompletedProcess[str]:
    cmd = [sys.executable, "-m", "controlplane.tools.cli", *args]
    return subprocess.run(
        [*cmd, "--controller", gw.cluster.controller], capture_output=True, text=True, timeout=60
    )


@pytest.mark.slow
async def test_canary_split_tag_and_rollback(gw: Gateway) -> None:
    await gw.client.deploy(echo_v(1))  # revision 2; revision 1 is the fixture's
    r = await asyncio.to_thread(galaxy, gw, "traffic", "echo", "1=50", "2=50@canary")
    assert r.returncode == 0, r.stderr
    assert "1=50%" in r.stdout and "2=50%@canary" in r.stdout
    seen = {1: 0, 2: 0}
    for _ in range(200):
        got = await gw.client.invoke("echo", b"x")
        seen[json.loads(got.body)["revision"]] += 1
    # 200 draws at 50%: outside 60..140 has probability < 1e-8.
    assert 60 <= seen[2] <= 140, seen

    # The tag reaches revision 2 through the gateway's header.
    r = await asyncio.to_thread(galaxy, gw, "traffic", "echo", "1=100", "2=0@canary")
    assert r.returncode == 0, r.stderr
    for _ in range(5):
        c = await curl(f"{gw.url}/functions/echo", "-H", "Galaxy-Revision-Tag: canary", "-d", "t")
        assert c.returncode == 0, c.stderr
        assert json.loads(c.stdout)["revision"] == 2
    # The same by Host, as Knative names a tagged revision: {tag}-{name}.{domain}.
    c = await curl(f"{gw.url}/", "-H", "Host: canary-echo.galaxy.local", "-d", "h")
    assert c.returncode == 0, c.stderr
    assert json.loads(c.stdout)["revision"] == 2
    # Untagged requests all go to revision 1 now (the rollback).
    for _ in range(20):
        got = await gw.client.invoke("echo", b"x")
        assert json.loads(got.body)["revision"] == 1
    c = await curl(f"{gw.url}/functions/echo", "-H", "Galaxy-Revision-Tag: nope", "-d", "t")
    assert c.returncode == 0
    assert "nope" in c.stdout  # a clear 404 naming the tag

    listing = await asyncio.to_thread(galaxy, gw, "revisions", "echo")
    assert listing.returncode == 0, listing.stderr
    lines = listing.stdout.splitlines()
    assert lines[1].split()[:3] == ["1", "echo-00001", "100%"], lines
    assert lines[2].split()[:4] == ["2", "echo-00002", "0%", "@canary"], lines


@pytest.mark.slow
async def test_bad_splits_are_refused_naming_the_field(gw: Gateway) -> None:
    for args, field in [
        (["1=60"], "traffic: percents must add up to 100"),
        (["7=100"], "traffic[0].revision"),
        (["1=50@a", "1=50@a"], "traffic[1].tag"),
    ]:
        r = await asyncio.to_thread(galaxy, gw, "traffic", "echo", *args)
        assert r.returncode != 0
        assert field in r.stderr, r.stderr
        assert "Traceback" not in r.stderr
    # A redeploy of the same spec makes no new revision.
    again = await gw.client.deploy(specs.load_file(str(EXAMPLES / "echo.yaml")))
    assert again.revision == 1
