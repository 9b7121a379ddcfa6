"""Skipping the rounds of idle functions held by the KPA's zero gate
(``FunctionScaling.skip_holds``) gives the results of deciding every round."""

from __future__ import annotations

from typing import Any

import pytest

from controlplane.runtime.compiled import is_compiled
from simulator import autoscale
from simulator import workload as wl
from simulator.autoscale import FunctionScaling
from simulator.runner import run_one
from simulator.system import SimConfig


def _run(system: str, seed: int, cal: Any, keep_alive_s: float) -> tuple[dict[str, Any], int]:
    # Sparse traffic over many functions: most rounds are idle holds.
    w = wl.poisson(6.0, 240.0, n_functions=40, mean_duration_s=0.2, seed=seed)
    r = run_one(system, w, SimConfig(nodes=30, seed=seed, keep_alive_s=keep_alive_s), cal)
    r.pop("perf")
    return r, _SKIPPED[-1]


_SKIPPED: list[int] = []


@pytest.mark.skipif(is_compiled(autoscale), reason="patches a class of the compiled build")
@pytest.mark.parametrize(
    ("system", "seed", "keep"), [("galaxy", 1, 0.0), ("galaxy", 2, 45.0), ("knative", 3, 0.0)]
)
def test_skipped_holds_give_the_results_of_deciding_every_round(
    system, seed, keep, cal, monkeypatch
):
    flush = FunctionScaling.flush

    def counted(self: FunctionScaling) -> None:
        _SKIPPED.append(self.skipped)
        flush(self)

    monkeypatch.setattr(FunctionScaling, "flush", counted)
    fast, skipped = _run(system, seed, cal, keep)
    init = FunctionScaling.__init__

    def plain_init(self: FunctionScaling, *a: Any, **k: Any) -> None:
        init(self, *a, **k)
        self.skip_holds = False

    monkeypatch.setattr(FunctionScaling, "__init__", plain_init)
    plain, none = _run(system, seed, cal, keep)
    assert none == 0 and skipped > 100
    assert fast["counts"]["instances_started"] > 0
    assert fast == plain
