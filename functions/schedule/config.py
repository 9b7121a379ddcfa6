"""Schedule's configuration: the one place its defaults live (the flags of
`galaxy serve schedule`, the in-process test cluster and the simulator's
Galaxy model all read them from here)."""

from __future__ import annotations

from pydantic import field_validator

from controlplane.runtime.config import Config, setting
from controlplane.runtime.resources import Res


class ScheduleConfig(Config):
    """How a Schedule instance places instances."""

    probe_d: int = setting(
        2, "candidate nodes compared per placement (power of d choices)", ge=1, le=64
    )
    probe_cache: bool = setting(
        True, "probe every candidate on every placement (ablation of the probe cache)"
    )
    probe_ttl_ms: float = setting(200.0, "how long a probe answer is trusted, ms", ge=0)
    exact_partition: bool = setting(
        True,
        "trust this instance's own view of its partition (it is the only allocator there; "
        "node agents push frees): probe only nodes whose view is in doubt. Off: probe "
        "before every reservation unless a probe answer is cached (the ablation's G step)",
    )
    max_attempts: int = setting(
        3,
        "rounds of candidates (retries after a node agent's RESOURCE_EXHAUSTED included) "
        "before a placement fails",
        ge=1,
        le=32,
    )
    max_pending: int = setting(
        10_000,
        "placements in progress at once; beyond, Schedule answers RESOURCE_EXHAUSTED "
        "(Dispatch spills to the next instance)",
        ge=1,
        le=10_000_000,
    )
    credits: bool = setting(
        True,
        "capacity credits: lend Dispatch instances small slices of nodes' free capacity "
        "(functions/schedule/credits.py), so a start that fits one skips the Schedule hop. "
        "Off (--no-credits): grant none",
    )
    credit_cpu_millis: int = setting(1000, "CPU of one credit's slice, millicores", ge=1)
    credit_memory_mib: int = setting(2048, "memory of one credit's slice, MiB", ge=1)
    credit_ttl_ms: float = setting(30_000.0, "how long a holder may use a credit, ms", gt=0)
    credit_grace_ms: float = setting(
        2_000.0, "how long a credit's hold outlives its holder's use of it (late reports), ms", ge=0
    )
    credits_per_holder: int = setting(
        4, "credits one Dispatch instance may hold from this instance at once", ge=0, le=64
    )
    scoring: str = setting(
        "model_locality",
        "placement scoring term (functions/schedule/scoring.py registry); model_locality "
        "is least_loaded for a function without a model, least_loaded to ignore caches",
    )

    @field_validator("scoring")
    @classmethod
    def _known_term(cls, v: str) -> str:
        from functions.schedule.scoring import lookup

        lookup(v)
        return v

    @property
    def credit_slice(self) -> Res:
        """The resources of one credit."""
        return Res(self.credit_cpu_millis, self.credit_memory_mib)

    @property
    def probe_ttl_s(self) -> float:
        """The probe TTL in seconds."""
        return self.probe_ttl_ms / 1000.0
