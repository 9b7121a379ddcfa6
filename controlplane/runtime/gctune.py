"""Keeps Python's cycle collector out of a server's tail latency.

A collection stops the whole process. A young one is tens of microseconds;
a full one walks every tracked object of the heap, and a Galaxy process
starts with hundreds of thousands of them (grpc, protobuf, pydantic and our
own modules), none of which will ever be garbage. ``tune`` runs once the
process is ready: it collects what start-up left behind, then freezes the
survivors (``gc.freeze``: moved to a permanent generation that collections
skip), and sets the configured thresholds. What is made later (routers,
instances, channels) is still collected.
"""

from __future__ import annotations

import gc
import logging
from dataclasses import dataclass

from controlplane.runtime.config import GcConfig

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class GcState:
    """What ``tune`` did: objects frozen and the thresholds now in force."""

    frozen: int
    thresholds: tuple[int, int, int]


def tune(cfg: GcConfig) -> GcState:
    """Apply ``cfg`` to this interpreter (see the module docstring)."""
    if cfg.gc_threshold0 > 0:
        gc.set_threshold(cfg.gc_threshold0, cfg.gc_threshold1, cfg.gc_threshold2)
    if cfg.gc_freeze:
        # Collect first: garbage frozen now would never be freed.
        gc.collect()
        gc.freeze()
    state = GcState(frozen=gc.get_freeze_count(), thresholds=gc.get_threshold())
    log.info("gc: %d objects frozen, thresholds %s", state.frozen, state.thresholds)
    return state
