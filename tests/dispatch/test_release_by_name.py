"""Release by any client: the lease id names the revision its slot is filed
under, so a Release naming the function (not the revision) frees the slot,
and a lease id that no Dispatch issued gets released=false, never INTERNAL,
on the owner or on an instance that forwards it. (grpcurl, a client we did
not write, does the same through `galaxy up` in tests/integration/test_up_tls.py.)"""

from __future__ import annotations

import grpc
import pytest

from controlplane.runtime import rendezvous
from controlplane.runtime.errors import NotFound
from controlplane.sdk.client import GalaxyClient
from galaxy.v1 import common_pb2, dispatch_pb2, dispatch_pb2_grpc
from tests.cluster import small_cluster
from tests.runtimes import deploy

IDS = ["d-0", "d-1"]


@pytest.fixture
async def cluster():
    c = await small_cluster(dispatch_flags=("--no-autoscale",))
    try:
        await c.add("dispatch", "d-1", "--no-autoscale")  # a second owner, to forward to
        yield c
    finally:
        await c.close()


def owned_by(owner: str, prefix: str) -> str:
    """A function name that rendezvous-hashes to owner."""
    return next(
        f"{prefix}{i}" for i in range(1000) if rendezvous.owner(f"{prefix}{i}", IDS) == owner
    )


async def release(address: str, function: str, lease_id: str) -> dispatch_pb2.ReleaseReply:
    async with grpc.aio.insecure_channel(address) as ch:
        return await dispatch_pb2_grpc.DispatchStub(ch).Release(  # type: ignore[no-any-return]
            dispatch_pb2.ReleaseRequest(function=function, lease_id=lease_id), timeout=10
        )


@pytest.mark.parametrize("via", ["d-0", "d-1"])  # the owner, and an instance that forwards
async def test_release_naming_the_function_frees_the_slot(cluster, via):
    name = owned_by("d-0", "f")
    d0 = cluster.parts["d-0"].component.dispatcher
    async with GalaxyClient(cluster.controller) as c:
        await deploy(c, common_pb2.FunctionSpec(name=name, command=["x"], concurrency=1))
        got = await c.dispatch(name)
        router = d0.router_of(name)
        assert router.name != name  # filed under the revision, released by function name
        assert router.instances[got.instance_id].in_flight == 1
        reply = await release(cluster.parts[via].address, name, got.lease_id)
        assert reply.released
        assert router.instances[got.instance_id].in_flight == 0
        assert not (await release(cluster.parts[via].address, name, got.lease_id)).released


async def test_a_lease_id_no_dispatch_issued_is_refused_cleanly(cluster):
    # "x/y" is not a revision: before, the non-owner forwarded it and the
    # owner's INVALID_ARGUMENT surfaced as INTERNAL with a traceback.
    for bogus_owner in IDS:
        other = next(i for i in IDS if i != bogus_owner)
        for lease in ("dispatch-1:x/y/z", f"{bogus_owner}:{owned_by(bogus_owner, 'g')}/1.abc",
                      "no-colon", "d-0:"):  # fmt: skip
            reply = await release(cluster.parts[other].address, "", lease)
            assert not reply.released, lease


async def test_invoking_a_deleted_function_says_the_function_is_not_found(cluster):
    async with GalaxyClient(cluster.controller) as c:
        await deploy(c, common_pb2.FunctionSpec(name="gone", command=["x"], concurrency=1))
        await c.release(await c.dispatch("gone"))
        await c.delete_function("gone")
        for _ in range(2):  # the first call may still pick the cached revision
            with pytest.raises(NotFound) as e:
                await c.dispatch("gone")
            assert "revision" not in e.value.message, e.value.message
            assert e.value.message.startswith("function 'gone' not found"), e.value.message
