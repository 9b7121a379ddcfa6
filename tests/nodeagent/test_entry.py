"""The node's entry with real sandboxes and a client we did not write (curl):
an instance in its own network namespace is reachable only through its door
on the node's address, and only with a lease token signed for it."""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import socket
import subprocess
import time

import pytest
from prometheus_client import REGISTRY

from controlplane.nodeagent.entry import door, netns
from controlplane.nodeagent.sandbox import BwrapBackend
from controlplane.nodeagent.sandbox.uidpool import UidPool
from controlplane.runtime.leasetoken import SKEW_MS, LeaseKey
from tests.cluster import eventually

from .conftest import echo_spec

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(
        shutil.which("bwrap") is None or shutil.which("curl") is None or not netns.can_enter(),
        reason="needs bubblewrap, curl and a root agent (network namespaces)",
    ),
]


def node_address() -> str:
    """A non-loopback address of this machine when it has one: the entry
    listens where the node is advertised, not on loopback."""
    out = subprocess.run(["hostname", "-I"], capture_output=True, text=True).stdout.split()
    return next((a for a in out if ":" not in a), "127.0.0.1")


def now_ms() -> int:
    return time.time_ns() // 1_000_000


def metrics() -> dict[str, float]:
    """The doors' counters and gauge, as this process exports them."""
    v = REGISTRY.get_sample_value
    out = {r: v("galaxy_entry_refused_total", {"reason": r}) or 0.0 for r in door.REFUSALS}
    out["connections"] = v("galaxy_entry_connections_total") or 0.0
    out["open"] = v("galaxy_entry_open_connections") or 0.0
    return out


def added(before: dict[str, float]) -> dict[str, float]:
    """What changed since before (only what did)."""
    return {k: v - before[k] for k, v in metrics().items() if v != before[k]}


@pytest.fixture(params=["setns", "factory"])
async def entry(request, tmp_path):
    """Two instances behind their doors; the doors reach into the
    namespaces by setns (a root agent) or through the socket factory in the
    sandbox (what an agent that is not root uses)."""
    key = LeaseKey(os.urandom(32))
    b = BwrapBackend(
        log_dir=tmp_path / "logs",
        instance_dir=tmp_path / "inst",
        uid_pool=UidPool(lock_dir=tmp_path / "uids"),
        lease_key=key,
        entry=request.param,
    )
    b.host = node_address()
    a = await b.start("n1", "inst-a", echo_spec("team-a-fn"))
    other = await b.start("n1", "inst-b", echo_spec("team-b-fn"))
    yield key, a, other
    await b.close()


async def curl(address: str, *headers: str) -> tuple[int, str]:
    args = [f"-H{h}" for h in headers]
    p = await asyncio.create_subprocess_exec(
        "curl", "-sS", "-m", "5", "-w", "\n%{http_code}", "--data", "hello", *args,
        f"http://{address}/echo", stdout=subprocess.PIPE,
    )  # fmt: skip
    out, _ = await p.communicate()
    body, _, code = out.decode().rpartition("\n")
    return int(code), body


async def test_only_a_lease_for_this_instance_opens_it(entry):
    key, a, other = entry
    assert not a.address.startswith("127.") or node_address().startswith("127.")
    live = now_ms() + 60_000
    code, body = await curl(a.address)
    assert (code, "Galaxy-Lease" in body) == (401, True), body
    forged = key.sign("inst-a", live)[:-4] + "AAAA"
    assert (await curl(a.address, f"Galaxy-Lease: {forged}"))[0] == 403
    assert (await curl(a.address, "Galaxy-Lease: not-a-token"))[0] == 401
    stranger = LeaseKey(os.urandom(32)).sign("inst-a", live)  # another cluster's key
    assert (await curl(a.address, f"Galaxy-Lease: {stranger}"))[0] == 403
    expired = key.sign("inst-a", now_ms() - SKEW_MS - 1_000)
    code, body = await curl(a.address, f"Galaxy-Lease: {expired}")
    assert (code, "ended" in body) == (401, True), body
    # The other function's instance, on the same node, with its own lease.
    theirs = key.sign(other.instance_id, live)
    assert (await curl(a.address, f"Galaxy-Lease: {theirs}"))[0] == 403
    assert (await curl(other.address, f"Galaxy-Lease: {theirs}"))[0] == 200
    code, body = await curl(a.address, f"Galaxy-Lease: {key.sign('inst-a', live)}")
    assert code == 200 and json.loads(body)["echo"] == "hello", body


async def test_refusals_are_counted_by_reason(entry):
    key, a, _ = entry
    live = now_ms() + 60_000
    before = metrics()
    assert (await curl(a.address))[0] == 401
    assert (await curl(a.address, "Galaxy-Lease: not-a-token"))[0] == 401
    assert (
        await curl(a.address, f"Galaxy-Lease: {key.sign('inst-a', now_ms() - SKEW_MS - 1_000)}")
    )[0] == 401
    assert (await curl(a.address, f"Galaxy-Lease: {key.sign('inst-b', live)}"))[0] == 403
    assert (await curl(a.address, f"Galaxy-Lease: {key.sign('inst-a', live)}"))[0] == 200
    host, port = a.address.rsplit(":", 1)
    reader, writer = await asyncio.open_connection(host, int(port))
    writer.write(b"NOT HTTP AT ALL\r\n\r\n")
    assert (await asyncio.wait_for(reader.read(), 5)).startswith(b"HTTP/1.1 400")
    writer.close()
    # Every connection closed by now on the caller's side; the door's own
    # close may follow by a loop turn.
    await eventually(lambda: metrics()["open"] == before["open"], what="connections closed")
    assert added(before) == {
        "missing": 1, "malformed": 1, "expired": 1, "forged": 1, "bad_request": 1,
        "connections": 6,
    }  # fmt: skip


def _request(token: str) -> bytes:
    return (
        f"POST /echo HTTP/1.1\r\nHost: x\r\nGalaxy-Lease: {token}\r\nContent-Length: 2\r\n\r\nhi"
    ).encode()


async def test_every_request_on_a_kept_connection_is_checked(entry):
    """A connection opened with a good lease does not carry a bad one in."""
    key, a, _ = entry
    host, port = a.address.rsplit(":", 1)
    before = metrics()
    reader, writer = await asyncio.open_connection(host, int(port))
    try:
        writer.write(_request(key.sign("inst-a", now_ms() + 60_000)))
        first = await asyncio.wait_for(reader.readuntil(b"}"), 5)
        assert first.startswith(b"HTTP/1.1 200") or first.startswith(b"HTTP/1.0 200"), first
        assert added(before) == {"connections": 1, "open": 1}
        writer.write(_request(key.sign("inst-b", now_ms() + 60_000)))
        second = await asyncio.wait_for(reader.read(), 5)
        assert second.startswith(b"HTTP/1.1 403"), second
    finally:
        writer.close()


def _listeners(port: int) -> int:
    """Sockets listening on port in this (the host's) network namespace."""
    with open("/proc/net/tcp") as f:
        rows = [line.split() for line in f.read().splitlines()[1:]]
    return sum(1 for r in rows if r[3] == "0A" and int(r[1].split(":")[1], 16) == port)


async def test_the_instance_does_not_listen_on_the_node(entry):
    """Only the door is on the node's address; the instance itself is in
    its own namespace (its port there is not the node's)."""
    _, a, _ = entry
    assert _listeners(a.port) == 1
    await a.entry.close()  # the door alone closes the way in
    with pytest.raises(OSError):
        socket.create_connection((a.host, a.port), timeout=2).close()


async def test_connections_the_caller_ends_are_closed_at_the_door(entry):
    """A caller's close (curl's, after its answer) and a caller that ends
    its side right after its request (it still gets the whole answer) leave
    nothing open at the door: both directions ended, both sockets close."""
    key, a, _ = entry
    live = now_ms() + 60_000
    for _ in range(3):
        assert (await curl(a.address, f"Galaxy-Lease: {key.sign('inst-a', live)}"))[0] == 200
    host, port = a.address.rsplit(":", 1)
    reader, writer = await asyncio.open_connection(host, int(port))
    # Request and end at once: the end may come before the door has its
    # connection into the instance; it goes on after the request.
    writer.write(_request(key.sign("inst-a", live)))
    writer.write_eof()
    answer = await asyncio.wait_for(reader.read(), 5)
    writer.close()
    assert answer.startswith(b"HTTP/1.") and b" 200 " in answer.split(b"\r\n")[0], answer
    assert json.loads(answer.partition(b"\r\n\r\n")[2])["echo"] == "hi"
    await eventually(lambda: not a.entry.clients, what="the door's connections closed")
