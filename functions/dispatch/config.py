"""Dispatch's configuration: the one place its defaults live (flags of
`galaxy serve dispatch`, the servicer's defaults and the simulator's Galaxy
model read them from here). The function autoscaler's flags are in
``functions.dispatch.autoscale``."""

from __future__ import annotations

from controlplane.runtime.config import setting
from statestore.records import RecordsConfig


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


#: The defaults, for code that takes them one by one.
DEFAULTS = DispatchConfig()
