"""The token authenticator's cache around a lookup (controlplane.runtime.authn)."""

from __future__ import annotations

import asyncio

import pytest

from controlplane.runtime import access
from controlplane.runtime.access import Refusal
from controlplane.runtime.authn import Authenticator
from controlplane.runtime.clock import ManualClock


def make(records: dict[str, access.TokenRecord], calls: list[str], fail: list[bool]):
    clock = ManualClock()

    async def lookup(tid: str) -> access.TokenRecord | None:
        calls.append(tid)
        await asyncio.sleep(0)  # a real lookup yields: concurrent callers overlap
        if fail[0]:
            raise ConnectionError("controller down")
        return records.get(tid)

    return Authenticator(lookup, access.TokenCache(ttl_s=10.0), clock, max_stale_s=60.0), clock


async def test_one_lookup_per_ttl_a_miss_included_and_concurrent_calls_share_it() -> None:
    token, rec = access.new_token("ci", access.DEVELOPER, "team-a")
    calls: list[str] = []
    auth, clock = make({rec.id: rec}, calls, [False])
    got = await asyncio.gather(*(auth.principal(f"Bearer {token}") for _ in range(5)))
    assert all(p == rec.principal() for p in got) and calls == [rec.id]
    unknown = "glx_" + "0" * 16 + "_abc"
    assert isinstance(await auth.principal(f"Bearer {unknown}"), Refusal)
    assert isinstance(await auth.principal(f"Bearer {unknown}"), Refusal)
    assert calls == [rec.id, "0" * 16]  # the miss is cached too
    clock.advance(10.0)
    assert await auth.principal(f"Bearer {token}") == rec.principal()
    assert calls[-1] == rec.id and len(calls) == 3


async def test_a_wrong_secret_is_refused_without_saying_which_part_was_wrong() -> None:
    token, rec = access.new_token("ci", access.DEVELOPER, "team-a")
    auth, _ = make({rec.id: rec}, [], [False])
    got = await auth.principal(f"Bearer {token[:-1]}{'0' if token[-1] != '0' else '1'}")
    assert isinstance(got, Refusal) and got.code == "UNAUTHENTICATED"
    assert token.split("_")[2] not in got.message
    assert await auth.principal(None) is None  # no token: the caller decides
    assert isinstance(await auth.principal("Basic dXNlcjpwdw=="), Refusal)


async def test_a_known_token_outlives_a_controller_outage_an_unknown_one_does_not() -> None:
    token, rec = access.new_token("ci", access.INVOKER, "team-a")
    calls: list[str] = []
    fail = [False]
    auth, clock = make({rec.id: rec}, calls, fail)
    assert await auth.principal(f"Bearer {token}") == rec.principal()
    fail[0] = True
    clock.advance(30.0)  # past the TTL, within max_stale_s: still served
    assert await auth.principal(f"Bearer {token}") == rec.principal()
    n = len(calls)
    clock.advance(0.5)  # asked again at most once a second meanwhile
    assert await auth.principal(f"Bearer {token}") == rec.principal() and len(calls) == n
    clock.advance(0.6)
    assert await auth.principal(f"Bearer {token}") == rec.principal() and len(calls) == n + 1
    clock.advance(40.0)  # 71 s after the last good lookup: no longer
    with pytest.raises(ConnectionError):
        await auth.principal(f"Bearer {token}")
    other, _ = access.new_token("x", access.INVOKER, "team-a")
    with pytest.raises(ConnectionError):
        await auth.principal(f"Bearer {other}")


class _Ctx:
    def __init__(self, md: tuple[tuple[str, str], ...]) -> None:
        self.md = md

    def invocation_metadata(self) -> tuple[tuple[str, str], ...]:
        return self.md


def test_a_forwarded_call_carries_the_callers_rights_never_the_forwarders() -> None:
    from controlplane.runtime import authn

    token, rec = access.new_token("ci", access.INVOKER, "team-a")
    bearer = (("authorization", f"Bearer {token}"),)

    def forwarded(who: access.Principal, md: tuple[tuple[str, str], ...]) -> object:
        reset = authn._current.set(who)
        try:
            return authn.forwarded_metadata(_Ctx(md))
        finally:
            authn._current.reset(reset)

    assert forwarded(rec.principal(), bearer) == bearer
    # A caller without a token stays anonymous at the next instance, marked
    # or not when it came (a client certificate alone is no token).
    anon = (("galaxy-anonymous", "1"),)
    assert forwarded(access.caller("client/alice", None), ()) == anon
    assert forwarded(access.caller("gateway", None, anonymous=True), anon) == anon
    # A component's own call: nothing to pass on.
    assert forwarded(access.caller("controller", None), ()) is None
