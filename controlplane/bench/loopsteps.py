"""How many event-loop iterations a grpc.aio unary call takes, measured.

The simulator's event-loop model of a process (``simulator/loop.py``)
needs two numbers: the iterations from a call's arrival at a server to its
handler running, and from the reply's arrival at the client to the
awaiting coroutine resuming. Both come from grpc.aio's internals (which
change between versions), so they are counted, not assumed: a server and a
client on asyncio's pure-Python loop, with ``_run_once`` (one iteration)
wrapped by a counter and the selector's ``select`` timed, exchange calls
spaced apart. An iteration whose ``select`` blocked is one a message from
outside woke; the steps of a message are the iterations from that one to
the handler (server) or to the resumed caller (client), both included.
(uvloop runs the same callback chains, one link per iteration, but cannot
be counted from Python.)

    python -m controlplane.bench.loopsteps        # prints one JSON object

Run it as its own process: it patches the event loop class.
"""

from __future__ import annotations

import asyncio
import json
import statistics
import subprocess
import sys
import time
from asyncio import base_events
from typing import Any

import grpc

_SERVICE = "galaxy.bench.LoopSteps"
#: A select() that waited this long was idle: the iteration is a wake.
_IDLE_S = 0.0002


class _Counter:
    """Iterations of this process's loop, and which of them were wakes."""

    def __init__(self) -> None:
        self.iterations = 0
        self.wakes: list[int] = []

    def install(self) -> None:
        """Count every ``_run_once`` of the pure-Python loop."""
        run_once = base_events.BaseEventLoop._run_once  # type: ignore[attr-defined]
        counter = self

        def counted(loop: Any) -> None:
            counter.iterations += 1
            run_once(loop)

        base_events.BaseEventLoop._run_once = counted  # type: ignore[attr-defined]

    def time_select(self, loop: asyncio.AbstractEventLoop) -> None:
        """Note the iterations whose select() blocked (call in the loop)."""
        sel = loop._selector  # type: ignore[attr-defined]
        select = sel.select

        def timed(timeout: float | None = None) -> Any:
            t0 = time.perf_counter()
            events = select(timeout)
            if time.perf_counter() - t0 >= _IDLE_S:
                self.wakes.append(self.iterations)
            return events

        sel.select = timed

    def steps_to(self, at: int) -> int:
        """Iterations from the last wake up to ``at``, both included."""
        woke = max((w for w in self.wakes if w <= at), default=at)
        return at - woke + 1


_COUNT = _Counter()


async def _serve() -> None:
    """The server: Echo notes the iteration its handler runs in; Stats
    returns the steps of each Echo as JSON."""
    _COUNT.time_select(asyncio.get_running_loop())
    handled: list[int] = []

    async def echo(request: bytes, context: grpc.aio.ServicerContext) -> bytes:
        handled.append(_COUNT.iterations)
        return request

    async def stats(request: bytes, context: grpc.aio.ServicerContext) -> bytes:
        return json.dumps([_COUNT.steps_to(h) for h in handled]).encode()

    handlers = {
        "Echo": grpc.unary_unary_rpc_method_handler(echo),
        "Stats": grpc.unary_unary_rpc_method_handler(stats),
    }
    server = grpc.aio.server()
    server.add_generic_rpc_handlers((grpc.method_handlers_generic_handler(_SERVICE, handlers),))
    port = server.add_insecure_port("127.0.0.1:0")
    await server.start()
    print(port, flush=True)
    # Lifeline: the measuring process holds our stdin; EOF ends the server.
    await asyncio.get_running_loop().run_in_executor(None, sys.stdin.read)
    await server.stop(0)


async def _measure(port: int, calls: int, gap_s: float) -> dict[str, float]:
    _COUNT.time_select(asyncio.get_running_loop())
    async with grpc.aio.insecure_channel(f"127.0.0.1:{port}") as ch:
        echo = ch.unary_unary(f"/{_SERVICE}/Echo")
        for _ in range(20):  # connect and warm up
            await echo(b"x")
        reply_steps = []
        for _ in range(calls):
            await asyncio.sleep(gap_s)
            await echo(b"x")
            reply_steps.append(_COUNT.steps_to(_COUNT.iterations))
        request_steps = json.loads(await ch.unary_unary(f"/{_SERVICE}/Stats")(b""))[-calls:]
    return {
        "calls": calls,
        "request_steps": float(statistics.median(request_steps)),
        "reply_steps": float(statistics.median(reply_steps)),
        "grpc_version": grpc.__version__,  # type: ignore[dict-item]
    }


def measure(calls: int = 200, gap_s: float = 0.005) -> dict[str, float]:
    """Start the counting server, measure, stop it (blocking; run it in a
    process of its own)."""
    _COUNT.install()
    proc = subprocess.Popen(
        [sys.executable, "-m", "controlplane.bench.loopsteps", "--serve"],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert proc.stdout is not None
        port = int(proc.stdout.readline())
        return asyncio.run(_measure(port, calls, gap_s))
    finally:
        assert proc.stdin is not None
        proc.stdin.close()
        try:
            proc.wait(10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def main() -> None:
    """``--serve``: the server side; otherwise measure and print JSON."""
    if "--serve" in sys.argv:
        _COUNT.install()
        asyncio.run(_serve())
    else:
        print(json.dumps(measure()))


if __name__ == "__main__":
    main()
