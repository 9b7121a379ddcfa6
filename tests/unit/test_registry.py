"""Controller membership registry."""

from controlplane.controller.registry import ControlRegistry
from controlplane.runtime.membership import MembershipView
from galaxy.v1 import common_pb2

D = common_pb2.CONTROL_KIND_DISPATCH
S = common_pb2.CONTROL_KIND_SCHEDULE


def ci(kind, i, addr):
    return common_pb2.ControlInstance(id=i, kind=kind, address=addr)


def test_register_is_idempotent_and_bumps_epoch_on_change():
    r = ControlRegistry()
    assert r.register(ci(D, "d0", "h:1"))
    assert not r.register(ci(D, "d0", "h:1"))
    assert r.epoch == 1
    assert r.register(ci(D, "d0", "h:2"))  # restarted elsewhere
    assert r.register(ci(S, "s0", "h:3"))
    m = r.membership()
    assert m.epoch == 3 and [i.id for i in m.instances] == ["d0", "s0"]
    assert r.deregister(D, "d0") and not r.deregister(D, "d0")


def test_membership_view_ignores_older_epochs_and_finds_owners():
    r = ControlRegistry()
    r.register(ci(S, "s0", "h:1"))
    old = r.membership()
    r.register(ci(S, "s1", "h:2"))
    new = r.membership()
    v = MembershipView()
    assert v.update(new)
    assert not v.update(old)
    assert v.ids(S) == ["s0", "s1"]
    owners = {v.owner(S, f"node-{i}").id for i in range(50)}
    assert owners == {"s0", "s1"}
    assert next(x.id for x in v.ranked(S, "node-1")) == v.owner(S, "node-1").id


def test_load_reports_only_for_members():
    r = ControlRegistry()
    assert not r.report(D, "x", {"dispatch": 1.0}, 0, 0)
    r.register(ci(D, "x", "h:1"))
    assert r.report(D, "x", {"dispatch": 5.0}, 3, 0)
    assert r.members(D)[0].ops_per_second == {"dispatch": 5.0}
