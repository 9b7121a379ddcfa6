"""Scoring terms by name; the term sees the function being placed."""

from __future__ import annotations

from controlplane.runtime.resources import Res
from functions.schedule import scoring
from functions.schedule.config import ScheduleConfig
from functions.schedule.main import from_config
from functions.schedule.policy import ProbeNodes, Reservation
from tests.schedule.test_policy import make


def test_a_registered_term_places_and_sees_the_function() -> None:
    seen: list[str] = []

    @scoring.register("test_prefer_n3")
    def prefer_n3(node, free, need, function):  # type: ignore[no-untyped-def]
        seen.append(function)
        return 1.0 if node.node_id == "n3" else 0.0

    try:
        # The configured name reaches the policy the component builds.
        comp = from_config(ScheduleConfig(scoring="test_prefer_n3", probe_d=8))
        assert comp.policy.score is prefer_n3

        policy, cluster, _ = make(8, Res(1000, 1024, 0), d=8, score=prefer_n3)
        pl = policy.begin(Res(100, 64, 0), "resnet")
        step = policy.advance(pl)
        while isinstance(step, ProbeNodes):
            for t in step.targets:
                policy.record_probe(pl, t.node_id, cluster.probe(t.node_id))
            step = policy.advance(pl)
        assert isinstance(step, Reservation)
        assert step.node_id == "n3"
        assert seen and set(seen) == {"resnet"}
    finally:
        del scoring.SCORES["test_prefer_n3"]
