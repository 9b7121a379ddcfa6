"""Every Controller RPC runs on the leader: one decorator, on every method
the service defines (a new method without it fails here)."""

from __future__ import annotations

from controlplane.controller.service import ControllerServicer
from galaxy.v1 import controller_pb2

#: Methods any controller answers itself, and why.
EXEMPT = {
    # Reads the shared store: Dispatch must verify tokens during an election too.
    "LookupToken": "any controller",
}


def test_every_rpc_is_forwarded_to_the_leader() -> None:
    methods = controller_pb2.DESCRIPTOR.services_by_name["Controller"].methods_by_name
    assert methods, "no Controller methods found"
    missing = [
        name
        for name in methods
        if getattr(getattr(ControllerServicer, name), "__wrapped__", None) is None
        and name not in EXEMPT
    ]
    assert missing == []
    for name in EXEMPT:
        assert getattr(getattr(ControllerServicer, name), "__wrapped__", None) is None
