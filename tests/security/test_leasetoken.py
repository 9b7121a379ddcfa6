"""Lease tokens (controlplane/runtime/leasetoken.py): what the node's entry
accepts and why it refuses the rest; the key file galaxy certs makes."""

from __future__ import annotations

import os
import stat

import pytest

from controlplane.runtime import leasetoken, tls
from controlplane.runtime.leasetoken import SKEW_MS, LeaseKey, Verdict

NOW = 1_800_000_000_000
KEY = LeaseKey(b"k" * 32)


def test_a_token_opens_its_instance_until_its_end():
    token = KEY.sign("i-1", NOW + 1_000)
    assert KEY.verify(token, "i-1", NOW) is Verdict.OK
    assert KEY.verify(token.encode(), "i-1", NOW + 1_000 + SKEW_MS) is Verdict.OK
    assert KEY.verify(token, "i-1", NOW + 1_001 + SKEW_MS) is Verdict.EXPIRED


@pytest.mark.parametrize(
    "token, verdict",
    [
        (None, Verdict.MISSING),
        ("", Verdict.MISSING),
        ("garbage", Verdict.MALFORMED),
        ("x" * 5000, Verdict.MALFORMED),
        ("123.short", Verdict.MALFORMED),
        ("-5." + "A" * 22, Verdict.MALFORMED),
        ("1" * 17 + "." + "A" * 22, Verdict.MALFORMED),
        ("99999999999999." + "A" * 22, Verdict.FORGED),
    ],
)
def test_what_is_not_a_granted_token_is_refused(token, verdict):
    assert KEY.verify(token, "i-1", NOW) is verdict
    assert verdict.status in (401, 403)


def test_a_token_is_bound_to_its_instance_end_and_key():
    token = KEY.sign("i-1", NOW + 60_000)
    assert KEY.verify(token, "i-2", NOW) is Verdict.FORGED
    later = str(NOW + 3_600_000) + token[token.index(".") :]
    assert KEY.verify(later, "i-1", NOW) is Verdict.FORGED  # a longer life is not for the taking
    assert LeaseKey(b"z" * 32).verify(token, "i-1", NOW) is Verdict.FORGED
    assert Verdict.FORGED.status == 403 and Verdict.MISSING.status == 401


def test_a_short_key_is_refused_naming_the_file():
    with pytest.raises(ValueError, match=r"lease\.key"):
        LeaseKey(b"short")


def test_certs_make_a_private_lease_key_once(tmp_path):
    tls.ensure(tmp_path, identities=["dispatch"], hosts=["127.0.0.1"])
    path = leasetoken.key_path(tmp_path)
    assert stat.S_IMODE(os.stat(path).st_mode) == 0o600
    first = path.read_bytes()
    assert len(first) == leasetoken.KEY_BYTES
    tls.ensure(tmp_path, identities=["dispatch"], hosts=["127.0.0.1"])
    assert path.read_bytes() == first
    key = leasetoken.load(tmp_path)
    assert key is not None and key.verify(key.sign("i", NOW), "i", NOW) is Verdict.OK
    assert leasetoken.load(None) is None
    assert leasetoken.load(tmp_path / "absent") is None
