"""The socket factory: runs inside an instance's sandbox, in its network
namespace, and hands the node's entry TCP sockets made there.

An agent that is not root cannot ``setns(2)`` into an instance's network
namespace (that needs CAP_SYS_ADMIN in the agent's own user namespace). So
the sandbox makes the sockets for it: this program listens on a Unix socket
in the instance's private directory, and for each request byte ``N`` it
creates ``N`` unconnected TCP sockets in the namespace and passes them back
over that Unix socket (``SCM_RIGHTS``). A socket stays in the namespace it
was made in, so the entry then connects it to the instance's loopback port
itself: no byte of a request is copied by a forwarder, and the factory is
asked once per batch of connections, not per request.

Run as ``python3 -I -S sockfactory.py DIR`` (the socket is ``DIR/NAME``,
bound by a relative name because a Unix socket's path is limited to 108
bytes, and found under NAME only once it listens): standard library
only, no site packages (it starts next to the function, so its start is
kept small). It must end with the function: the
sandbox starts it with a parent-death signal (``setpriv --pdeathsig``), as
bubblewrap's init waits for every process of the sandbox.
It serves one client at a time; what else could connect is the function
itself (the same user, the same directory), which can only get sockets of
its own namespace.
"""

from __future__ import annotations

# Only built-in and C modules: `socket` and `os` (not loaded under -S) would
# add ~8 ms of imports (enum, selectors) to every sandbox's start, on the
# CPU the function is starting on.
import _socket
import posix
import sys

MAX_BATCH = 64
#: The socket's name in the instance's private directory.
NAME = ".galaxy-entry.sock"
_BINDING = NAME + ".binding"


def serve(directory: str) -> None:
    """Listen on directory/NAME and answer every request until killed."""
    if posix.getppid() == 1:
        return  # the function ended before the parent-death signal was set
    posix.chdir(directory)
    for stale in (NAME, _BINDING):  # socket files of an earlier run
        try:
            posix.unlink(stale)
        except FileNotFoundError:
            pass
    listener = _socket.socket(_socket.AF_UNIX, _socket.SOCK_STREAM)
    old = posix.umask(0o177)  # the socket file is 0600 from its first moment
    try:
        listener.bind(_BINDING)
    finally:
        posix.umask(old)
    listener.listen(4)
    # Under its name only once it listens: whoever finds NAME can connect.
    posix.rename(_BINDING, NAME)
    while True:
        fd, _ = listener._accept()  # type: ignore[attr-defined]  # _socket: a raw fd
        conn = _socket.socket(_socket.AF_UNIX, _socket.SOCK_STREAM, 0, fd)
        try:
            _answer(conn)
        finally:
            conn.close()


def _answer(conn: _socket.socket) -> None:
    while True:
        try:
            asks = conn.recv(MAX_BATCH)
        except OSError:
            return
        if not asks:
            return
        for n in asks:
            made = [_socket.socket(_socket.AF_INET, _socket.SOCK_STREAM) for _ in range(max(1, n))]
            fds = b"".join(s.fileno().to_bytes(4, sys.byteorder) for s in made)
            try:
                conn.sendmsg([b"s"], [(_socket.SOL_SOCKET, _socket.SCM_RIGHTS, fds)])
            except OSError:
                return
            finally:
                for s in made:
                    s.close()


if __name__ == "__main__":
    serve(sys.argv[1])
