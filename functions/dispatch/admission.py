"""Admission by SLO class at overload: which requests a function turns away
when it cannot serve them all in time (pure: no I/O, no clock; the caller
passes the numbers it has).

A request carries a priority (``RoutingHint.priority``; the gateway's
``x-galaxy-priority`` header, ``controlplane.runtime.sloclass``): negative
is *sheddable*, zero *standard*, positive *critical*, the three
criticalities of the Gateway API Inference Extension. Under overload the
lowest class goes first, rather than whoever arrived last:

* **Predicted wait**: requests queued for the function (waiting in its
  engines plus waiting in Dispatch for a slot) divided by the rate its
  fleet takes them off the queues (first tokens per second, from the
  instances' TTFT histograms). A request whose class's TTFT budget -- the
  function's ``ttft_ms`` times the class's factor -- is shorter than the
  predicted wait is shed: it would miss its target anyway, and its place
  in the queue would make later ones miss theirs. Sheddable requests are
  shed as soon as the wait passes the target, standard ones at
  ``standard_factor`` times it, critical ones never on a prediction.
* **Queue bound**: past its share of the function's queue bound a class is
  shed: sheddable at half; standard and critical only at the bound itself,
  where Dispatch refuses any request (so traffic that names no class is
  refused exactly as before).

Without a TTFT target or a rate (nothing served recently) there is no
prediction and only the queue bound applies: a function is never shed on a
guess. The answer names why, and Dispatch returns it as RESOURCE_EXHAUSTED
(the gateway: 429 with Retry-After).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import NamedTuple

from controlplane.runtime.sloclass import class_of
from functions.dispatch.autoscaling.llmsignal import ScalingSignal


class Verdict(NamedTuple):
    """Whether to admit, and if not why (for the caller's status)."""

    admit: bool
    reason: str = ""


ADMIT = Verdict(True)


@dataclass(frozen=True)
class Admission:
    """The shedding rule (module docstring); one serves every function."""

    #: a standard request's TTFT budget is the function's target times this
    standard_factor: float = 4.0
    #: the fraction of the queue bound past which each class is shed
    sheddable_share: float = 0.5
    #: (1: standard requests meet the bound itself, as before classes:
    #: traffic that names no class sees no change)
    standard_share: float = 1.0

    def __post_init__(self) -> None:
        if not self.standard_factor >= 1:
            raise ValueError("standard_factor: must be >= 1")
        if not 0 < self.sheddable_share <= self.standard_share <= 1:
            raise ValueError("sheddable_share, standard_share: 0 < sheddable <= standard <= 1")

    def budget_s(self, priority: int, ttft_s: float) -> float:
        """The longest predicted wait a request of this class is admitted
        with (inf: not shed on a prediction)."""
        if priority > 0 or ttft_s <= 0:
            return math.inf
        return ttft_s if priority < 0 else ttft_s * self.standard_factor

    def decide(
        self,
        priority: int,
        *,
        ttft_s: float,
        queued: int,
        first_tokens_per_s: float,
        queue_bound: int,
    ) -> Verdict:
        """Admit or shed one request of ``priority`` to a function with TTFT
        target ``ttft_s`` (0: none), ``queued`` requests waiting for it,
        served at ``first_tokens_per_s`` recently (0: unknown) and whose
        queue holds at most ``queue_bound``."""
        cls = class_of(priority)
        share = (
            1.0 if priority > 0 else self.sheddable_share if priority < 0 else self.standard_share
        )
        # At a share of the whole bound the queue's own bound refuses (counted
        # as queue_full, as for a function of no class): nothing to add here.
        if priority <= 0 and share < 1.0 and queued >= share * queue_bound:
            return Verdict(
                False,
                f"{cls} request shed: {queued} requests queued, over {share:.0%} of the "
                f"bound of {queue_bound}; retry later",
            )
        budget = self.budget_s(priority, ttft_s)
        if math.isinf(budget) or first_tokens_per_s <= 0 or queued <= 0:
            return ADMIT
        wait = queued / first_tokens_per_s
        if wait <= budget:
            return ADMIT
        return Verdict(
            False,
            f"{cls} request shed: predicted wait {wait:.2f}s ({queued} queued, "
            f"{first_tokens_per_s:.1f} served/s) over the class's {budget:.2f}s TTFT budget; "
            "retry later",
        )


def shed_demand(signal: ScalingSignal, value: float, shed: int) -> float:
    """The autoscaler's observed value with the requests shed since its last
    tick counted as demand: a shed request is unmet load, and a fleet that
    stopped seeing it would shrink and shed more. Counted for the metrics
    that count requests (concurrency, queue); the engine metrics (KV use,
    tokens/s) have no per-request unit to add it in."""
    return value + shed if signal.metric in ("concurrency", "queue") else value
