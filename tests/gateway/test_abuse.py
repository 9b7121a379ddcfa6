"""The gateway holds under abuse: slow clients, too many connections, big
anonymous uploads, deeply nested JSON, random requests. Each refusal is a
clear status (never a 500) and one log line without a traceback."""

from __future__ import annotations

import asyncio
import os
import resource
import time
from collections.abc import Iterator
from pathlib import Path

import aiohttp
import pytest

from tests.gateway.gateway_proc import GatewayProc, gateway_proc


@pytest.fixture
def gwp(tmp_path: Path) -> Iterator[GatewayProc]:
    with gateway_proc(
        tmp_path, "--header-timeout-s", "1", "--max-connections", "200",
    ) as g:  # fmt: skip
        yield g


def _split(address: str) -> tuple[str, int]:
    host, port = address.rsplit(":", 1)
    return host, int(port)


async def test_nested_json_is_a_400_not_a_recursion_error(gwp: GatewayProc) -> None:
    async with aiohttp.ClientSession() as s:
        async with s.post(f"{gwp.url}/v1/chat/completions", data=b"[" * 100_000) as r:
            assert r.status == 400
            body = await r.json()
    assert "nested deeper than 1024" in body["error"]["message"]
    log = gwp.log_text()
    assert "Traceback" not in log and "RecursionError" not in log
    assert "refused route" in log  # one line for it


async def test_slow_heads_are_closed_and_health_checks_answered(gwp: GatewayProc) -> None:
    """Connections that trickle a request head are closed by the head
    deadline (1 s here); health checks are answered meanwhile."""
    host, port = _split(gwp.address)
    slow = [await asyncio.open_connection(host, port) for _ in range(150)]
    for _, w in slow:
        w.write(b"GET /healthz HTTP/1.1\r\nHost: x\r\n")  # never finished
    async with aiohttp.ClientSession() as s:
        async with s.get(f"{gwp.url}/healthz", timeout=aiohttp.ClientTimeout(total=10)) as r:
            assert r.status == 200
    # Each slow connection is closed by the gateway (EOF), none answered.
    reads = await asyncio.wait_for(asyncio.gather(*(r.read() for r, _ in slow)), 30)
    assert all(data == b"" for data in reads)
    for _, w in slow:
        w.close()
    assert "refused header_timeout" in gwp.log_text()


@pytest.mark.skipif(
    "GALAXY_SLOW_CLIENTS" not in os.environ,
    reason="a measurement: GALAXY_SLOW_CLIENTS=20000 pytest -s -k many_slow",
)
async def test_many_slow_clients_leave_health_checks_answered(tmp_path: Path) -> None:
    """GALAXY_SLOW_CLIENTS connections each send half a request head and
    stay (head deadline 300 s here); then health checks and a routed
    request are timed. Prints the figures; asserts only that they were
    answered (the goal, within 1 s, is reported, not a pass/fail unit)."""
    n = int(os.environ["GALAXY_SLOW_CLIENTS"])
    _, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
    flags = ("--max-connections", str(n + 100), "--header-timeout-s", "300")
    with gateway_proc(tmp_path, *flags) as gwp:
        host, port = _split(gwp.address)
        slow = []
        for _ in range(n):
            _, w = await asyncio.open_connection(host, port)
            w.write(b"POST /functions/echo HTTP/1.1\r\nHost: x\r\n")
            slow.append(w)
        times: list[float] = []
        async with aiohttp.ClientSession() as s:
            for path in ["/healthz"] * 20 + ["/v2/health/live"] * 10 + ["/functions/NOPE"] * 10:
                t0 = time.perf_counter()
                async with s.get(gwp.url + path) as resp:
                    await resp.read()
                    assert resp.status in (200, 404)
                times.append(time.perf_counter() - t0)
        times.sort()
        print(f"{n} slow connections: p50 {times[len(times) // 2] * 1000:.1f} ms, "
              f"max {times[-1] * 1000:.1f} ms over {len(times)} requests")  # fmt: skip
        for w in slow:
            w.close()


async def test_connections_beyond_the_bound_get_a_503(gwp: GatewayProc) -> None:
    host, port = _split(gwp.address)
    held = [await asyncio.open_connection(host, port) for _ in range(200)]
    try:
        r, w = await asyncio.open_connection(host, port)
        answer = await asyncio.wait_for(r.read(), 10)
        w.close()
        assert answer.startswith(b"HTTP/1.1 503") and b"too many connections" in answer
    finally:
        for _, w in held:
            w.close()


@pytest.mark.slow
async def test_big_anonymous_uploads_stay_within_the_upload_budget(tmp_path: Path) -> None:
    """32 anonymous uploads of 8 MiB at once with a 32 MiB budget: those
    beyond it get a 503 before their body is read, and the gateway's peak
    memory grows by at most the budget + 10%."""
    budget, size, n = 32 << 20, 8 << 20, 32
    body = b"x" * size
    with gateway_proc(tmp_path, "--max-upload-bytes", str(budget)) as gwp:
        async with aiohttp.ClientSession() as s:  # first requests import what they need
            for _ in range(3):
                async with s.post(f"{gwp.url}/v1/chat/completions", data=body[:100_000]) as r:
                    assert r.status == 400
        before = gwp.peak_rss()

        async def upload(s: aiohttp.ClientSession) -> int:
            try:
                async with s.post(f"{gwp.url}/v1/chat/completions", data=body) as r:
                    return r.status
            except aiohttp.ClientError:
                return 0  # closed while sending: refused before the body was read

        async with aiohttp.ClientSession() as s:
            statuses = await asyncio.gather(*(upload(s) for _ in range(n)))
        assert 503 in statuses or 0 in statuses
        assert set(statuses) <= {0, 400, 503}
        grown = gwp.peak_rss() - before
        print(f"peak RSS grew by {grown / 2**20:.1f} MiB (budget {budget >> 20} MiB)")
        assert grown <= budget * 1.1
        assert "Traceback" not in gwp.log_text()
