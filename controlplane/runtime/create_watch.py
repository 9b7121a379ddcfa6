"""Which CreateInstance calls in flight to give up because their node is
lost. Pure: no I/O, an injected clock.

A CreateInstance answers when the instance is ready, so its deadline covers
the function's startup timeout (seconds to a minute). A start sent to a
node agent that is then stopped (SIGSTOP, a hung host) or declared dead
would wait that long, past the deadline of the requests it is for, though
another node could serve them in a second. Schedule and Dispatch (creates
from capacity credits) therefore watch their creates by node:

- the node is declared dead (ClusterMgr's ``OP_REMOVE`` / ``KIND_NODE_DEAD``):
  every create waiting on it is given up (``NODE_DEAD``);
- a create has waited ``check_s`` and nothing was heard from its node's
  agent for that long (no reply, no answered probe): the caller probes the
  agent (one probe per node at a time); a probe not answered within its
  deadline gives up every create waiting on that node (``NO_ANSWER``).

The caller then tries another node for the same instance id and stops the
start on the lost node (best effort; the agent's orphan check is the
backstop). A slow start on a live agent is never given up: the agent
answers its probe.
"""

from __future__ import annotations

from collections.abc import Hashable
from dataclasses import dataclass, field
from typing import Generic, TypeVar

from controlplane.runtime.clock import Clock

K = TypeVar("K", bound=Hashable)  # a create, as the caller names it

#: Reasons a create is given up (the retry metrics' ``reason`` label).
NODE_DEAD = "node_dead"
NO_ANSWER = "no_answer"
#: A create waiting this long with nothing heard from its agent: probe it.
CHECK_S = 2.0
#: The probe's deadline: not answered within it, the agent is not answering.
#: As long as ClusterMgr's dead-node timeout (3 heartbeats of 1 s): an agent
#: that busy would be declared dead too. With 1.5 s, on 2 cores at a load
#: average of 25-30 (2026-11-29, `galaxy chaos --fault schedule --sandbox
#: process`), live agents starting sandboxes missed it and their starts
#: were given up and made again elsewhere: more load, not less.
PROBE_TIMEOUT_S = 3.0


@dataclass
class _Node(Generic[K]):
    waiting: set[K] = field(default_factory=set)
    heard_at: float = float("-inf")
    probing: bool = False


class CreateWatch(Generic[K]):
    """The creates in flight, by node (see module docstring)."""

    def __init__(self, clock: Clock, check_s: float = CHECK_S) -> None:
        if check_s <= 0:
            raise ValueError("check_s must be > 0")
        self.clock = clock
        self.check_s = check_s
        self._nodes: dict[str, _Node[K]] = {}
        self._node_of: dict[K, str] = {}
        self._since: dict[K, float] = {}

    def __len__(self) -> int:
        return len(self._node_of)

    def begin(self, key: K, node_id: str) -> None:
        """A create ``key`` was sent to ``node_id``'s agent."""
        self._nodes.setdefault(node_id, _Node()).waiting.add(key)
        self._node_of[key] = node_id
        self._since[key] = self.clock.now()

    def end(self, key: K) -> None:
        """``key`` finished (answered, failed, given up or cancelled)."""
        node_id = self._node_of.pop(key, None)
        self._since.pop(key, None)
        if node_id is None:
            return
        n = self._nodes[node_id]
        n.waiting.discard(key)
        if not n.waiting and not n.probing:
            del self._nodes[node_id]  # one entry per node with creates in flight

    def heard(self, node_id: str) -> None:
        """The node's agent answered something just now (a create's reply)."""
        n = self._nodes.get(node_id)
        if n is not None:
            n.heard_at = self.clock.now()

    def probe_due(self, key: K) -> str | None:
        """The node to probe now on behalf of create ``key`` (asked every
        ``check_s`` while it waits), or None: it has not waited ``check_s``,
        its agent was heard from within ``check_s``, or a probe of that node
        is already under way (its outcome decides for every create there).
        A node returned here counts as being probed until ``probed``."""
        node_id = self._node_of.get(key)
        if node_id is None:
            return None
        now, n = self.clock.now(), self._nodes[node_id]
        if n.probing or now - self._since[key] < self.check_s:
            return None
        if now - n.heard_at < self.check_s:
            return None
        n.probing = True
        return node_id

    def probed(self, node_id: str, answered: bool) -> list[K]:
        """The outcome of a probe ``probe_due`` asked for; the creates to
        give up (``NO_ANSWER``) when the agent did not answer in time."""
        n = self._nodes.get(node_id)
        if n is None:
            return []
        n.probing = False
        if answered:
            n.heard_at = self.clock.now()
            lost: list[K] = []
        else:
            lost = list(n.waiting)
        for key in lost:
            self.end(key)
        if not n.waiting:
            self._nodes.pop(node_id, None)
        return lost

    def node_dead(self, node_id: str) -> list[K]:
        """``node_id`` was declared dead: the creates to give up (``NODE_DEAD``)."""
        n = self._nodes.get(node_id)
        if n is None:
            return []
        lost = list(n.waiting)
        for key in lost:
            self.end(key)
        return lost
