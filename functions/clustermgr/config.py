"""ClusterMgr's configuration: the one place its defaults live."""

from __future__ import annotations

from pydantic import model_validator

from controlplane.runtime.config import setting
from controlplane.runtime.membership import NODE_HEARTBEAT_MS
from functions.clustermgr.forwarding import COVERED_BEATS
from statestore.records import RecordsConfig

#: Heartbeat periods a node may miss before it is declared dead (unless
#: --dead-after-ms says otherwise); the simulator's model uses the same.
DEAD_AFTER_BEATS = 3


class ClusterMgrConfig(RecordsConfig):
    """Heartbeats and node liveness."""

    heartbeat_ms: float = setting(
        float(NODE_HEARTBEAT_MS), "heartbeat interval told to node agents, milliseconds", gt=0
    )
    covered_linger_ms: float | None = setting(
        None,
        "how long a node status may wait for company before it goes to Schedule when its "
        "change is work that Schedule instance placed itself (an instance starting or "
        "becoming ready: functions/clustermgr/forwarding.py), milliseconds (default "
        f"{COVERED_BEATS} x --heartbeat-ms; 0: at once)",
        ge=0,
    )
    dead_after_ms: float | None = setting(
        None,
        f"a node silent this long is declared dead, milliseconds (default {DEAD_AFTER_BEATS} "
        "x --heartbeat-ms)",
        gt=0,
    )

    @model_validator(mode="after")
    def _dead_after_a_beat(self) -> ClusterMgrConfig:
        if self.dead_after_ms is not None and self.dead_after_ms < self.heartbeat_ms:
            raise ValueError("--dead-after-ms must be at least --heartbeat-ms")
        return self

    @property
    def dead_after_s(self) -> float:
        """Silence after which a node is dead, seconds."""
        return (self.dead_after_ms or DEAD_AFTER_BEATS * self.heartbeat_ms) / 1000.0
