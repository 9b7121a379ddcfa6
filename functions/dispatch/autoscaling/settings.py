"""Function autoscaling's typed configuration: the `galaxy serve dispatch`
flags (``AutoscaleConfig``) and the Dispatch-wide settings read from them
(``AutoscaleSettings``). The one place the autoscaler's defaults are
written: ``KpaConfig``'s defaults, the Dispatch flags and the simulator's
keep-alive all read them from here; ``kpaconfig.function_kpa`` merges them
with a function's own spec fields."""

from __future__ import annotations

import argparse
from dataclasses import dataclass

from controlplane.runtime import config
from controlplane.runtime.config import Config, setting

GROUP = "function autoscaling"


class AutoscaleConfig(Config):
    """The `galaxy serve dispatch` flags of function autoscaling (the
    defaults of ``AutoscaleSettings``)."""

    autoscale: bool = setting(
        True,
        "never scale instances down or to zero (min_scale still applies only when on)",
        flag="--no-autoscale",
        group=GROUP,
    )
    autoscale_tick_ms: int = setting(
        2000, "autoscaler period, ms (as Knative's KPA)", ge=1, group=GROUP
    )
    stable_window_s: float = setting(
        60.0, "KPA stable window; the panic window is a tenth of it", gt=0, group=GROUP
    )
    scale_to_zero_grace_s: float = setting(
        30.0, "minimum idle time before the last instance goes", ge=0, group=GROUP
    )
    target_utilization: float = setting(
        1.0, "fraction of a function's concurrency to aim for", gt=0, group=GROUP
    )
    keepalive: str = setting(
        "fixed",
        "keep-alive policy: fixed, or the hybrid histogram of 'Serverless in the Wild' (ATC'20)",
        choices=("fixed", "hybrid"),
        group=GROUP,
    )
    keepalive_s: float = setting(
        0.0,
        "idle time an instance is kept with --keepalive fixed (0: the KPA window and grace decide)",
        ge=0,
        group=GROUP,
    )


#: the defaults, for ``AutoscaleSettings`` and ``KpaConfig``
DEFAULTS = AutoscaleConfig()


@dataclass(frozen=True)
class AutoscaleSettings:
    """Dispatch-wide autoscaling settings (per-function ones come from the spec)."""

    enabled: bool = DEFAULTS.autoscale
    tick_s: float = DEFAULTS.autoscale_tick_ms / 1000.0
    stable_window_s: float = DEFAULTS.stable_window_s
    scale_to_zero_grace_s: float = DEFAULTS.scale_to_zero_grace_s
    target_utilization: float = DEFAULTS.target_utilization
    keepalive: str = DEFAULTS.keepalive
    keepalive_s: float = DEFAULTS.keepalive_s

    @classmethod
    def from_args(cls, args: argparse.Namespace) -> AutoscaleSettings:
        """From the `galaxy serve dispatch` flags (see add_arguments)."""
        c = config.from_args(AutoscaleConfig, args)
        return cls(
            enabled=c.autoscale,
            tick_s=c.autoscale_tick_ms / 1000.0,
            stable_window_s=c.stable_window_s,
            scale_to_zero_grace_s=c.scale_to_zero_grace_s,
            target_utilization=c.target_utilization,
            keepalive=c.keepalive,
            keepalive_s=c.keepalive_s,
        )
