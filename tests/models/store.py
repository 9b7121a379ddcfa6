"""A model store for tests: a real HTTP file server (the standard library's
threading server) over a directory, counting the GETs of each path, so a
test can see that concurrent starts shared one download."""

from __future__ import annotations

import collections
import functools
import threading
from http.server import SimpleHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path


class CountingStore:
    """Serve ``root`` on 127.0.0.1 (or ``host``) until ``close``."""

    def __init__(self, root: Path, host: str = "127.0.0.1") -> None:
        self.gets: collections.Counter[str] = collections.Counter()
        store = self

        class Handler(SimpleHTTPRequestHandler):
            def do_GET(self) -> None:
                store.gets[self.path] += 1
                super().do_GET()

            def log_message(self, format: str, *args: object) -> None:
                pass

        self.server = ThreadingHTTPServer((host, 0), functools.partial(Handler, directory=root))
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()

    def url(self, name: str) -> str:
        host, port = self.server.server_address[:2]
        return f"http://{host}:{port}/{name}"

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()
