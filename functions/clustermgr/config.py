"""ClusterMgr's configuration: the one place its defaults live."""

from __future__ import annotations

from pydantic import model_validator

from controlplane.runtime.config import Config, setting
from statestore.leased import DEFAULT_RECORD_TTL_S


class ClusterMgrConfig(Config):
    """Heartbeats and node liveness."""

    heartbeat_ms: float = setting(
        1000.0, "heartbeat interval told to node agents, milliseconds", gt=0
    )
    dead_after_ms: float | None = setting(
        None,
        "a node silent this long is declared dead, milliseconds (default 3 x --heartbeat-ms)",
        gt=0,
    )
    state: str = setting(
        "memory://",
        "state store for records written behind: memory:// (per process, the embedded "
        "default) or etcd://host:port[,host:port]",
        max_length=1024,
    )
    record_ttl_s: float = setting(
        DEFAULT_RECORD_TTL_S,
        "lease of the records this process writes: they disappear this long after it dies",
        gt=0,
        le=3600,
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
