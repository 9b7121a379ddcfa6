"""The same-node shared-memory KV path (a memfd passed over an abstract Unix
socket): real sockets and descriptors in one process; the bytes arrive
intact, the inbox's bounds hold, bad requests are refused naming why."""

from __future__ import annotations

import os
import uuid

import pytest

from controlplane.llm import kvsend, kvshm, kvwire
from controlplane.runtime.kvaddr import shm_target


def target() -> str:
    return shm_target(f"t{os.getpid()}-{uuid.uuid4().hex[:8]}")


async def test_a_cache_arrives_mapped_and_intact() -> None:
    inbox, where = kvwire.KvInbox(8 << 20), target()
    sock = await kvshm.listen(inbox, where)
    try:
        data = os.urandom(3 << 20)
        took = await kvsend.send(where, "kv-a", len(data), 7, data=data)
        assert took > 0
        entry = kvwire.claim(inbox, "kv-a")
        assert entry.tokens == 7 and bytes(entry.data) == data
        assert inbox.held == 0  # taken: its room is back
        # An emulated cache: nbytes of the fill pattern.
        await kvsend.send(where, "kv-b", 5000, 1)
        assert bytes(kvwire.claim(inbox, "kv-b").data) == b"\x5a" * 5000
    finally:
        kvshm.stop(sock)


async def test_the_inbox_bound_and_duplicate_ids_are_refused() -> None:
    inbox, where = kvwire.KvInbox(1 << 20), target()
    sock = await kvshm.listen(inbox, where)
    try:
        with pytest.raises(RuntimeError, match="413 KV inbox full"):
            await kvsend.send(where, "big", 2 << 20, 1)
        await kvsend.send(where, "dup", 10, 1)
        with pytest.raises(RuntimeError, match="409"):
            await kvsend.send(where, "dup", 10, 1)
        assert list(inbox.entries) == ["dup"]
    finally:
        kvshm.stop(sock)


def test_a_header_without_a_descriptor_or_with_a_short_file_is_refused() -> None:
    inbox = kvwire.KvInbox(1 << 20)
    assert b"one descriptor" in kvshm.accept_one(inbox, b'{"kv_id": "a"}', [])
    fd = os.memfd_create("short")
    os.ftruncate(fd, 10)
    said = kvshm.accept_one(inbox, b'{"kv_id": "a", "tokens": 1, "size": 100}', [fd])
    assert b"fewer than 100 bytes" in said
    fd = os.memfd_create("bad")
    assert b"kv id" in kvshm.accept_one(inbox, b'{"kv_id": "../x", "tokens": 1, "size": 1}', [fd])
    assert not inbox.entries  # nothing reserved by a refusal
    with pytest.raises(OSError):  # every descriptor was closed
        os.fstat(fd)


async def test_nothing_listening_is_an_error_the_sender_names() -> None:
    with pytest.raises((OSError, RuntimeError)):
        await kvsend.send(target(), "x", 10, 1)
