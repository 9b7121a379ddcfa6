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
bytes): standard library only, no site packages (it starts next to the
function, so its start is kept small). It must end with the function: the
sandbox starts it with a parent-death signal (``setpriv --pdeathsig``), as
bubblewrap's init waits for every process of the sandbox.
It serves one client at a time; what else could connect is the function
itself (the same user, the same directory), which can only get sockets of
its own namespace.
"""

from __future__ import annotations

import os
import socket
import sys

MAX_BATCH = 64
#: The socket's name in the instance's private directory.
NAME = ".galaxy-entry.sock"


def serve(directory: str) -> None:
    """Listen on directory/NAME and answer every request until killed."""
    if os.getppid() == 1:
        return  # the function ended before the parent-death signal was set
    os.chdir(directory)
    path = NAME
    try:
        os.unlink(path)  # a stale socket file of an earlier run
    except FileNotFoundError:
        pass
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    old = os.umask(0o177)  # the socket file is 0600 from its first moment
    try:
        listener.bind(path)
    finally:
        os.umask(old)
    listener.listen(4)
    while True:
        conn, _ = listener.accept()
        with conn:
            _answer(conn)


def _answer(conn: socket.socket) -> None:
    while True:
        try:
            asks = conn.recv(MAX_BATCH)
        except OSError:
            return
        if not asks:
            return
        for n in asks:
            made = [socket.socket(socket.AF_INET, socket.SOCK_STREAM) for _ in range(max(1, n))]
            try:
                socket.send_fds(conn, [b"s"], [s.fileno() for s in made])
            except OSError:
                return
            finally:
                for s in made:
                    s.close()


if __name__ == "__main__":
    serve(sys.argv[1])
