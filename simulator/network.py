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

import random
from dataclasses import asdict, dataclass


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
    hop in one model does not shift another model's random stream)."""

    __slots__ = ("_rand", "base", "cfg", "jitter", "tail_p", "tail_s")

    def __init__(self, cfg: NetworkConfig, seed: int) -> None:
        if min(cfg.base_s, cfg.jitter_s, cfg.tail_s) < 0:
            raise ValueError("network delays must be >= 0")
        if not 0 <= cfg.tail_p <= 1:
            raise ValueError("tail_p must be a probability")
        self.cfg = cfg
        self.base, self.jitter = cfg.base_s, cfg.jitter_s
        self.tail_p, self.tail_s = cfg.tail_p, cfg.tail_s
        self._rand = random.Random(seed).random

    def hop(self) -> float:
        """One-way delay of one message."""
        d = self.base + self.jitter * self._rand()
        if self.tail_p and self._rand() < self.tail_p:
            d += self.tail_s
        return d

    def bounds(self) -> tuple[float, float]:
        """The smallest and largest possible hop delay."""
        hi = self.base + self.jitter + (self.tail_s if self.tail_p else 0.0)
        return self.base, hi
