"""A streaming function instance for Galaxy (stdlib only): chunked text,
server-sent events, an OpenAI-shaped chat/completions endpoint and KServe
v1/v2 inference answers, so every gateway route can be tried with the client
it is meant for.

Listens on $HOST:$PORT (the node agent sets both; HOST defaults to 127.0.0.1).
  GET  /healthz                    -> 200 "ok" (readiness)
  POST /v1/chat/completions        -> OpenAI chat.completion, or with
                                      "stream": true chat.completion.chunk
                                      events ending with "data: [DONE]"
  POST /v1/completions             -> OpenAI text_completion (same streaming)
  POST /v1/models/NAME:predict     -> KServe v1 {"predictions": instances}
  POST /v2/models/NAME/infer       -> Open Inference Protocol v2: outputs =
                                      inputs (an identity model)
  POST <other path>                -> the body's words, one chunk each
                                      (Transfer-Encoding: chunked; as SSE
                                      with Accept: text/event-stream)
The pause between chunks is $CHUNK_DELAY_S (default 0.05 s): a stream is
visibly a stream.

Run by hand: PORT=8081 python examples/stream_server.py
"""

from __future__ import annotations

import json
import os
import signal
import socket
import socketserver
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

DELAY_S = float(os.environ.get("CHUNK_DELAY_S", "0.05"))
INSTANCE = os.environ.get("GALAXY_INSTANCE_ID", "")


def words_of(messages: object) -> list[str]:
    """The reply of this toy model: the last user message's words, echoed."""
    if isinstance(messages, list) and messages and isinstance(messages[-1], dict):
        text = str(messages[-1].get("content", ""))
    else:
        text = str(messages or "")
    return [w + " " for w in text.split()] or ["(empty)"]


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
    protocol_version = "HTTP/1.1"
    # Headers and body leave in separate writes: with Nagle's algorithm the
    # body waits for the client's delayed ACK (~40 ms a request).
    disable_nagle_algorithm = True
    server_version = "galaxy-stream/1"

    def _json(self, code: int, doc: object) -> None:
        body = json.dumps(doc).encode()
        self.send_response(code)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def _chunked(self, ctype: str, parts: list[bytes]) -> None:
        self.send_response(200)
        self.send_header("Content-Type", ctype)
        self.send_header("Transfer-Encoding", "chunked")
        self.send_header("Cache-Control", "no-cache")
        self.end_headers()
        for i, part in enumerate(parts):
            if i:
                time.sleep(DELAY_S)
            self.wfile.write(f"{len(part):x}\r\n".encode() + part + b"\r\n")
            self.wfile.flush()
        self.wfile.write(b"0\r\n\r\n")
        self.wfile.flush()

    def do_GET(self) -> None:
        if self.path.split("?", 1)[0] == "/healthz":
            self._json(200, "ok")
        else:
            self._json(404, {"error": "POST to a route; GET /healthz for health"})

    def do_POST(self) -> None:
        length = int(self.headers.get("Content-Length") or 0)
        raw = self.rfile.read(length) if length > 0 else b""
        path = self.path.split("?", 1)[0]
        try:
            doc = json.loads(raw) if raw.strip().startswith(b"{") else {}
        except ValueError:
            doc = {}
        if path in ("/v1/chat/completions", "/v1/completions"):
            return self._openai(path, doc)
        if path.startswith("/v1/models/") and path.endswith(":predict"):
            return self._json(200, {"predictions": doc.get("instances", [])})
        if path.startswith("/v2/models/") and path.endswith("/infer"):
            name = path.split("/")[3]
            outputs = [{**i, "name": f"output-{n}"} for n, i in enumerate(doc.get("inputs", []))]
            return self._json(200, {"model_name": name, "id": doc.get("id", ""),
                                    "outputs": outputs})  # fmt: skip
        words = raw.decode("utf-8", "replace").split() or ["(empty)"]
        if "text/event-stream" in (self.headers.get("Accept") or ""):
            self._chunked("text/event-stream", [f"data: {w}\n\n".encode() for w in words])
        else:
            self._chunked("text/plain; charset=utf-8", [(w + "\n").encode() for w in words])

    def _openai(self, path: str, doc: dict) -> None:
        chat = path.endswith("chat/completions")
        words = words_of(doc.get("messages") if chat else doc.get("prompt"))
        model, created = str(doc.get("model", "")), int(time.time())
        if not doc.get("stream"):
            text = "".join(words)
            choice = (
                {"index": 0, "message": {"role": "assistant", "content": text},
                 "finish_reason": "stop"}
                if chat else {"index": 0, "text": text, "finish_reason": "stop"}
            )  # fmt: skip
            return self._json(200, {
                "id": f"cmpl-{INSTANCE}", "object": "chat.completion" if chat else
                "text_completion", "created": created, "model": model, "choices": [choice],
                "usage": {"prompt_tokens": 0, "completion_tokens": len(words),
                          "total_tokens": len(words)},
            })  # fmt: skip
        events = []
        for i, w in enumerate(words):
            last = i == len(words) - 1
            choice = (
                {"index": 0, "delta": {"content": w} if i else {"role": "assistant",
                 "content": w}, "finish_reason": "stop" if last else None}
                if chat else {"index": 0, "text": w, "finish_reason": "stop" if last else None}
            )  # fmt: skip
            chunk = {"id": f"cmpl-{INSTANCE}", "object": "chat.completion.chunk" if chat else
                     "text_completion", "created": created, "model": model,
                     "choices": [choice]}  # fmt: skip
            events.append(f"data: {json.dumps(chunk)}\n\n".encode())
        events.append(b"data: [DONE]\n\n")
        self._chunked("text/event-stream", events)

    def log_message(self, format: str, *args: object) -> None:
        pass


def main() -> None:
    host = os.environ.get("HOST", "127.0.0.1")
    port = int(os.environ.get("PORT", "8081"))
    stop_signals = {signal.SIGTERM, signal.SIGINT}
    signal.pthread_sigmask(signal.SIG_BLOCK, stop_signals)
    server = Server((host, port), Handler)
    server.daemon_threads = True
    threading.Thread(target=server.serve_forever, name="http", daemon=True).start()
    signal.sigwait(stop_signals)
    threading.Thread(target=server.shutdown, name="stop", daemon=True).start()
    server.server_close()


if __name__ == "__main__":
    main()
