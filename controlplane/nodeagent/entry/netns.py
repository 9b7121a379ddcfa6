"""Sockets inside another network namespace.

An instance in its own network namespace listens on that namespace's
loopback, which nothing on the host can reach. The entry opens its
connections to the instance there: ``setns(2)`` moves the calling thread into
the namespace, a socket is created (a socket stays in the namespace it was
made in for its whole life), and the thread moves back. Both moves happen in
one synchronous call on the event loop's thread, so no other code of that
thread runs inside the instance's namespace. Entering needs CAP_SYS_ADMIN
over the namespace and in the caller's own user namespace: a root agent.
"""

from __future__ import annotations

import ctypes
import os
import socket

_CLONE_NEWNET = 0x40000000
_libc = ctypes.CDLL(None, use_errno=True)


def _setns(fd: int) -> None:
    if _libc.setns(fd, _CLONE_NEWNET) != 0:
        err = ctypes.get_errno()
        raise OSError(err, f"setns: {os.strerror(err)}")


def can_enter() -> bool:
    """True when this process may enter other network namespaces."""
    return os.geteuid() == 0


class NetnsDialer:
    """Makes TCP sockets in the network namespace of process pid."""

    def __init__(self, pid: int) -> None:
        self._fd = os.open(f"/proc/{pid}/ns/net", os.O_RDONLY | os.O_CLOEXEC)

    async def dial(self) -> socket.socket:
        """``socket``, as the entry's dial (``sockclient.FactoryDialer.socket``'s
        shape)."""
        return self.socket()

    def unix_socket(self) -> socket.socket:
        """A new non-blocking Unix message socket in the namespace: it
        reaches the namespace's abstract sockets (the node's KV relay hands
        caches to a decode instance's this way, ``kvrelay``)."""
        return self._made(socket.AF_UNIX, socket.SOCK_SEQPACKET)

    def _made(self, family: socket.AddressFamily, kind: socket.SocketKind) -> socket.socket:
        home = os.open("/proc/thread-self/ns/net", os.O_RDONLY | os.O_CLOEXEC)
        try:
            _setns(self._fd)
            try:
                s = socket.socket(family, kind)
            finally:
                # Back home before anything else runs on this thread; a
                # failure here leaves the thread elsewhere, so it is fatal.
                _setns(home)
        finally:
            os.close(home)
        s.setblocking(False)
        return s

    def socket(self) -> socket.socket:
        """A new non-blocking TCP socket in the namespace."""
        s = self._made(socket.AF_INET, socket.SOCK_STREAM)
        s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        return s

    def close(self) -> None:
        """Let go of the namespace (it ends with its last process)."""
        if self._fd >= 0:
            os.close(self._fd)
            self._fd = -1
