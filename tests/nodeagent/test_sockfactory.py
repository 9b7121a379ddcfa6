"""The socket factory's protocol on its own (no sandbox): the real program
in a subprocess hands out TCP sockets in batches, and the entry's client
refuses any other descriptor a function could pass in the factory's place."""

from __future__ import annotations

import asyncio
import socket
import sys
from pathlib import Path

import pytest

from controlplane.nodeagent.entry import sockfactory
from controlplane.nodeagent.entry.sockclient import FactoryDialer

pytestmark = pytest.mark.slow  # starts a process


async def _wait_for(path: Path) -> None:
    # The factory's socket file is its signal: it takes its name once the
    # factory listens (a connect between bind and listen would be refused).
    for _ in range(500):
        if await asyncio.to_thread(path.exists):
            return
        await asyncio.sleep(0.01)
    raise AssertionError(f"{path} never appeared")


async def test_the_factory_hands_out_tcp_sockets_in_batches(tmp_path):
    p = await asyncio.create_subprocess_exec(
        sys.executable, "-I", "-S", sockfactory.__file__, str(tmp_path)
    )
    dialer = FactoryDialer(str(tmp_path), batch=3)
    try:
        await _wait_for(tmp_path / sockfactory.NAME)
        assert (tmp_path / sockfactory.NAME).stat().st_mode & 0o777 == 0o600
        got = [await dialer.socket() for _ in range(4)]  # two round trips
        assert all(s.family == socket.AF_INET and s.type == socket.SOCK_STREAM for s in got)
        assert len({s.fileno() for s in got}) == 4
        # Usable: each connects (here, to a listener of this namespace).
        srv = socket.create_server(("127.0.0.1", 0))
        await asyncio.get_running_loop().sock_connect(got[0], srv.getsockname())
        srv.close()
        for s in got:
            s.close()
    finally:
        dialer.close()
        p.kill()
        await p.wait()


async def test_a_descriptor_that_is_not_a_tcp_socket_is_refused(tmp_path):
    """A function may replace the factory (same user, its own directory):
    whatever it passes that is not a TCP socket never reaches the door."""
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    listener.bind(str(tmp_path / sockfactory.NAME))
    listener.listen(1)
    listener.setblocking(False)
    loop = asyncio.get_running_loop()

    async def impostor() -> None:
        conn, _ = await loop.sock_accept(listener)
        await loop.sock_recv(conn, 64)
        a, b = socket.socketpair()  # Unix sockets, not TCP
        socket.send_fds(conn, [b"s"], [a.fileno(), b.fileno()])
        a.close()
        b.close()
        conn.close()

    task = asyncio.create_task(impostor())
    dialer = FactoryDialer(str(tmp_path), batch=2)
    try:
        with pytest.raises(ConnectionError, match="no usable socket"):
            await dialer.socket()
        await task
    finally:
        dialer.close()
        listener.close()
