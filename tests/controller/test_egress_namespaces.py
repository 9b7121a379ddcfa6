"""Which tenants may ask for egress (controller ``--egress-namespaces``):
a deploy of a function with ``egress: true`` outside them is refused with
PERMISSION_DENIED naming the field and the flag, and nothing is stored;
every namespace may by default; the flag names a bad namespace at start."""

from __future__ import annotations

import pytest

from controlplane.controller.config import ControllerConfig
from controlplane.controller.functions_store import FunctionStore
from controlplane.runtime.errors import PermissionDenied
from galaxy.v1 import common_pb2
from statestore.memory import MemoryStore


def fn(name: str, ns: str, egress: bool) -> common_pb2.FunctionSpec:
    return common_pb2.FunctionSpec(name=name, namespace=ns, command=["x"], egress=egress)


async def test_only_the_named_namespaces_may_ask_for_egress() -> None:
    store = FunctionStore(MemoryStore(), egress_namespaces=frozenset({"team-a"}))
    await store.deploy(fn("out-a", "team-a", egress=True))
    with pytest.raises(PermissionDenied) as e:
        await store.deploy(fn("out-b", "team-b", egress=True))
    assert e.value.message.startswith("egress: functions of namespace team-b may not")
    assert "--egress-namespaces" in e.value.message
    await store.deploy(fn("in-b", "team-b", egress=False))  # without egress: as before
    # Redeploying team-b's function with egress is refused too, and leaves
    # its stored revision as it was.
    with pytest.raises(PermissionDenied):
        await store.deploy(fn("in-b", "team-b", egress=True))
    stored = {f.name: (f.egress, f.revision) for f in await store.list()}
    assert stored == {"out-a": (True, 1), "in-b": (False, 1)}


async def test_every_namespace_may_by_default_and_none_with_an_empty_list() -> None:
    assert ControllerConfig().egress_allowed() == {"*"}
    await FunctionStore(MemoryStore()).deploy(fn("out", "anyone", egress=True))
    none = FunctionStore(
        MemoryStore(), egress_namespaces=ControllerConfig(egress_namespaces="").egress_allowed()
    )
    with pytest.raises(PermissionDenied):
        await none.deploy(fn("out", "default", egress=True))


def test_a_bad_namespace_in_the_flag_is_named() -> None:
    with pytest.raises(ValueError, match="'Team_A' is not a namespace name"):
        ControllerConfig(egress_namespaces="team-b, Team_A")
    assert ControllerConfig(egress_namespaces="team-b, team-c").egress_allowed() == {
        "team-b",
        "team-c",
    }
