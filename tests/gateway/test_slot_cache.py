"""The gateway's slot cache against a real control plane and real function
processes: a warm function is served without a Dispatch call, an idle held
slot goes back to Dispatch, a slot on an instance that died is not reused,
a change of traffic split never reaches a request through a held slot, and
a held slot serves only the caller (token) it was granted to.

Dispatch's hold time (``FunctionRouter.hold_s``, 50 ms) is raised on the
routers here so that what the tests look at cannot lapse on a slow machine,
and the gateways here keep an idle slot longer than the default for the
same reason (``slot_idle_ms``)."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

import aiohttp
import pytest

from controlplane.gateway import main as gateway
from controlplane.gateway.config import GatewayConfig
from controlplane.gateway.proxy import Proxy
from controlplane.runtime.revisions import routing_key
from galaxy.v1 import common_pb2
from tests.cluster import eventually
from tests.gateway.conftest import Gateway
from tests.gateway.test_revisions import Answer, assert_switched, echo_v, sdk_worker
from tests.instances import instance_pid

Start = Callable[..., Awaitable[tuple[str, Proxy]]]


@pytest.fixture
async def start_gateway(gw: Gateway) -> AsyncIterator[Start]:
    """Starts more gateways on gw's cluster (config fields as keywords)."""
    started: list[tuple[Any, Proxy]] = []

    async def start(require_token: bool = False, **cfg: Any) -> tuple[str, Proxy]:
        conf = GatewayConfig(request_timeout_s=30.0, **cfg)
        runner, proxy, address = await gateway.start(
            conf, gw.cluster.controller, "127.0.0.1", 0, require_token=require_token
        )
        started.append((runner, proxy))
        return f"http://{address}", proxy

    yield start
    for runner, proxy in started:
        await gateway.stop(runner, proxy)


def dispatcher(gw: Gateway) -> Any:
    return gw.cluster.parts["d-0"].component.servicer


def hold_longer(gw: Gateway, function: str, hold_s: float) -> None:
    """Raise Dispatch's hold time on every routed revision of function."""
    d0 = dispatcher(gw)
    routers = [r for n, r in d0.routers.items() if routing_key(n) == function]
    assert routers
    for r in routers:
        r.hold_s = hold_s


def in_flight(gw: Gateway, function: str) -> int:
    d0 = dispatcher(gw)
    return sum(
        i.in_flight
        for n, r in d0.routers.items()
        if routing_key(n) == function
        for i in r.instances.values()
    )


async def post(
    http: aiohttp.ClientSession, url: str, headers: dict[str, str] | None = None
) -> tuple[int, dict[str, Any]]:
    async with http.post(f"{url}/functions/echo", data=b"x", headers=headers) as r:
        body = await r.read()
        return r.status, json.loads(body) if r.status == 200 else {"error": body.decode()}


@pytest.mark.slow
async def test_a_warm_function_is_served_without_a_dispatch_call(
    gw: Gateway, start_gateway: Start
) -> None:
    url, proxy = await start_gateway(slot_idle_ms=1000)
    await gw.client.invoke("echo", b"warm")  # an instance, and the router
    hold_longer(gw, "echo", 30.0)
    d0 = dispatcher(gw)
    async with aiohttp.ClientSession() as http:
        before = d0.ops["dispatch"]
        status, first = await post(http, url)
        assert status == 200 and d0.ops["dispatch"] == before + 1
        for _ in range(3):
            status, again = await post(http, url)
            assert status == 200
            assert again["instance"] == first["instance"]
        # Three more requests, no Dispatch call: the lease was reused.
        assert d0.ops["dispatch"] == before + 1
    assert proxy.slots.enabled


@pytest.mark.slow
async def test_a_function_named_on_an_openai_route_is_served_from_held_slots(
    gw: Gateway, start_gateway: Start
) -> None:
    # The OpenAI routes send Dispatch a routing hint; a function that is not
    # an LLM's gets held slots as on any route (only an LLM's picker must
    # place every request).
    url, _ = await start_gateway(slot_idle_ms=1000)
    await gw.client.invoke("echo", b"warm")
    hold_longer(gw, "echo", 30.0)
    d0 = dispatcher(gw)
    body = {"model": "echo", "messages": [{"role": "user", "content": "hi"}]}
    async with aiohttp.ClientSession() as http:
        before = d0.ops["dispatch"]
        for _ in range(4):
            async with http.post(f"{url}/v1/chat/completions", json=body) as r:
                assert r.status == 200, await r.text()
    assert d0.ops["dispatch"] == before + 1


@pytest.mark.slow
async def test_without_the_cache_every_request_calls_dispatch(
    gw: Gateway, start_gateway: Start
) -> None:
    url, proxy = await start_gateway(slot_cache=False)
    await gw.client.invoke("echo", b"warm")
    hold_longer(gw, "echo", 30.0)
    d0 = dispatcher(gw)
    async with aiohttp.ClientSession() as http:
        before = d0.ops["dispatch"]
        for _ in range(3):
            assert (await post(http, url))[0] == 200
    assert d0.ops["dispatch"] == before + 3
    assert proxy.slots.held == 0


@pytest.mark.slow
async def test_an_idle_held_slot_goes_back_to_dispatch(gw: Gateway, start_gateway: Start) -> None:
    url, proxy = await start_gateway(slot_idle_ms=300)
    await gw.client.invoke("echo", b"warm")
    await eventually(lambda: in_flight(gw, "echo") == 0, 10, "the SDK's slot released")
    hold_longer(gw, "echo", 30.0)
    async with aiohttp.ClientSession() as http:
        assert (await post(http, url))[0] == 200
        # Held after its request: Dispatch still counts it...
        await eventually(lambda: proxy.slots.held == 1, 5, "the slot held")
        assert in_flight(gw, "echo") == 1
        # ...until it has been idle for slot_idle_ms (Dispatch's hold is 30 s).
        await eventually(lambda: in_flight(gw, "echo") == 0, 10, "the idle slot released")
        assert proxy.slots.held == 0


@pytest.mark.slow
async def test_a_held_slot_on_an_instance_that_died_is_not_reused(
    gw: Gateway, start_gateway: Start
) -> None:
    url, proxy = await start_gateway(slot_idle_ms=30_000)
    await gw.client.invoke("echo", b"warm")
    hold_longer(gw, "echo", 30.0)
    async with aiohttp.ClientSession() as http:
        status, first = await post(http, url)
        assert status == 200
        await eventually(lambda: proxy.slots.held == 1, 5, "the slot held")
        os.kill(instance_pid(first["instance"], under=os.getpid()), signal.SIGKILL)
        router = dispatcher(gw).router_of("echo")
        await eventually(
            lambda: first["instance"] not in router.instances, 15, "the dead instance removed"
        )
        assert proxy.slots.held == 1  # still held at the gateway: nothing told it
        status, second = await post(http, url)
        assert status == 200, second
        assert second["instance"] != first["instance"]
    assert proxy.slots.held <= 1  # the dead instance's lease is not kept


@pytest.mark.slow
async def test_a_new_split_never_reaches_a_request_through_a_held_slot(
    gw: Gateway, start_gateway: Start
) -> None:
    """The rollout test's rule with the cache and long holds: once revision
    1 answers after `traffic 1=100` (first to the SDK, which calls Dispatch
    for each request), no request that starts later is answered by
    revision 2, whose slots held by the gateway would otherwise serve for up
    to another second. Revision 1 is kept warm by a tag, so it answers as
    soon as Dispatch applies the change."""
    url, proxy = await start_gateway(slot_idle_ms=1000)
    await gw.client.deploy(echo_v(1))  # revision 2; revision 1 is the fixture's
    T = common_pb2.TrafficTarget
    await gw.client.set_traffic("echo", [T(revision=2, percent=100), T(revision=1, tag="old")])
    assert json.loads((await gw.client.invoke("echo", b"w", tag="old")).body)["revision"] == 1
    answers: list[Answer] = []
    stop = asyncio.Event()

    async def worker() -> None:
        async with aiohttp.ClientSession() as http:
            while not stop.is_set():
                t0 = time.monotonic()
                try:
                    status, body = await post(http, url)
                    rev = body.get("revision", -1)
                    err = "" if status == 200 else str(body)
                    answers.append(Answer(t0, time.monotonic(), rev, err))
                except Exception as e:  # any failure is what the test counts
                    answers.append(Answer(t0, time.monotonic(), -1, repr(e)))

    workers = [asyncio.create_task(worker()) for _ in range(2)]
    # The SDK calls Dispatch per request: it sees each change at once.
    workers.append(asyncio.create_task(sdk_worker(gw, answers, stop)))
    try:
        await eventually(lambda: sum(a.revision == 2 for a in answers) >= 5, 60, "rev 2 serves")
        hold_longer(gw, "echo", 1.0)
        # The gateway's requests use held slots. (Waited for as such: a count
        # of all answers let the SDK's worker, 1-2 ms a request, supply them
        # before the gateway's had a second, under load.)
        hits = proxy.slots.hits
        await eventually(lambda: proxy.slots.hits >= hits + 10, 30, "requests on held slots")
        await gw.client.set_traffic("echo", [T(revision=1, percent=100)])
        await eventually(lambda: sum(a.revision == 1 for a in answers) >= 1, 60, "rev 1 serves")
        n = len(answers)
        await eventually(lambda: len(answers) >= n + 50, 60, "requests after the change")
    finally:
        stop.set()
        await asyncio.gather(*workers)
    assert_switched(answers, 1)


async def test_a_held_slot_serves_only_the_token_it_was_granted_to(
    gw: Gateway, start_gateway: Start
) -> None:
    """The cache is keyed by the caller's token: another token (or none)
    makes its own Dispatch call, which judges it, never riding on a slot
    granted to someone else. (This cluster does not check tokens; what is
    asserted is which requests reach Dispatch.)"""
    url, proxy = await start_gateway(require_token=True, slot_idle_ms=30_000)
    await gw.client.invoke("echo", b"warm")
    hold_longer(gw, "echo", 30.0)
    d0 = dispatcher(gw)
    a = {"Authorization": "Bearer glx_tokenA"}
    b = {"Authorization": "Bearer glx_tokenB"}
    async with aiohttp.ClientSession() as http:
        before = d0.ops["dispatch"]
        assert (await post(http, url, a))[0] == 200
        assert (await post(http, url, a))[0] == 200
        assert d0.ops["dispatch"] == before + 1  # A's second request: A's held slot
        assert (await post(http, url, b))[0] == 200
        assert d0.ops["dispatch"] == before + 2  # B: its own Dispatch call
        assert (await post(http, url))[0] == 200
        assert d0.ops["dispatch"] == before + 3  # no token: its own call too
        assert (await post(http, url, b))[0] == 200
        assert d0.ops["dispatch"] == before + 3  # B's held slot now
    # One held slot per caller: A's, B's and the anonymous one.
    await eventually(lambda: proxy.slots.held == 3, 5, "three held slots")
