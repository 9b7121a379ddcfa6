"""A function that serves a model file: it reads the model the node agent
fetched into its cache ($GALAXY_MODEL_PATH, or the path given as its only
argument) once at start, and answers every request with what it loaded.

  GET  /healthz -> 200 "ok"
  POST any path -> 200 {"model_path", "model_bytes", "model_sha256", "pid"}

Run by hand: PORT=8080 GALAXY_MODEL_PATH=/some/file python examples/model_info.py
"""

from __future__ import annotations

import hashlib
import json
import os
import signal
import socket
import socketserver
import sys
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

PATH = sys.argv[1] if len(sys.argv) > 1 else os.environ.get("GALAXY_MODEL_PATH", "")
with open(PATH, "rb") as f:
    DATA = f.read()
INFO = json.dumps(
    {
        "model_path": PATH,
        "model_bytes": len(DATA),
        "model_sha256": hashlib.sha256(DATA).hexdigest(),
        "pid": os.getpid(),
    }
).encode()


class Server(ThreadingHTTPServer):
    daemon_threads = True
    address_family = socket.AF_INET6 if ":" in os.environ.get("HOST", "") else socket.AF_INET

    def server_bind(self) -> None:
        # No reverse DNS lookup of the bound address (it can stall 10 s).
        socketserver.TCPServer.server_bind(self)
        self.server_name, self.server_port = self.server_address[:2]


class Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"

    def _send(self, body: bytes, ctype: str = "application/json") -> None:
        self.send_response(200)
        self.send_header("Content-Type", ctype)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def do_GET(self) -> None:
        self._send(b"ok" if self.path == "/healthz" else INFO, "text/plain")

    def do_POST(self) -> None:
        self.rfile.read(int(self.headers.get("Content-Length") or 0))
        self._send(INFO)

    def log_message(self, format: str, *args: object) -> None:
        pass


def main() -> None:
    server = Server((os.environ.get("HOST", "127.0.0.1"), int(os.environ["PORT"])), Handler)
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: threading.Thread(target=server.shutdown).start())
    server.serve_forever()


if __name__ == "__main__":
    main()
