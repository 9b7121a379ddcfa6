"""Garbage-collector pauses are timed into galaxy_gc_pause_seconds."""

import gc

import pytest
from prometheus_client import REGISTRY

from controlplane.runtime import metrics


def _count(gen: str) -> float:
    v = REGISTRY.get_sample_value("galaxy_gc_pause_seconds_count", {"generation": gen})
    return v or 0.0


@pytest.mark.slow
def test_every_collection_is_timed_once():
    metrics.watch_gc()
    metrics.watch_gc()  # idempotent: one callback, not two
    assert gc.callbacks.count(metrics._on_gc) == 1
    before = _count("2")
    gc.collect()
    assert _count("2") == before + 1
    total = REGISTRY.get_sample_value("galaxy_gc_pause_seconds_sum", {"generation": "2"})
    assert total is not None and total > 0
