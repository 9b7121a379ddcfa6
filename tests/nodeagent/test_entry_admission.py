"""A connection's admission (controlplane/nodeagent/entry/admission.py): a
token admitted once is admitted again without a new HMAC until its lease
ends, and every other token is checked in full."""

from __future__ import annotations

import os

from controlplane.nodeagent.entry.admission import Admission
from controlplane.runtime.leasetoken import SKEW_MS, LeaseKey, Verdict

NOW = 1_800_000_000_000
END = NOW + 60_000


class CountingKey(LeaseKey):
    """A real lease key that counts its full checks."""

    verified = 0

    def verify(self, token: str | bytes | None, instance_id: str, now_ms: int) -> Verdict:
        self.verified += 1
        return super().verify(token, instance_id, now_ms)


def _setup() -> tuple[CountingKey, Admission, bytes]:
    key = CountingKey(os.urandom(32))
    return key, Admission(key, "inst-a"), key.sign("inst-a", END).encode()


def test_a_kept_token_is_checked_once_per_lease() -> None:
    key, adm, token = _setup()
    for i in range(5):
        assert adm.verdict(token, NOW + i) is Verdict.OK
    assert key.verified == 1


def test_a_kept_token_is_refused_once_its_lease_has_ended() -> None:
    _key, adm, token = _setup()
    assert adm.verdict(token, NOW) is Verdict.OK
    assert adm.verdict(token, END + SKEW_MS) is Verdict.OK  # the last admitted moment
    assert adm.verdict(token, END + SKEW_MS + 1) is Verdict.EXPIRED
    assert adm.verdict(token, END + SKEW_MS + 2) is Verdict.EXPIRED


def test_any_other_token_after_an_admitted_one_is_checked_in_full() -> None:
    key, adm, token = _setup()
    assert adm.verdict(token, NOW) is Verdict.OK
    theirs = key.sign("inst-b", END).encode()
    assert adm.verdict(theirs, NOW) is Verdict.FORGED
    forged = token[:-4] + b"AAAA"
    assert adm.verdict(forged, NOW) is Verdict.FORGED
    stranger = LeaseKey(os.urandom(32)).sign("inst-a", END).encode()
    assert adm.verdict(stranger, NOW) is Verdict.FORGED
    # Same MAC, a later end claimed: the MAC binds the end, so it is forged.
    stretched = str(END + 3_600_000).encode() + token[token.index(b".") :]
    assert adm.verdict(stretched, NOW) is Verdict.FORGED
    assert adm.verdict(None, NOW) is Verdict.MISSING
    assert adm.verdict(b"", NOW) is Verdict.MISSING
    assert adm.verdict(b"not-a-token", NOW) is Verdict.MALFORMED
    # Refusals do not displace the admitted token.
    assert adm.verdict(token, NOW) is Verdict.OK
    assert key.verified == 8


def test_a_new_lease_on_the_connection_replaces_the_kept_one() -> None:
    key, adm, token = _setup()
    assert adm.verdict(token, NOW) is Verdict.OK
    later = key.sign("inst-a", END + 60_000).encode()
    assert adm.verdict(later, END + SKEW_MS + 1) is Verdict.OK
    assert adm.verdict(later, END + SKEW_MS + 2) is Verdict.OK
    assert adm.verdict(token, END + SKEW_MS + 2) is Verdict.EXPIRED
    assert key.verified == 3


def test_a_token_refused_before_is_never_kept() -> None:
    key, adm, _token = _setup()
    expired = key.sign("inst-a", NOW - SKEW_MS - 1).encode()
    assert adm.verdict(expired, NOW) is Verdict.EXPIRED
    assert adm.verdict(expired, NOW) is Verdict.EXPIRED
    assert key.verified == 2


def test_without_a_key_every_request_is_admitted() -> None:
    adm = Admission(None, "inst-a")
    assert adm.verdict(None, NOW) is Verdict.OK
    assert adm.verdict(b"anything", NOW) is Verdict.OK
