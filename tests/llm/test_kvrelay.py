"""The node's KV relay: its decisions (``KvRoutes``, pure, a manual clock)
and the relay itself on real sockets: a cache sent with ``kvsend`` through
a relay socket lands intact in a real ``kvshm`` receiver (same node) or a
real HTTP receiver (another node's entry), and every refusal names why."""

from __future__ import annotations

import asyncio
import errno
import json
import os
import socket
import uuid
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
from aiohttp import web

from controlplane.llm import kvsend, kvshm, kvwire
from controlplane.nodeagent.entry.kvrelay import MAX_CONNECTIONS, KvRelay
from controlplane.nodeagent.entry.kvroute import KvRoutes, Member, Refused
from controlplane.runtime import kvaddr, kvmove
from controlplane.runtime.leasetoken import LeaseKey

KEY = LeaseKey(b"k" * 32)
NOW = 1_000_000


def routes(**kw: object) -> KvRoutes:
    r = KvRoutes(KEY, (10_000, 30_000), lambda: NOW, **kw)  # type: ignore[arg-type]
    r.join(Member("pre-1", "team", "pre", "", "10.0.0.1:11000"))
    r.join(Member("dec-1", "team", "dec", "pre", "10.0.0.1:11001"))
    r.join(Member("rival-1", "rival", "pre", "", "10.0.0.1:11002"))
    r.join(Member("other-1", "team", "other", "", "10.0.0.1:11003"))
    return r


def head(target: str, lease: str = "", **kw: object) -> bytes:
    doc = {"kv_id": "kv1", "tokens": 3, "size": 100, "target": target, "lease": lease, **kw}
    return json.dumps(doc).encode()


def lease(instance: str) -> str:
    return KEY.sign(instance, NOW + 60_000)


SHM = kvaddr.shm_target("dec-1")


def test_only_the_paired_prefill_function_of_the_same_namespace_sends_to_a_decode() -> None:
    r = routes()
    t = r.admit("pre-1", head(SHM, lease("dec-1")))
    assert t.local is not None and t.local.instance_id == "dec-1" and t.header()["size"] == 100
    r.done(t)
    for sender in ("rival-1", "other-1"):  # another tenant; same tenant, not the pool
        with pytest.raises(Refused, match="does not take caches from yours") as e:
            r.admit(sender, head(SHM, lease("dec-1")))
        assert e.value.status == 403
    with pytest.raises(Refused, match="not an instance of this node"):
        r.admit("stranger", head(SHM, lease("dec-1")))
    with pytest.raises(Refused, match="no such instance"):
        r.admit("pre-1", head(kvaddr.shm_target("gone"), lease("gone")))
    assert (r.in_flight, r.held) == (0, 0)


def test_the_lease_must_be_the_decode_instances_and_current() -> None:
    r = routes()
    for bad, status in (("", 401), (lease("pre-1"), 403), (KEY.sign("dec-1", NOW - 10_000), 401)):
        with pytest.raises(Refused, match="lease") as e:
            r.admit("pre-1", head(SHM, bad))
        assert e.value.status == status


def test_another_node_only_on_an_entry_port_with_the_instances_lease() -> None:
    r = routes()
    target = "http://10.0.0.2:12000"
    t = r.admit("pre-1", head(target, lease("dec-9"), instance="dec-9"))
    assert t.url == f"{target}/v1/kv/kv1" and t.local is None
    r.done(t)
    cases = [
        (head(target, lease("dec-9")), "instance"),  # no instance: nothing to check the lease on
        (head(target, lease("dec-8"), instance="dec-9"), "lease"),
        (head("http://10.0.0.2:2379", lease("x"), instance="x"), "not an instance's entry"),
        (head("http://10.0.0.2:40000", lease("x"), instance="x"), "not an instance's entry"),
        (head("http://10.0.0.1:11001", lease("dec-1"), instance="dec-1"), "of this node"),
        (head("http://etcd:12000", lease("x"), instance="x"), "not a name"),
        (head("http://0.0.0.0:12000", lease("x"), instance="x"), "not an address of a node"),
        (head("unix:/tmp/x", lease("x")), "target"),
    ]
    for h, why in cases:
        with pytest.raises(Refused, match=why):
            r.admit("pre-1", h)


def test_bad_headers_name_the_field() -> None:
    r = routes()
    for h, why in [
        (b"[1]", "JSON object"),
        (b"{", "JSON object"),
        (head(SHM, kv_id="../x"), "kv_id"),
        (head(SHM, tokens=0), "tokens"),
        (head(SHM, size="9"), "size"),
        (head(SHM, timeout_s=-1), "timeout_s"),
        (head(SHM, lease=7), "lease"),
    ]:
        with pytest.raises(Refused, match=why) as e:
            r.admit("pre-1", h)
        assert e.value.status == 400
        assert len(e.value.message) < 120  # never the header itself


def test_transfers_and_bytes_in_flight_are_bounded_and_the_deadline_capped() -> None:
    r = routes(max_transfers=2, max_bytes=250, max_timeout_s=5.0)
    a = r.admit("pre-1", head(SHM, lease("dec-1"), timeout_s=60))
    assert a.timeout_s == 5.0
    b = r.admit("pre-1", head(SHM, lease("dec-1"), kv_id="kv2"))
    with pytest.raises(Refused, match="busy: 2 transfers") as e:
        r.admit("pre-1", head(SHM, lease("dec-1"), kv_id="kv3"))
    assert e.value.status == 429
    r.done(a)
    with pytest.raises(Refused, match="100 of 250 bytes"):
        r.admit("pre-1", head(SHM, lease("dec-1"), kv_id="kv3", size=151))
    r.done(b)
    assert (r.in_flight, r.held) == (0, 0)


@pytest.fixture
async def relay(tmp_path: Path) -> AsyncIterator[tuple[KvRelay, Path]]:
    # Every member in this test's network namespace: the same-node way
    # passes the descriptor to the decode's own abstract socket here.
    r = KvRelay(KvRoutes(KEY, (1024, 65536), lambda: NOW))
    sender_dir = tmp_path / "pre+kv"
    r.prepare(sender_dir, None)
    yield r, sender_dir
    await r.close_all()


async def test_a_cache_goes_through_the_relay_to_the_decode_intact(
    relay: tuple[KvRelay, Path], tmp_path: Path
) -> None:
    r, sender_dir = relay
    dec = f"dec-{uuid.uuid4().hex[:8]}"  # an abstract name shared by the machine
    inbox = kvwire.KvInbox(8 << 20)
    sock = await kvshm.listen(inbox, kvaddr.shm_target(dec))
    (tmp_path / "dec+kv").mkdir()
    r.open(Member("pre-1", "team", "pre", "", "127.0.0.1:1"), sender_dir, None)
    r.open(Member(dec, "team", "dec", "pre", "127.0.0.1:2"), tmp_path / "dec+kv", kvmove.seqpacket)
    path = str(sender_dir / "kv.sock")
    assert os.stat(path).st_mode & 0o777 == 0o600
    data = os.urandom(3 << 20)
    try:
        await kvsend.send(kvaddr.shm_target(dec), "kv-a", len(data), 9, data=data,
                          lease=lease(dec), relay=path)  # fmt: skip
        got = kvwire.claim(inbox, "kv-a")
        assert bytes(got.data) == data and got.tokens == 9
        with pytest.raises(RuntimeError, match="403 lease"):
            await kvsend.send(kvaddr.shm_target(dec), "kv-b", 10, 1, lease=lease("x"), relay=path)
        assert "kv-b" not in inbox.entries
        assert (r.routes.in_flight, r.routes.held) == (0, 0)
    finally:
        kvshm.stop(sock)
    r.close(dec)
    assert not (tmp_path / "dec+kv").exists()


async def test_to_another_node_the_relay_puts_the_mapped_cache_to_its_entry(
    relay: tuple[KvRelay, Path],
) -> None:
    r, sender_dir = relay
    inbox = kvwire.KvInbox(8 << 20)
    app = web.Application()
    seen: list[str] = []

    async def put(request: web.Request) -> web.StreamResponse:
        seen.append(request.headers.get("Galaxy-Lease", ""))
        return await kvwire.receiver(inbox)(request)

    app.router.add_put("/v1/kv/{kv_id}", put)
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.2", 0)
    await site.start()
    port = runner.addresses[0][1]
    r.open(Member("pre-1", "team", "pre", "", "127.0.0.1:1"), sender_dir, None)
    try:
        data = os.urandom(2 << 20)
        token = lease("far-1")
        relay_path = str(sender_dir / "kv.sock")
        await kvsend.send(f"http://127.0.0.2:{port}", "kv-far", len(data), 4, data=data,
                          lease=token, instance="far-1", relay=relay_path)  # fmt: skip
        assert bytes(kvwire.claim(inbox, "kv-far").data) == data
        assert seen == [token]  # the entry there checks it again
    finally:
        await runner.cleanup()


async def test_without_a_way_into_the_namespace_the_relay_puts_to_the_decodes_entry(
    relay: tuple[KvRelay, Path], tmp_path: Path
) -> None:
    # An agent that may not enter namespaces (entry=factory): the same-node
    # cache goes to the decode instance's entry as an HTTP PUT with the lease.
    r, sender_dir = relay
    inbox = kvwire.KvInbox(8 << 20)
    app = web.Application()
    app.router.add_put("/v1/kv/{kv_id}", kvwire.receiver(inbox))
    runner = web.AppRunner(app)
    await runner.setup()
    await web.TCPSite(runner, "127.0.0.1", 0).start()
    entry = f"127.0.0.1:{runner.addresses[0][1]}"
    (tmp_path / "dec+kv").mkdir()
    r.open(Member("pre-1", "team", "pre", "", "127.0.0.1:1"), sender_dir, None)
    r.open(Member("dec-2", "team", "dec", "pre", entry), tmp_path / "dec+kv", None)
    try:
        data = os.urandom(1 << 20)
        relay_path = str(sender_dir / "kv.sock")
        await kvsend.send(kvaddr.shm_target("dec-2"), "kv-e", len(data), 2, data=data,
                          lease=lease("dec-2"), relay=relay_path)  # fmt: skip
        assert bytes(kvwire.claim(inbox, "kv-e").data) == data
    finally:
        await runner.cleanup()


async def test_an_instance_holds_a_bounded_number_of_connections(
    relay: tuple[KvRelay, Path],
) -> None:
    r, sender_dir = relay
    r.open(Member("pre-1", "team", "pre", "", "127.0.0.1:1"), sender_dir, None)
    loop = asyncio.get_running_loop()
    held = []
    for _ in range(MAX_CONNECTIONS + 4):
        s = kvmove.seqpacket()
        s.setblocking(False)
        await loop.sock_connect(s, str(sender_dir / "kv.sock"))
        held.append(s)
    # The ones past the bound are closed by the relay at once; the others
    # are served (a header without a descriptor: refused, naming why).
    async with asyncio.timeout(5):
        ends = [await _read(s) for s in held[MAX_CONNECTIONS:]]
        await loop.sock_sendall(held[0], b"{}")
        served = await _read(held[0])
    assert ends == [b""] * 4
    assert kvmove.read_answer(served) == (400, "KV relay: one header and one descriptor")
    for s in held:
        s.close()


async def _read(s: socket.socket) -> bytes:
    """One message, or b"" once the relay has closed the connection."""
    try:
        return await asyncio.get_running_loop().sock_recv(s, 4096)
    except OSError as e:
        if e.errno in (errno.ENOTCONN, errno.ECONNRESET):
            return b""
        raise
