"""Grants made with ``tuple.__new__`` are the named tuples ``Grant(...)``
makes; leases are plain (instance_id, expires_at) tuples."""

from controlplane.runtime.clock import ManualClock
from functions.dispatch.policy import FunctionRouter, Grant, Instance


def test_grant_is_the_named_tuple_and_lease_a_plain_tuple():
    r = FunctionRouter(
        "f", 1, 10, ManualClock(5.0), lease_ttl_s=30.0, lease_prefix="d0:", lease_nonce=lambda: "n"
    )
    r.add_instance(Instance("i1", "addr", "n1", 2))
    g = r.acquire()
    assert type(g) is Grant and g == Grant("d0:f/0.n", r.instances["i1"], False)
    assert (g.lease_id, g.instance.instance_id, g.cold_start) == ("d0:f/0.n", "i1", False)
    lease = r.leases[g.lease_id]
    assert type(lease) is tuple and lease == ("i1", 35.0)
    assert r.release(g.lease_id) == (True, [])


def test_lease_ids_are_unguessable():
    """Release needs only the lease id, so a lease id must not be derivable
    from another one (docs/security.md, tokens)."""
    r = FunctionRouter("f", 1, 10, ManualClock(5.0), lease_prefix="d0:")
    r.add_instance(Instance("i1", "addr", "n1", 2))
    a, b = r.acquire(), r.acquire()
    assert a is not None and b is not None
    nonce_a, nonce_b = a.lease_id.rsplit(".", 1)[1], b.lease_id.rsplit(".", 1)[1]
    assert len(nonce_a) == 16 and nonce_a != nonce_b
