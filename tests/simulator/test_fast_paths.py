"""The simulator's fast paths give what the plain code gives: hop delays
computed in numpy chunks, the clock the policies read, the event loop."""

import random

import pytest

from simulator.engine import Sim
from simulator.network import CHUNK, PROFILES, Network, NetworkConfig


def plain_hops(cfg: NetworkConfig, seed: int, n: int) -> list[float]:
    """Hop by hop, as the model defines them (see ``Network``)."""
    draw = random.Random(seed).random
    out = []
    for _ in range(n):
        d = cfg.base_s + cfg.jitter_s * draw()
        if cfg.tail_p and draw() < cfg.tail_p:
            d += cfg.tail_s
        out.append(d)
    return out


@pytest.mark.parametrize(
    "cfg",
    [
        PROFILES["datacenter"],
        PROFILES["loopback"],
        NetworkConfig(1e-4, 5e-5, 0.3, 1e-3),
        NetworkConfig(2e-4, 0.0),
    ],
)
@pytest.mark.parametrize("seed", [0, 8, 12345, 2**40])
def test_chunked_hops_are_the_plain_hops_bit_for_bit(cfg, seed):
    net = Network(cfg, seed)
    n = 2 * CHUNK + 17  # across chunk boundaries
    assert [net.hop() for _ in range(n)] == plain_hops(cfg, seed, n)


def test_the_policies_clock_reads_simulated_time():
    sim, seen = Sim(), []
    sim.at(2.5, lambda _: seen.append(sim.clock.now()))
    sim.run(until=4.0)
    assert seen == [2.5] and sim.clock.now() == sim.now == 4.0


def test_an_event_in_the_past_is_refused():
    sim = Sim()
    sim.at(1.0, lambda _: sim.at(0.5, print))
    with pytest.raises(ValueError, match="in the past"):
        sim.run()


def test_stop_ends_the_run_after_the_current_event():
    sim, seen = Sim(), []

    def stop(_: object) -> None:
        seen.append("stop")
        sim.stop()

    sim.at(1.0, stop)
    sim.at(1.0, seen.append, "after")
    sim.run(
        arrivals=iter([([0.5, 3.0], [1, 2], [0.0, 0.0])]), on_arrival=lambda f, d: seen.append(f)
    )
    assert seen == [1, "stop"] and sim.pending() == 1
