"""The network model: bounds, seeding, connection cost."""

import pytest

from simulator.network import PROFILES, Network, NetworkConfig


def test_hops_stay_within_jitter_bounds_and_are_seeded():
    cfg = NetworkConfig(base_s=1e-4, jitter_s=5e-5, tail_p=0.01, tail_s=1e-3)
    net = Network(cfg, seed=3)
    lo, hi = net.bounds()
    xs = [net.hop() for _ in range(50_000)]
    assert lo == 1e-4 and hi == pytest.approx(1e-4 + 5e-5 + 1e-3)
    assert all(lo <= x <= hi for x in xs)
    assert sum(1 for x in xs if x > 1e-4 + 5e-5) == pytest.approx(500, rel=0.25)
    same, other = Network(cfg, seed=3), Network(cfg, seed=4)
    assert xs == [same.hop() for _ in range(50_000)]
    assert xs != [other.hop() for _ in range(50_000)]


def test_no_jitter_is_constant():
    net = Network(NetworkConfig(base_s=2e-4, jitter_s=0.0), seed=1)
    assert {net.hop() for _ in range(100)} == {2e-4}


def test_bad_parameters_are_refused():
    with pytest.raises(ValueError):
        Network(NetworkConfig(base_s=-1), seed=1)
    with pytest.raises(ValueError):
        Network(NetworkConfig(tail_p=2), seed=1)
    assert set(PROFILES) >= {"datacenter", "loopback"}
