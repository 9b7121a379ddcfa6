"""Bounds shared by every instance's door of one node agent (``door.py``):
connections open at once, and the time a new connection has to show its
first admitted request head. Apart from the door so that the agent's
configuration can name the defaults without the door's metrics."""

from __future__ import annotations

import resource
from dataclasses import dataclass

#: Defaults of ``galaxy serve nodeagent --entry-max-connections`` and
#: ``--entry-head-timeout-s``.
MAX_CONNECTIONS = 4096
HEAD_S = 10.0
#: Descriptors the agent needs besides its doors' (gRPC, logs, instances'
#: pipes, cgroups, namespaces).
FD_MARGIN = 1024


@dataclass
class EntryLimits:
    """The bounds, and ``open``: connections open now across the doors."""

    max_connections: int = MAX_CONNECTIONS
    head_s: float = HEAD_S
    open: int = 0


def raise_fd_limit(max_connections: int) -> str | None:
    """Raise this process's soft limit on open files to its hard limit (as
    the Go runtime does for every program): each door connection holds two
    descriptors, and a soft limit of 1,024 (systemd's default) would refuse
    connections far below ``max_connections``. Returns a warning when even
    the hard limit is below what the bound needs, else None."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft != hard:
        resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
    need = 2 * max_connections + FD_MARGIN
    if hard != resource.RLIM_INFINITY and hard < need:
        return (
            f"open-file limit {hard} is below the {need} that --entry-max-connections "
            f"{max_connections} needs (two per connection, {FD_MARGIN} for the rest): "
            "lower the flag or raise the limit (`ulimit -n`, systemd's LimitNOFILE)"
        )
    return None
