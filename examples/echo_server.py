"""A tiny function instance for Galaxy: an HTTP echo server (stdlib only).

Listens on $HOST:$PORT (the node agent sets both: HOST is the node's
address, so clients on other hosts can call it; HOST defaults to 127.0.0.1).
  GET  /healthz   -> 200 "ok" (readiness)
  GET  /headers   -> 200 {"headers": {name: value}}: what reached the instance
  POST <any path> -> 200 {"echo": <body as text>, "pid": <pid>, "instance": $GALAXY_INSTANCE_ID,
                          "function": $GALAXY_FUNCTION, "node": $GALAXY_NODE_ID,
                          "revision": $GALAXY_REVISION}
Exits cleanly (status 0) on SIGTERM or SIGINT.

Run by hand: PORT=8080 python examples/echo_server.py
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import socket
import socketserver
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

INSTANCE = os.environ.get("GALAXY_INSTANCE_ID", "")
FUNCTION = os.environ.get("GALAXY_FUNCTION", "")
NODE = os.environ.get("GALAXY_NODE_ID", "")
REVISION = int(os.environ.get("GALAXY_REVISION", "0"))


class Server(ThreadingHTTPServer):
    # The stdlib's backlog of 5 refuses a burst of new connections.
    request_queue_size = 128
    daemon_threads = True
    # An IPv6 node address needs an IPv6 socket.
    address_family = socket.AF_INET6 if ":" in os.environ.get("HOST", "") else socket.AF_INET

    def server_bind(self) -> None:
        # http.server looks the bound address up in DNS (getfqdn) only to
        # name itself; where no resolver answers that stalls start-up 10 s.
        socketserver.TCPServer.server_bind(self)
        self.server_name, self.server_port = self.server_address[:2]


class Handler(BaseHTTPRequestHandler):
    # Keep-alive, so a client can reuse its connection across requests.
    protocol_version = "HTTP/1.1"
    # Headers and body leave in separate writes: with Nagle's algorithm the
    # body waits for the client's delayed ACK (~40 ms a request).
    disable_nagle_algorithm = True
    server_version = "galaxy-echo/1"

    def _send(self, code: int, body: bytes, ctype: str) -> None:
        self.send_response(code)
        self.send_header("Content-Type", ctype)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def do_GET(self) -> None:
        path = self.path.split("?", 1)[0]
        if path == "/healthz":
            self._send(200, b"ok", "text/plain")
        elif path == "/headers":
            reply = {"headers": dict(self.headers.items())}
            self._send(200, json.dumps(reply).encode(), "application/json")
        else:
            self._send(404, b"not found; POST to echo, GET /healthz for health", "text/plain")

    def do_POST(self) -> None:
        length = int(self.headers.get("Content-Length") or 0)
        body = self.rfile.read(length) if length > 0 else b""
        reply = {
            "echo": body.decode("utf-8", errors="replace"),
            "pid": os.getpid(),
            "instance": INSTANCE,
            "function": FUNCTION,
            "node": NODE,
            "revision": REVISION,
        }
        self._send(200, json.dumps(reply).encode(), "application/json")

    def log_message(self, format: str, *args: object) -> None:
        pass  # quiet: one line per request would drown the node's log dir


def main() -> None:
    host = os.environ.get("HOST", "127.0.0.1")
    port = int(os.environ.get("PORT", "8080"))
    # Block the stop signals before any thread starts: every thread inherits
    # the mask, so only the main thread's sigwait receives them, and no signal
    # handler ever interrupts request handling halfway.
    stop_signals = {signal.SIGTERM, signal.SIGINT}
    signal.pthread_sigmask(signal.SIG_BLOCK, stop_signals)
    server = Server((host, port), Handler)
    server.daemon_threads = True
    serving = threading.Thread(target=server.serve_forever, name="http", daemon=True)
    serving.start()
    signal.sigwait(stop_signals)
    # shutdown() waits until the serving loop notices; a connection wakes its
    # select() at once, so an idle instance needs no fast polling to stop fast.
    stopper = threading.Thread(target=server.shutdown, name="stop")
    stopper.start()
    while stopper.is_alive():
        with contextlib.suppress(OSError):
            socket.create_connection(("127.0.0.1", port), timeout=1).close()
        stopper.join(0.05)
    server.server_close()


if __name__ == "__main__":
    main()
