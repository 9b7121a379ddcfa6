"""Moving a KV cache between two instances of one node through shared memory.

The sender writes the cache into a memfd (an anonymous file in RAM) and
passes the file descriptor over a Unix socket (``SCM_RIGHTS``); the receiver
maps the same pages. The bytes are written once, by the sender, and never
cross a socket: the receiver's cost is a ``mmap``, whatever the size, where
the HTTP path (``kvwire``) copies every byte through the kernel and into a
buffer in Python.

Target ``shm:@name``: the receiver's abstract ``SOCK_SEQPACKET`` socket
(``@galaxy-kvfd-<instance id>`` inside Galaxy, ``kvaddr.shm_target``;
message boundaries kept, so a request is one message: a JSON header
``{kv_id, tokens, size}`` and one descriptor). The receiver reserves room
in the same bounded ``KvInbox`` first and answers ``{status, message}``
(201, or 400/409/413 as the HTTP path would). The sender is
``controlplane.llm.kvsend`` (its ``Descriptor`` transport).
"""

from __future__ import annotations

import asyncio
import json
import mmap
import os
import socket

from controlplane.llm.kvwire import InboxFull, KvInbox
from controlplane.runtime.kvaddr import unix_path, valid_id
from controlplane.runtime.kvmove import MAX_HEADER
from controlplane.runtime.kvmove import answer as _answer


def accept_one(inbox: KvInbox, header: bytes, fds: list[int]) -> bytes:
    """Take one cache passed as a descriptor into the inbox (pure but for
    mapping the descriptor, which it closes); the answer to send back."""
    try:
        if len(fds) != 1 or len(header) > MAX_HEADER:
            return _answer(400, "KV transfer: one header and one descriptor")
        try:
            head = json.loads(header)
            kv_id, tokens, size = head["kv_id"], head["tokens"], head["size"]
        except (ValueError, KeyError, TypeError):
            return _answer(400, "KV transfer: header {kv_id, tokens, size}")
        if not isinstance(kv_id, str) or not valid_id(kv_id):
            return _answer(400, "kv id: 1-64 of A-Z, a-z, 0-9, '-', '_'")
        if not isinstance(tokens, int) or tokens < 1 or not isinstance(size, int) or size < 1:
            return _answer(400, "KV transfer: tokens and size at least 1")
        if os.fstat(fds[0]).st_size < size:
            return _answer(400, f"KV transfer: the file holds fewer than {size} bytes")
        try:
            entry = inbox.reserve(kv_id, size, tokens)
        except InboxFull as e:
            return _answer(413, f"KV inbox full: {e}")
        except ValueError as e:
            return _answer(409, str(e))
        entry.data = mmap.mmap(fds[0], size, prot=mmap.PROT_READ)
        entry.complete = True
        return _answer(201, "")
    finally:
        for fd in fds:
            os.close(fd)


async def listen(inbox: KvInbox, target: str) -> socket.socket:
    """Receive caches on ``target`` (``shm:@name``) until the returned
    socket is closed (its reader goes with it)."""
    loop = asyncio.get_running_loop()
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    sock.bind(unix_path(target))
    sock.listen(64)
    sock.setblocking(False)

    def on_message(conn: socket.socket) -> None:
        loop.remove_reader(conn.fileno())
        try:
            header, fds, _, _ = socket.recv_fds(conn, MAX_HEADER + 1, 2)
            conn.send(accept_one(inbox, header, fds))
        except OSError:
            pass  # the sender went away: nothing was reserved, or it stays to its TTL
        finally:
            conn.close()

    def on_accept() -> None:
        try:
            conn, _ = sock.accept()
        except OSError:
            return
        conn.setblocking(False)
        loop.add_reader(conn.fileno(), on_message, conn)

    loop.add_reader(sock.fileno(), on_accept)
    return sock


def stop(sock: socket.socket) -> None:
    """Stop receiving on a socket of ``listen``."""
    asyncio.get_running_loop().remove_reader(sock.fileno())
    sock.close()
