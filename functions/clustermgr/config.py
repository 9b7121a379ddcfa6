"""ClusterMgr's configuration: the one place its defaults live."""

from __future__ import annotations

from pydantic import model_validator

from controlplane.runtime.config import setting
from statestore.records import RecordsConfig


class ClusterMgrConfig(RecordsConfig):
    """Heartbeats and node liveness."""

    heartbeat_ms: float = setting(
        1000.0, "heartbeat interval told to node agents, milliseconds", gt=0
    )
    dead_after_ms: float | None = setting(
        None,
        "a node silent this long is declared dead, milliseconds (default 3 x --heartbeat-ms)",
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
        return (self.dead_after_ms or 3 * self.heartbeat_ms) / 1000.0
