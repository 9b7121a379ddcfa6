"""The network model: one-way latency per hop with bounded jitter.

A hop costs ``base_s`` plus a uniform jitter in ``[0, jitter_s]``; with
probability ``tail_p`` a hop also pays ``tail_s`` more (a retransmit or a
scheduling hiccup), so tails can be studied without unbounded noise. (What a
new connection costs -- CPU and handshake round trips -- is the models'
business: see ``simulator.galaxy.placement``.)

Profiles (all one-way): ``datacenter`` is an intra-datacenter network
(Pingmesh, Guo et al., SIGCOMM'15: intra-pod RTT p50 ~216 us, so ~100 us
one way and a few hundred us at the tail); ``loopback`` is one machine's
loopback interface (kernel only: the gRPC stack's CPU time is charged to the
stations at both ends, per the calibration).
"""

from __future__ import annotations

import itertools
import random
from collections.abc import Callable, Iterator
from dataclasses import asdict, dataclass

import numpy as np

#: hop delays drawn at a time (see ``Network``)
CHUNK = 4096


@dataclass(frozen=True)
class NetworkConfig:
    """Parameters of the network model (seconds)."""

    base_s: float = 100e-6
    jitter_s: float = 100e-6
    tail_p: float = 0.0
    tail_s: float = 0.0

    def as_dict(self) -> dict[str, float]:
        """For reports."""
        return asdict(self)


PROFILES: dict[str, NetworkConfig] = {
    "datacenter": NetworkConfig(100e-6, 100e-6, 0.001, 1e-3),
    "loopback": NetworkConfig(15e-6, 10e-6, 0.0, 0.0),
}


class Network:
    """Samples hop delays from a seeded generator of its own (so adding a
    hop in one model does not shift another model's random stream).

    A hop is ``base + jitter * u1``, plus ``tail_s`` when ``u2 < tail_p``
    (u2 drawn only when tail_p > 0), with u1, u2 successive draws of
    ``random.Random(seed).random()``. The simulator takes tens of millions
    of hops, so they are computed ``CHUNK`` at a time with numpy from the
    very same Mersenne Twister stream (numpy's ``RandomState`` continues
    Python's generator state and makes doubles the same way) and the same
    float operations: the same delays, bit for bit, as hop by hop.
    """

    __slots__ = ("_state", "base", "cfg", "hop", "jitter", "tail_p", "tail_s")

    def __init__(self, cfg: NetworkConfig, seed: int) -> None:
        if min(cfg.base_s, cfg.jitter_s, cfg.tail_s) < 0:
            raise ValueError("network delays must be >= 0")
        if not 0 <= cfg.tail_p <= 1:
            raise ValueError("tail_p must be a probability")
        self.cfg = cfg
        self.base, self.jitter = cfg.base_s, cfg.jitter_s
        self.tail_p, self.tail_s = cfg.tail_p, cfg.tail_s
        key = random.Random(seed).getstate()[1]
        self._state = np.random.RandomState()
        mt = np.array(key[:624], dtype=np.uint32)
        self._state.set_state(("MT19937", mt, int(key[624]), 0, 0.0))
        #: () -> the one-way delay of one message (the next of the stream)
        self.hop: Callable[[], float] = itertools.chain.from_iterable(self._chunks()).__next__

    def _chunks(self) -> Iterator[list[float]]:
        """The hop delays, CHUNK at a time (see the class docstring)."""
        while True:
            if self.tail_p:
                u = self._state.random_sample(2 * CHUNK)
                d = self.base + self.jitter * u[0::2]
                d[u[1::2] < self.tail_p] += self.tail_s
            else:
                d = self.base + self.jitter * self._state.random_sample(CHUNK)
            yield d.tolist()

    def bounds(self) -> tuple[float, float]:
        """The smallest and largest possible hop delay."""
        hi = self.base + self.jitter + (self.tail_s if self.tail_p else 0.0)
        return self.base, hi
