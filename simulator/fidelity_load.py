"""The fidelity check's load generator on a DispatchStream, as the real one.

The bench load generator (like the SDK) sends its Dispatch requests as
messages on one ``Dispatch.DispatchStream`` and Dispatch answers on it,
each side batching what queued while its previous write was in flight
(``controlplane.runtime.batches``). The shared front end
(``simulator.frontend``) charges a request ``dispatch.dispatch``, the cost
of a request that has its stream to itself (a read and a write of its own:
independent clients at a modest rate, as in ``galaxy simulate``). Here the
32 requests in flight of one generator share writes, so the request leg and
the reply leg are ``simulator.galaxy.streams.Stream`` s: Dispatch pays
``dispatch.message`` per request plus ``dispatch.stream_write`` per read and
per write of a batch; the generator's CPU per request is the real run's
measured figure (``client_cost_s``, its writes included).
"""

from __future__ import annotations

import math
from collections.abc import Callable

from simulator.engine import Station
from simulator.galaxy import GalaxyModel
from simulator.galaxy.streams import Stream
from simulator.system import Env


class DispatchStreamClient:
    """The load generator's DispatchStream to the one Dispatch instance."""

    def __init__(self, env: Env, model: GalaxyModel, client: Station,
                 client_s: Callable[[], float]) -> None:  # fmt: skip
        self.sim, self.front = env.sim, model.front
        dispatch = next(iter(model.control.dfs.values())).station
        self.s_client = client_s
        self.s_message = env.op("dispatch.message")
        write = env.op("dispatch.stream_write")
        free: Callable[[], float] = lambda: 0.0  # noqa: E731 (the generator's: in client_s)
        self.out = Stream(env.sim, env.net.hop, client, dispatch, free, write)
        self.back = Stream(env.sim, env.net.hop, dispatch, client, write, free, reply=True)
        #: called with the time each answer reaches the generator
        self.on_reply: Callable[[float], None] = lambda _: None
        self._reply = self._replied

    def request(self, fn: int, duration: float) -> None:
        """Send a request for fn now (its lease is held for duration)."""
        now = self.sim.now
        self.front.requests += 1
        self.out.send(
            now, self.s_client(), self.s_message(), self.front._dispatch, (fn, now, duration)
        )

    def granted(self, _: float) -> None:
        """Dispatch answered a request now (``Recorder.on_grant``): the
        answer goes back on the stream, the generator sees it on arrival."""
        self.back.send(self.sim.now, 0.0, 0.0, self._reply, None, follows=True)

    def _replied(self, _: object) -> None:
        self.on_reply(self.sim.now)


class Driver:
    """The load generator's schedule: sends ``total`` requests (the first
    ``warmup`` not measured) over ``functions`` functions, each holding
    its lease ``hold_s``; counts the answers and stops the simulation at
    the last."""

    def __init__(self, env: Env, client: DispatchStreamClient, total: int, warmup: int,
                 functions: int, hold_s: float) -> None:  # fmt: skip
        self.env, self.client = env, client
        self.total, self.warmup = total, warmup
        self.functions, self.hold_s = functions, hold_s
        self.sent = 0
        self.t_first = math.inf
        self.t_last = 0.0
        self.granted = 0

    def send(self, _: object = None) -> None:
        """Send the next request now (none past ``total``)."""
        if self.sent >= self.total:
            return
        if self.sent == self.warmup:
            self.t_first = self.env.sim.now
            self.env.rec.warmup_s = self.env.sim.now
        self.client.request(self.sent % self.functions, self.hold_s)
        self.sent += 1

    def on_grant(self, now: float) -> None:
        """An answer reached the generator at now."""
        self.granted += 1
        if self.granted > self.warmup:
            self.t_last = max(self.t_last, now)
        if self.granted >= self.total:
            self.env.sim.stop()  # the phase is over (heartbeats would go on)
