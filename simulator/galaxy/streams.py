"""Messages on a batched multiplexed stream, timed as production sends them.

Production sends a credit start's CreateInstance to the node agent as a
message on one ``NodeAgent.InstanceStream`` per agent, and the agent answers
on the same stream (``controlplane.runtime.agent_streams``,
``controlplane.nodeagent.instance_stream``). Each side sends what queued
while its previous write was in flight as one write, the first message with
the others in its ``more`` field; nothing waits to fill a batch
(``controlplane.runtime.batches``). So a write's cost is shared by the
messages that queued behind the one before it: under load a message costs
little more than its own handling, at low load each pays a write and a read.

``Stream`` is one direction of such a stream (one sender process, one
receiver process). Charged: the sender a write (``write``) per batch plus
each message's own sending work; the receiver a read (``read``) per batch
plus each message's handling. Charging these as unary calls (the Schedule
path's measured client and server CPU per call) made the simulated Dispatch
spend about 850 us per credit start where the real one spends 300 us at its
maximum rate (docs/simulator-costs.md).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from controlplane.runtime.batches import MAX_BATCH
from simulator.engine import Sim, Station

#: One queued message: its sending work, its handling work on the receiver,
#: and what to call with which argument once it is handled.
Message = tuple[float, float, Callable[[Any], None], Any]


class Stream:
    """One direction of a batched stream between two simulated processes."""

    __slots__ = ("_hop", "batches", "messages", "queued", "read", "receiver", "reply",
                 "sender", "sim", "write", "writing")  # fmt: skip

    def __init__(
        self,
        sim: Sim,
        hop: Callable[[], float],
        sender: Station,
        receiver: Station,
        write: Callable[[], float],
        read: Callable[[], float],
        reply: bool = False,
    ) -> None:
        self.sim, self._hop = sim, hop
        self.sender, self.receiver = sender, receiver
        self.write, self.read = write, read
        #: answers to calls the receiver made (resumed as replies by its loop)
        self.reply = reply
        #: a write is in flight (messages sent meanwhile queue for the next)
        self.writing = False
        self.queued: list[Message] = []
        #: writes made and messages sent (their ratio: the mean batch)
        self.batches = 0
        self.messages = 0

    def send(self, t: float, send_s: float, handle_s: float, then: Callable[[Any], None],
             arg: Any, follows: bool = False) -> None:  # fmt: skip
        """Send a message at t (now, or the end of the sender's current
        job): at once if no write is in flight, else with the next write.
        follows: the sender's task that ends at t sends it (it runs ahead of
        the sender's queued work), else it is a new job of the sender."""
        msg = (send_s, handle_s, then, arg)
        if self.writing:
            self.queued.append(msg)
        else:
            self._write(t, [msg], follows)

    def _write(self, t: float, batch: list[Message], follows: bool) -> None:
        self.batches += 1
        self.messages += len(batch)
        self.writing = True
        cost = self.write()
        handle = self.read()
        for send_s, handle_s, _, _ in batch:
            cost += send_s
            handle += handle_s
        st = self.sender
        end = st.then(t, cost) if follows else st.finish(t, cost)
        # The write is done when its completion comes back through the
        # sender's event loop (as the answer to a call does): behind the
        # work queued there, whose messages go with the next write.
        self.sim.reply(end, st, 0.0, self._written, None)
        arrive = end + self._hop()
        if self.reply:
            self.sim.reply(arrive, self.receiver, handle, self._handled, batch)
        else:
            self.sim.stage(arrive, self.receiver, handle, self._handled, batch)

    def _written(self, _: object) -> None:
        self.writing = False
        if self.queued:
            batch, self.queued = self.queued[:MAX_BATCH], self.queued[MAX_BATCH:]
            self._write(self.sim.now, batch, True)  # the writing task goes on

    @staticmethod
    def _handled(batch: list[Message]) -> None:
        for _, _, then, arg in batch:
            then(arg)


def stream_costs(scale_up: float, agent_create: float, echo: dict[str, float]) -> dict[str, float]:
    """The stream charges of a credit start, from unary figures: a write or
    read is half the echo's client CPU per call (a call is a write and a
    read); a message's own work is the unary call's CPU less the call's
    write and read (the client's for Dispatch, the server's for an agent)."""
    client, server = echo["client_s"], echo["server_s"]
    return {
        "dispatch.stream_write": client / 2,
        "agent.stream_write": client / 2,
        "dispatch.credit_create": max(1e-6, scale_up - client),
        "agent.stream_create": max(1e-6, agent_create - server),
    }
