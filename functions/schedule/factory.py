"""Schedule's policy objects from its typed configuration.

The one place a ``ScheduleConfig`` becomes a ``PlacementPolicy`` (with its
scoring term) and a ``CreditLedger``: the servicer (``main.from_config``)
and the simulator's Galaxy model both build them here, so a new scoring
term or a credit limit is simulated exactly as it runs.
"""

from __future__ import annotations

import random

from controlplane.runtime.clock import Clock
from functions.schedule import scoring
from functions.schedule.config import ScheduleConfig
from functions.schedule.credits import CreditLedger
from functions.schedule.policy import PlacementPolicy


def make_policy(
    cfg: ScheduleConfig,
    schedule_id: str = "",
    *,
    clock: Clock | None = None,
    rng: random.Random | None = None,
) -> PlacementPolicy:
    """The placement policy ``cfg`` describes (``clock``/``rng``: injected
    by the simulator; production's defaults otherwise)."""
    return PlacementPolicy(
        schedule_id,
        d=cfg.probe_d,
        probe_cache=cfg.probe_cache,
        probe_ttl_s=cfg.probe_ttl_s,
        max_attempts=cfg.max_attempts,
        clock=clock,
        rng=rng,
        score=scoring.lookup(cfg.scoring),
        exact=cfg.exact_partition,
    )


def make_ledger(
    cfg: ScheduleConfig, policy: PlacementPolicy, *, clock: Clock | None = None
) -> CreditLedger | None:
    """The credit ledger over ``policy`` (None with credits off)."""
    if not cfg.credits:
        return None
    return CreditLedger(
        policy,
        slice=cfg.credit_slice,
        ttl_s=cfg.credit_ttl_ms / 1000.0,
        grace_s=cfg.credit_grace_ms / 1000.0,
        max_per_holder=cfg.credits_per_holder,
        clock=clock,
    )
