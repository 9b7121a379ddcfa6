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
  agent (one probe per node at a time), and the probe's answer decides for
  every create waiting on that node:

  - answered within ``probe_timeout_s``: the agent is well, the creates wait on;
  - answered later (``late``): the agent is alive but starved (a loaded
    node, an engine spending minutes on its imports beside it): the creates
    wait on, as for an answer in time;
  - not answered at all (``NO_ANSWER``): every create waiting there is given
    up. How long a probe waits for its answer is bounded by the creates'
    own limits (``begin``'s ``limit_s``, the runtime's startup timeout: a
    start that could not end sooner anyway) and ``patience_s``; a create
    begun without a limit keeps the old rule (no answer within
    ``probe_timeout_s``: given up).

The caller then tries another node for the same instance id and stops the
start on the lost node (best effort; the agent's orphan check is the
backstop). A slow start on a live agent is never given up: the agent
answers its probe, late or not. A stopped agent (SIGSTOP, a hung host) is
declared dead by ClusterMgr within its dead-node timeout, which gives its
creates up without waiting for the probe; an agent process that is gone
refuses the probe's connection, an answer of ``None`` at once.
"""

from __future__ import annotations

import enum
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
#: A probe answered within this is answered in time; later, ``late`` (the
#: creates wait on all the same); for creates begun without a limit, the
#: probe's deadline. As long as ClusterMgr's dead-node timeout (3 heartbeats of 1 s): an agent
#: that busy would be declared dead too. With 1.5 s, on 2 cores at a load
#: average of 25-30 (2026-11-29, `galaxy chaos --fault schedule --sandbox
#: process`), live agents starting sandboxes missed it and their starts
#: were given up and made again elsewhere: more load, not less.
PROBE_TIMEOUT_S = 3.0


class Verdict(enum.Enum):
    """What a probe's answer says of its agent."""

    ANSWERED = "answered"  # within probe_timeout_s
    LATE = "late"  # after it: alive, starved
    NO_ANSWER = "no_answer"  # none within the probe's deadline


@dataclass
class _Node(Generic[K]):
    waiting: set[K] = field(default_factory=set)
    heard_at: float = float("-inf")
    probing: bool = False


class CreateWatch(Generic[K]):
    """The creates in flight, by node (see module docstring)."""

    def __init__(
        self,
        clock: Clock,
        check_s: float = CHECK_S,
        probe_timeout_s: float = PROBE_TIMEOUT_S,
        patience_s: float | None = None,
    ) -> None:
        if check_s <= 0 or probe_timeout_s <= 0:
            raise ValueError("check_s and probe_timeout_s must be > 0")
        if patience_s is not None and patience_s < probe_timeout_s:
            raise ValueError("patience_s must be at least probe_timeout_s")
        self.clock = clock
        self.check_s = check_s
        self.probe_timeout_s = probe_timeout_s
        #: a probe waits at most this long for its answer (None: as long as
        #: its node's creates' limits allow)
        self.patience_s = patience_s
        #: probes answered after probe_timeout_s (the creates waited on)
        self.late_answers = 0
        self._nodes: dict[str, _Node[K]] = {}
        self._node_of: dict[K, str] = {}
        self._since: dict[K, float] = {}
        #: when each create's limit ends (absent: begun without one)
        self._until: dict[K, float] = {}

    def __len__(self) -> int:
        return len(self._node_of)

    def begin(self, key: K, node_id: str, limit_s: float | None = None) -> None:
        """A create ``key`` was sent to ``node_id``'s agent; ``limit_s``: the
        longest it may take (the runtime's startup timeout, the call's
        deadline), which bounds how long a probe waits for a late answer."""
        if limit_s is not None and limit_s <= 0:
            raise ValueError("limit_s must be > 0")
        self._nodes.setdefault(node_id, _Node()).waiting.add(key)
        self._node_of[key] = node_id
        now = self.clock.now()
        self._since[key] = now
        if limit_s is not None:
            self._until[key] = now + limit_s

    def end(self, key: K) -> None:
        """``key`` finished (answered, failed, given up or cancelled)."""
        node_id = self._node_of.pop(key, None)
        self._since.pop(key, None)
        self._until.pop(key, None)
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

    def probe_deadline_s(self, node_id: str) -> float:
        """How long the probe of ``node_id`` that ``probe_due`` asked for
        may wait for its answer: until the last of the limits of the creates
        waiting there (at most ``patience_s``, at least ``probe_timeout_s``);
        ``probe_timeout_s`` when none of them has a limit."""
        n = self._nodes.get(node_id)
        ends = [self._until[k] for k in n.waiting if k in self._until] if n else []
        if not ends:
            return self.probe_timeout_s
        left = max(ends) - self.clock.now()
        if self.patience_s is not None:
            left = min(left, self.patience_s)
        return max(left, self.probe_timeout_s)

    def verdict(self, took_s: float | None) -> Verdict:
        """A probe answered after ``took_s`` seconds (None: not at all)."""
        if took_s is None:
            return Verdict.NO_ANSWER
        return Verdict.ANSWERED if took_s <= self.probe_timeout_s else Verdict.LATE

    def probed(self, node_id: str, took_s: float | None) -> list[K]:
        """The outcome of a probe ``probe_due`` asked for: answered after
        ``took_s`` seconds, or None when not within its deadline
        (``probe_deadline_s``); the creates to give up (``NO_ANSWER``: only
        when it did not answer at all)."""
        n = self._nodes.get(node_id)
        if n is None:
            return []
        n.probing = False
        verdict = self.verdict(took_s)
        if verdict is not Verdict.NO_ANSWER:
            # Late or not, the agent lives: its creates wait on.
            self.late_answers += verdict is Verdict.LATE
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
