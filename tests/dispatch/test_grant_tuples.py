"""Grants and leases made with ``tuple.__new__`` are the named tuples
``Grant(...)`` and ``_Lease(...)`` make."""

from controlplane.clock import ManualClock
from functions.dispatch.policy import FunctionRouter, Grant, Instance, _Lease


def test_grant_and_lease_are_the_named_tuples():
    r = FunctionRouter("f", 1, 10, ManualClock(5.0), lease_ttl_s=30.0, lease_prefix="d0:")
    r.add_instance(Instance("i1", "addr", "n1", 2))
    g = r.acquire()
    assert type(g) is Grant and g == Grant("d0:f/0", r.instances["i1"], False)
    assert (g.lease_id, g.instance.instance_id, g.cold_start) == ("d0:f/0", "i1", False)
    lease = r.leases[g.lease_id]
    assert type(lease) is _Lease and lease == _Lease("i1", 35.0)
    assert (lease.instance_id, lease.expires_at) == ("i1", 35.0)
    assert r.release(g.lease_id) == (True, [])
