"""Idempotent Dispatch in the policy: a request id keeps its grant while the
lease lives, and the memory of ids is bounded."""

from __future__ import annotations

from controlplane.runtime.clock import ManualClock
from functions.dispatch import policy
from functions.dispatch.policy import FunctionRouter, Instance


def _router() -> tuple[FunctionRouter, ManualClock]:
    clock = ManualClock()
    r = FunctionRouter("f", 2, 1, clock, lease_ttl_s=10.0)
    r.add_instance(Instance("i0", "10.0.0.1:9000", "n0", 2))
    return r, clock


def test_a_request_id_keeps_its_grant_until_the_lease_ends() -> None:
    r, clock = _router()
    g = r.acquire()
    assert g is not None
    r.remember("req-1", g)
    assert r.granted_for("req-1") == g
    assert r.granted_for("req-2") is None and r.granted_for("") is None
    r.release(g.lease_id)
    assert r.granted_for("req-1") is None  # released: a new request from now on
    g2 = r.acquire()
    assert g2 is not None
    r.remember("req-3", g2)
    clock.advance(11.0)
    r.expire_leases()
    assert r.granted_for("req-3") is None  # expired with its lease


def test_the_memory_of_request_ids_is_bounded(monkeypatch) -> None:  # type: ignore[no-untyped-def]
    monkeypatch.setattr(policy, "REQUEST_IDS_MAX", 3)
    r, _ = _router()
    g = r.acquire()
    assert g is not None
    for i in range(5):
        r.remember(f"req-{i}", g)
    assert r.granted_for("req-0") is None and r.granted_for("req-1") is None
    assert r.granted_for("req-4") == g


def test_a_release_forgets_its_request_at_once() -> None:
    # Every warm request is remembered; kept until the bound pushed it out,
    # its grant lived on in the heap that full garbage collections walk.
    r, _ = _router()
    for i in range(100):
        g = r.acquire()
        assert g is not None
        r.remember(f"req-{i}", g)
        r.release(g.lease_id)
    assert len(r._by_request) == 0 and len(r._request_of) == 0
    g = r.acquire()
    assert g is not None
    r.remember("req-kept", g)
    r.remove_instance("i0")  # its leases go, and their requests with them
    assert len(r._by_request) == 0 and r.granted_for("req-kept") is None
