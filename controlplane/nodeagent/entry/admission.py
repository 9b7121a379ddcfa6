"""What the door decides about each request of one connection (pure: the
clock is passed in).

A kept connection (a gateway's or an SDK's pool) carries the same lease
token request after request, and checking its HMAC again each time was the
largest part of the door's CPU per request. So each connection remembers the
last token it admitted and until when that token's lease lasts: a request
showing exactly that token before then is admitted without a new HMAC; any
other token (another instance's, a forged one, a later lease) is checked in
full, and one whose lease has ended is refused as ``leasetoken`` refuses it.
A token cannot be revoked before its end (docs/security.md, "The node's
entry"), so remembering it admits nothing a full check would refuse.
"""

from __future__ import annotations

import hmac

from controlplane.runtime.leasetoken import SKEW_MS, LeaseKey, Verdict


class Admission:
    """The verdicts on one connection's requests, for instance_id under key
    (None: every request is admitted)."""

    __slots__ = ("_instance_id", "_key", "_token", "_until_ms")

    def __init__(self, key: LeaseKey | None, instance_id: str) -> None:
        self._key = key
        self._instance_id = instance_id
        self._token = b""
        self._until_ms = -1

    def verdict(self, token: bytes | None, now_ms: int) -> Verdict:
        """The verdict on a request that shows token at now_ms (wall clock)."""
        if self._key is None:
            return Verdict.OK
        if token and now_ms <= self._until_ms and hmac.compare_digest(token, self._token):
            return Verdict.OK
        verdict = self._key.verify(token, self._instance_id, now_ms)
        if verdict is Verdict.OK and token:
            # verify accepted its form: "<expiry_ms>.<mac>", expiry all digits.
            self._token = token
            self._until_ms = int(token.partition(b".")[0]) + SKEW_MS
        return verdict
