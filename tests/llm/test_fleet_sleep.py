"""The LLM fleet simulator with sleeping instances: it drives the same
``SleepPolicy`` as Dispatch. A burst, a lull longer than the KPA's stable
window, and the same burst again: with ``max_asleep`` the second burst wakes
instances (the profile's ``wake_s``) instead of loading weights again, and
the GPUs of sleeping instances are not counted as held."""

from __future__ import annotations

import dataclasses

import pytest

from simulator.llm_fleet import FleetSim, Outcome, policies
from simulator.llm_fleet_workload import LARGE, FleetShape, Job

#: (several simulated runs: about a second each on an idle core)
pytestmark = pytest.mark.slow
SHAPE = FleetShape(nodes=4)


def bursts() -> list[Job]:
    one = [Job(k / 12, 0, 500, 300) for k in range(240)]  # 20 s of 12 req/s
    return one + [dataclasses.replace(j, arrive=j.arrive + 300.0) for j in one]


def run(max_asleep: int) -> Outcome:
    galaxy = dataclasses.replace(policies(1.0, 0.1, 16.0)[0], max_asleep=max_asleep)
    return FleetSim(galaxy, 1, LARGE, SHAPE, seed=3).run(bursts())


def test_a_second_burst_wakes_sleeping_instances_instead_of_loading() -> None:
    plain, sleepy = run(0), run(4)
    assert plain.done == sleepy.done == 480 and plain.wakes == 0
    assert sleepy.wakes >= 2  # the scale-out of the second burst
    loads = sleepy.cold_loads + sleepy.warm_loads
    assert loads + sleepy.wakes == plain.cold_loads + plain.warm_loads
    # A wake is shorter than a load: the second burst's first tokens come sooner.
    assert sleepy.ttft_pct(50) < plain.ttft_pct(50) and sleepy.good > plain.good
    # Asleep, an instance holds no GPU: no more GPU-seconds than removing it.
    assert sleepy.gpu_s <= plain.gpu_s * 1.05


def test_an_instance_asleep_past_keep_asleep_is_removed() -> None:
    galaxy = dataclasses.replace(policies(1.0, 0.1, 16.0)[0], max_asleep=4, keep_asleep_s=30.0)
    o = FleetSim(galaxy, 1, LARGE, SHAPE, seed=3).run(bursts())
    assert o.wakes == 0  # gone before the second burst
