"""The garbage-collector tuning every server process applies once ready."""

import gc
from collections.abc import Iterator

import pytest

from controlplane.runtime import config, gctune
from controlplane.runtime.config import ConfigError, GcConfig


@pytest.fixture
def restore_gc() -> Iterator[None]:
    thresholds = gc.get_threshold()
    yield
    gc.unfreeze()
    gc.set_threshold(*thresholds)


@pytest.mark.slow
def test_tune_freezes_the_heap_and_sets_thresholds(restore_gc):
    state = gctune.tune(GcConfig(gc_threshold0=5000, gc_threshold1=15, gc_threshold2=30))
    assert gc.get_threshold() == (5000, 15, 30) == state.thresholds
    # The test interpreter's modules are all there: far more than a few.
    assert state.frozen > 10_000 and gc.get_freeze_count() > 10_000
    # Frozen objects are no longer collected: a full collection walks less.
    assert len(gc.get_objects(generation=2)) < state.frozen


def test_switched_off_leaves_the_interpreter_alone(restore_gc):
    gc.set_threshold(700, 10, 10)
    state = gctune.tune(GcConfig(gc_freeze=False, gc_threshold0=0))
    assert state == gctune.GcState(frozen=0, thresholds=(700, 10, 10))


def test_bad_thresholds_name_the_flag():
    with pytest.raises(ConfigError, match="--gc-threshold1"):
        config.build(GcConfig, gc_threshold1=0)
    with pytest.raises(ConfigError, match="--gc-threshold0"):
        config.build(GcConfig, gc_threshold0=-1)


def test_flags():
    cfg = GcConfig(gc_freeze=False, gc_threshold0=0)
    assert config.to_flags(cfg) == ["--no-gc-freeze", "--gc-threshold0", "0"]
