"""The iris graph's preprocessing step (stdlib only): named measurements in,
the classifiers' feature rows out, both on KServe v1.

  POST /v1/models/NAME:predict {"instances": [{"sepal_length": 6.8,
       "sepal_width": 2.8, "petal_length": 4.8, "petal_width": 1.4}, ...]}
    -> {"instances": [[6.8, 2.8, 4.8, 1.4], ...]}   (centimetres; a value
       given in millimetres with "unit": "mm" is converted)
  GET /healthz -> 200 "ok"

A row with a missing or non-numeric measurement is a 400 naming it. Listens
on $HOST:$PORT (set by the node agent); exits on SIGTERM.
"""

from __future__ import annotations

import json
import os
import signal
import socket
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

FEATURES = ("sepal_length", "sepal_width", "petal_length", "petal_width")
MAX_ROWS = 10_000


class BadRow(ValueError):
    """A row the step cannot convert; the message names the field."""


def features(rows: Any) -> list[list[float]]:
    """The feature rows of a request's instances."""
    if not isinstance(rows, list) or not 1 <= len(rows) <= MAX_ROWS:
        raise BadRow(f"instances: a list of 1 to {MAX_ROWS} objects")
    out = []
    for i, row in enumerate(rows):
        if not isinstance(row, dict):
            raise BadRow(f"instances[{i}]: an object of {', '.join(FEATURES)}")
        scale = 0.1 if row.get("unit") == "mm" else 1.0
        vec = []
        for f in FEATURES:
            v = row.get(f)
            if isinstance(v, bool) or not isinstance(v, int | float):
                raise BadRow(f"instances[{i}].{f}: a number is required")
            vec.append(round(float(v) * scale, 4))
        out.append(vec)
    return out


class Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    disable_nagle_algorithm = True

    def _send(self, code: int, doc: Any) -> None:
        body = json.dumps(doc).encode()
        self.send_response(code)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def do_GET(self) -> None:
        self._send(200 if self.path == "/healthz" else 404, "ok" if self.path == "/healthz" else {})

    def do_POST(self) -> None:
        length = int(self.headers.get("Content-Length") or 0)
        try:
            doc = json.loads(self.rfile.read(length) or b"null")
            if not isinstance(doc, dict):
                raise BadRow("body: a JSON object with instances")
            self._send(200, {"instances": features(doc.get("instances"))})
        except (BadRow, ValueError) as e:
            self._send(400, {"error": str(e)[:200]})

    def log_message(self, format: str, *args: object) -> None:
        pass  # one line per request would drown the node's log dir


def _stop(*_: object) -> None:
    raise KeyboardInterrupt  # ends serve_forever in the main thread


def main() -> None:
    host = os.environ.get("HOST", "127.0.0.1")
    ThreadingHTTPServer.address_family = socket.AF_INET6 if ":" in host else socket.AF_INET
    server = ThreadingHTTPServer((host, int(os.environ.get("PORT", "8080"))), Handler)
    server.daemon_threads = True
    signal.signal(signal.SIGTERM, _stop)
    try:
        server.serve_forever()
    except KeyboardInterrupt:
        pass
    server.server_close()


if __name__ == "__main__":
    main()
