"""Run by tests/nodeagent/test_delegated_cgroups.py as a user that is not
root, with only a delegated cgroup subtree writable: the node agent's bwrap
backend starts a memory hog and a fork loop there and reports, as JSON on
stdout, how each was stopped."""

from __future__ import annotations

import asyncio
import json
import os
import sys
from pathlib import Path

from controlplane.nodeagent.sandbox.bwrap import BwrapBackend
from controlplane.nodeagent.sandbox.cgroups import Cgroups
from galaxy.v1 import common_pb2

SERVE = (
    "import http.server, os, threading\n"
    "class H(http.server.BaseHTTPRequestHandler):\n"
    "    def do_GET(self):\n"
    "        body = WORK().encode()\n"
    "        self.send_response(200); self.end_headers(); self.wfile.write(body)\n"
    "    def log_message(self, *a): pass\n"
    "http.server.HTTPServer((os.environ['HOST'], int(os.environ['PORT'])), H).serve_forever()\n"
)
HOG = "def WORK():\n    hog = [bytearray(1 << 20) for _ in range(100_000)]\n    return 'x'\n"
FORK = (
    "def WORK():\n"
    "    n = 0\n"
    "    try:\n"
    "        while n < 10_000:\n"
    "            if os.fork() == 0:\n"
    "                os.execv('/bin/sleep', ['sleep', '30'])\n"
    "            n += 1\n"
    "    except OSError as e:\n"
    "        return f'{n} {type(e).__name__}'\n"
    "    return f'{n} none'\n"
)


async def get(address: str) -> str:
    host, port = address.rsplit(":", 1)
    reader, writer = await asyncio.open_connection(host, int(port))
    writer.write(b"GET / HTTP/1.0\r\n\r\n")
    data = await asyncio.wait_for(reader.read(), 20)
    writer.close()
    return data.partition(b"\r\n\r\n")[2].decode()


async def main(root: Path, work: Path, max_pids: int) -> dict[str, object]:
    backend = BwrapBackend(
        log_dir=work / "logs",
        instance_dir=work / "inst",
        cgroups=Cgroups(root, max_pids=max_pids),
    )
    loop = asyncio.get_running_loop()
    exited: asyncio.Future[int] = loop.create_future()
    out: dict[str, object] = {"euid": os.geteuid(), "own_netns": backend.own_netns}
    try:
        res = common_pb2.Resources(cpu_millis=500, memory_mib=64)
        hog = await backend.start(
            "n", "hog", common_pb2.FunctionSpec(
                name="hog", command=["python3", "-c", HOG + SERVE], resources=res
            ),
            on_exit=lambda _iid, rc: exited.done() or exited.set_result(rc),
        )  # fmt: skip
        out["hog_groups"] = [str(d) for d in hog.group.dirs] if hog.group else []
        try:
            await get(hog.address)
        except (OSError, TimeoutError) as e:
            out["hog_request"] = type(e).__name__
        out["hog_exit"] = hog.exit_reason(await asyncio.wait_for(exited, 30))
        fork = await backend.start(
            "n", "fork", common_pb2.FunctionSpec(
                name="fork", command=["python3", "-c", FORK + SERVE], resources=res
            ),
        )  # fmt: skip
        out["fork"] = await get(fork.address)
    finally:
        await backend.close()
    return out


if __name__ == "__main__":
    doc = asyncio.run(main(Path(sys.argv[1]), Path(sys.argv[2]), int(sys.argv[3])))
    print(json.dumps(doc))
