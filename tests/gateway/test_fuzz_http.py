"""Random requests through the gateway: never a 500, never a traceback."""

from __future__ import annotations

import logging
import random

import aiohttp
import pytest

from tests.gateway.conftest import Gateway

METHODS = ["GET", "POST", "PUT", "DELETE", "PATCH", "OPTIONS", "HEAD"]
PATHS = ["/", "/v1/chat/completions", "/v1/completions", "/v1/models", "/v1/models/x",
         "/v1/models/x:predict", "/functions/echo/headers", "/v1/models/echo", "/v2",
         "/v2/models/x", "/v2/models/x/ready",
         "/v2/models/x/infer", "/v2/health/ready", "/functions/x", "/functions/",
         "/functions/UPPER", "/%00", "/v2/models/" + "a" * 300]  # fmt: skip
BODIES = [b"", b"{}", b'{"model": "x"}', b'{"model": "echo"}', b'{"model": 1}', b"[" * 5000,
          b"\xff\xfe", b"null",
          b'{"model": "' + b"a" * 70 + b'"}', b"{" * 2000]  # fmt: skip
HEADERS = [{}, {"Authorization": "Bearer sk-x"}, {"Authorization": "Basic x"},
           {"Origin": "http://evil", "Access-Control-Request-Method": "POST"},
           {"Content-Type": "application/json"}, {"Host": "x.galaxy.local"}]  # fmt: skip


@pytest.mark.slow  # hundreds of fuzzed requests through a real gateway: ~2-9 s
async def test_fuzzed_requests_never_get_a_500_or_a_traceback(
    gw: Gateway, caplog: pytest.LogCaptureFixture
) -> None:
    """Random requests against a real control plane (routes to functions
    that exist and not): a status a client can act on, never a 500, and no
    log record with a traceback."""
    rng = random.Random(7)
    gwp = gw
    caplog.set_level(logging.WARNING)
    async with aiohttp.ClientSession() as s:
        for _ in range(300):
            method = rng.choice(METHODS)
            path = rng.choice(PATHS)
            async with s.request(
                method, gwp.url + path, data=rng.choice(BODIES), headers=rng.choice(HEADERS)
            ) as r:
                await r.read()
                assert r.status != 500, (method, path)
    assert not [r for r in caplog.records if r.exc_info], [r.getMessage() for r in caplog.records]
    assert any(r.getMessage().startswith("refused") for r in caplog.records)
