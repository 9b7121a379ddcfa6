"""Grants made with ``tuple.__new__`` are the named tuples ``Grant(...)``
makes; leases are plain (instance_id, expires_at) tuples."""

from controlplane.runtime.clock import ManualClock
from functions.dispatch.policy import FunctionRouter, Grant, Instance


def test_grant_is_the_named_tuple_and_lease_a_plain_tuple():
    r = FunctionRouter("f", 1, 10, ManualClock(5.0), lease_ttl_s=30.0, lease_prefix="d0:")
    r.add_instance(Instance("i1", "addr", "n1", 2))
    g = r.acquire()
    assert type(g) is Grant and g == Grant("d0:f/0", r.instances["i1"], False)
    assert (g.lease_id, g.instance.instance_id, g.cold_start) == ("d0:f/0", "i1", False)
    lease = r.leases[g.lease_id]
    assert type(lease) is tuple and lease == ("i1", 35.0)
    assert r.release(g.lease_id) == (True, [])
