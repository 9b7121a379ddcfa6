"""Dispatch's configuration: the one place its defaults live (flags of
`galaxy serve dispatch`, the servicer's defaults and the simulator's Galaxy
model read them from here). The function autoscaler's flags are in
``functions.dispatch.autoscale``."""

from __future__ import annotations

from pydantic import field_validator

from controlplane.runtime import llmpicker, scoring
from controlplane.runtime.config import setting
from functions.dispatch.backoff import BackoffConfig
from statestore.records import RecordsConfig

BACKOFF = BackoffConfig()


class DispatchConfig(RecordsConfig):
    """Leases, queues and spilling."""

    lease_ttl_ms: int = setting(
        300_000,
        "request timeout of functions whose spec sets none (request_timeout_ms): the longest "
        "wait for a slot and the life of its lease (a slot not Released is reclaimed), ms",
        ge=1,
        le=86_400_000,
    )
    max_queue: int = setting(
        10_000, "requests waiting per function before RESOURCE_EXHAUSTED", ge=1, le=10_000_000
    )
    max_spill: int = setting(
        2, "Schedule instances tried after the owner when it has no room", ge=0, le=64
    )

    credits: bool = setting(
        True,
        "capacity credits: ask Schedule instances for small slices of node capacity and create "
        "instances that fit one directly on the node (functions/dispatch/credits.py). "
        "Off (--no-credits): every start goes through Schedule",
    )
    credit_target: int = setting(
        4, "credits held at most while scale-ups happen (the bound on what is delegated)",
        ge=0, le=64,
    )  # fmt: skip
    credit_floor: int = setting(
        2,
        "credits held while scale-ups happen at all; between this and --credit-target the "
        "count follows demand: up at once when a start found no credit, down one per "
        "--credit-shrink-ms without (functions/dispatch/credit_demand.py)",
        ge=0,
        le=64,
    )
    credit_shrink_ms: float = setting(
        10_000.0,
        "one credit fewer is asked for after this long without a start short of one, ms",
        gt=0,
    )  # fmt: skip
    credit_renew_ms: float = setting(
        1_000.0, "a credit this close to its expiry is returned and replaced, ms", ge=0
    )
    credit_idle_ms: float = setting(
        60_000.0, "with no scale-up for this long, credits are returned, ms", gt=0
    )
    credit_max_starting: int = setting(
        0,
        "instances being created from one credit at once (0: no bound); more go to other "
        "credits or to Schedule, so a burst does not queue behind one node's sandbox starts",
        ge=0,
        le=1024,
    )
    llm_picker: str = setting(
        "llm",
        "how an instance of an LLM function (its runtime's `llm: true`) is picked per "
        "request: llm (queue, KV use, prefix and adapter affinity), least-request or "
        "round-robin (baselines; controlplane/runtime/llmpicker.py)",
        choices=llmpicker.POLICIES,
        env="GALAXY_LLM_PICKER",
    )
    scoring: str = setting(
        "least_loaded",
        "scoring term ranking the nodes this instance holds credit on (the registry "
        "Schedule places with, controlplane/runtime/scoring.py); set it as Schedule's",
    )

    start_backoff_after: int = setting(
        BACKOFF.after,
        "failed starts of a function in a row before its starts back off (one may be a node "
        "that died under it)",
        ge=1,
        le=1000,
    )
    start_backoff_base_ms: float = setting(
        BACKOFF.base_s * 1000.0,
        "first backoff of a function whose starts keep failing, ms (requests that only a "
        "start could serve fail at once meanwhile; functions/dispatch/backoff.py)",
        gt=0,
    )
    start_backoff_factor: float = setting(
        BACKOFF.factor, "each further failed start multiplies the backoff by this", ge=1.0
    )
    start_backoff_cap_ms: float = setting(
        BACKOFF.cap_s * 1000.0, "longest backoff between starts of a function, ms", gt=0
    )

    def start_backoff(self) -> BackoffConfig:
        """The start backoff's configuration from these flags."""
        return BackoffConfig(
            after=self.start_backoff_after,
            base_s=self.start_backoff_base_ms / 1000.0,
            factor=self.start_backoff_factor,
            cap_s=max(self.start_backoff_cap_ms, self.start_backoff_base_ms) / 1000.0,
        )

    @field_validator("scoring")
    @classmethod
    def _known_term(cls, v: str) -> str:
        scoring.lookup(v)
        return v


#: The defaults, for code that takes them one by one.
DEFAULTS = DispatchConfig()
