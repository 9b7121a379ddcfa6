"""Schedule's configuration: the one place its defaults live (the flags of
`galaxy serve schedule`, the in-process test cluster and the simulator's
Galaxy model all read them from here)."""

from __future__ import annotations

from pydantic import field_validator

from controlplane.runtime.config import Config, setting


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
    scoring: str = setting(
        "least_loaded",
        "placement scoring term (functions/schedule/scoring.py registry)",
    )

    @field_validator("scoring")
    @classmethod
    def _known_term(cls, v: str) -> str:
        from functions.schedule.scoring import lookup

        lookup(v)
        return v

    @property
    def probe_ttl_s(self) -> float:
        """The probe TTL in seconds."""
        return self.probe_ttl_ms / 1000.0
