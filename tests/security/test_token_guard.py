"""authn.TokenGuard: the check a stream makes before each request it
carries, against a real Authenticator and TokenCache with a manual clock
(the lookup is a dict standing in for the controller's records)."""

from __future__ import annotations

from controlplane.runtime import access, authn
from controlplane.runtime.access import TokenRecord
from controlplane.runtime.clock import ManualClock


def setup(ttl_s: float = 10.0):
    token, record = access.new_token("t", "developer", "team-a")
    records: dict[str, TokenRecord] = {record.id: record}
    lookups: list[str] = []

    async def lookup(tid: str) -> TokenRecord | None:
        lookups.append(tid)
        return records.get(tid)

    clock = ManualClock()
    auth = authn.Authenticator(lookup, access.TokenCache(ttl_s=ttl_s), clock)
    tid, secret = access.parse(token) or ("", "")
    return authn.TokenGuard(auth, tid, secret), records, lookups, clock, tid


async def test_a_revoked_token_is_refused_once_its_cache_entry_expires():
    guard, records, lookups, clock, tid = setup(ttl_s=10.0)
    assert await guard.check() is None
    assert lookups == [tid]
    del records[tid]  # revoked at t=0
    clock.advance(9.9)
    assert await guard.check() is None  # the cached record, still fresh
    assert lookups == [tid]
    clock.advance(0.1)  # the TTL: looked up again, and refused
    refusal = await guard.check()
    assert refusal is not None and refusal.code == "UNAUTHENTICATED"
    assert tid in refusal.message
    assert lookups == [tid, tid]


async def test_a_wrong_secret_is_refused_even_with_a_fresh_entry():
    guard, _records, _lookups, _clock, tid = setup()
    assert await guard.check() is None
    bad = authn.TokenGuard(guard.authenticator, tid, "0" * len(guard.secret))
    assert (await bad.check()) is not None
