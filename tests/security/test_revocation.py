"""Revocation reaches open streams: a token revoked while an SDK client
keeps its DispatchStream open, and while the gateway holds leases and
streams for it, stops being served on both within the token cache's TTL
(10 s by default; docs/security.md). Before each request on a stream
re-checked the token, both went on for up to the stream's age limit (30 s).
"""

from __future__ import annotations

import asyncio
import json
import subprocess
import time

import pytest

from controlplane.runtime import access
from controlplane.runtime.errors import GalaxyError
from controlplane.sdk.client import GalaxyClient
from tests.integration.test_up import up  # noqa: F401 (the shared `galaxy up` fixture)
from tests.security.test_tokens import echo

pytestmark = [pytest.mark.integration, pytest.mark.slow]

TTL_S = 10.0  # the token cache's default TTL (--token-cache-s)
HOLD_S = 0.2  # the longest a gateway reuses a lease without asking Dispatch
SLACK_S = 2.0  # a loaded machine's delay between a check and our seeing it


def curl(gateway: str, function: str, token: str) -> int:
    out = subprocess.run(
        ["curl", "-s", "-o", "/dev/null", "-w", "%{http_code}", "-m", "5",
         "-H", f"Authorization: Bearer {token}", "-d", "x",
         f"http://{gateway}/functions/{function}"],
        capture_output=True, text=True, timeout=10,
    )  # fmt: skip
    return int(out.stdout or 0)


def test_revoked_token_stops_on_an_open_stream_and_the_gateway(up):  # noqa: F811
    r = up.cli("tokens", "create", "rev", "--role", "developer", "--namespace", "team-r", "--json")
    assert r.returncode == 0, r.stderr
    made = json.loads(r.stdout)
    token = made["token"]
    gateway = up.endpoints["gateway"]

    async def go() -> tuple[float, float]:
        async with GalaxyClient(up.controller, timeout=30, tls=up.tls(), token=token) as c:
            await c.deploy(echo("rev-fn"))
            assert (await c.invoke("rev-fn", b"warm")).status == 200  # opens the stream
            assert await asyncio.to_thread(curl, gateway, "rev-fn", token) == 200
            assert c.streams.enabled
            assert up.cli("tokens", "delete", made["id"]).returncode == 0
            revoked = time.monotonic()
            sdk_at = gw_at = 0.0
            # Requests keep coming on the same client (its stream stays open,
            # as its age limit is 30 s) and through the gateway until both
            # refuse; each round is one request each, no sleeping.
            while (not sdk_at or not gw_at) and time.monotonic() - revoked < 30:
                if not sdk_at:
                    try:
                        await c.invoke("rev-fn", b"x")
                    except GalaxyError as e:
                        assert e.code.name == "UNAUTHENTICATED", e
                        sdk_at = time.monotonic() - revoked
                if not gw_at:
                    code = await asyncio.to_thread(curl, gateway, "rev-fn", token)
                    assert code in (200, 401), code
                    if code == 401:
                        gw_at = time.monotonic() - revoked
            return sdk_at, gw_at

    sdk_at, gw_at = asyncio.run(go())
    print(f"revoked token refused after: SDK stream {sdk_at:.2f} s, gateway {gw_at:.2f} s")
    assert 0 < sdk_at <= TTL_S + SLACK_S
    assert 0 < gw_at <= TTL_S + HOLD_S + SLACK_S
    assert access.parse(token) is not None  # the token was a real one all along
