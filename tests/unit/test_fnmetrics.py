"""Per-function metrics: the label budget admits up to its bound and then
aggregates under _other (counted, never dropped, no eviction); the instance
collector counts what its Dispatch reports, once."""

from __future__ import annotations

from prometheus_client import CollectorRegistry

from controlplane.runtime.fnmetrics import OTHER, FunctionInstances, LabelBudget


def test_budget_admits_then_aggregates_and_keeps_the_admitted() -> None:
    b = LabelBudget(max_functions=2)
    assert b.labels("a", "f1", "f1-00001") == ("a", "f1", "f1-00001")
    assert b.labels("", "f2", "f2-00001") == ("default", "f2", "f2-00001")
    assert b.labels("a", "f3", "f3-00001") == (OTHER, OTHER, OTHER)
    assert b.overflowed == 1
    # Admitted functions keep their own series, new revisions included.
    assert b.labels("a", "f1", "f1-00002") == ("a", "f1", "f1-00002")
    assert b.overflowed == 1


def test_instances_collector_counts_once_and_aggregates_overflow() -> None:
    budget = LabelBudget(max_functions=1)
    coll = FunctionInstances(budget)
    coll.sources.append(
        lambda: [
            ("team-a", "echo", "echo-00001", "ready", 2),
            ("team-a", "echo", "echo-00001", "starting", 1),
            ("team-b", "big", "big-00003", "ready", 3),
            ("team-c", "other", "other-00001", "ready", 4),
        ]
    )
    reg = CollectorRegistry()
    reg.register(coll)
    v = reg.get_sample_value
    assert v("galaxy_function_instances", {"namespace": "team-a", "function": "echo",
             "revision": "echo-00001", "state": "ready"}) == 2  # fmt: skip
    assert v("galaxy_function_instances", {"namespace": OTHER, "function": OTHER,
             "revision": OTHER, "state": "ready"}) == 7  # fmt: skip
    total = sum(
        s.value for m in reg.collect() for s in m.samples if s.name == "galaxy_function_instances"
    )
    assert total == 10  # every instance once
