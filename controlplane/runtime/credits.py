"""Capacity credits: the values both sides of the protocol exchange (Schedule
grants, ``functions.schedule.credits``; Dispatch uses,
``functions.dispatch.credits``). Pure values, no I/O; they live here because
services do not import each other."""

from __future__ import annotations

from dataclasses import dataclass

from controlplane.runtime.resources import Res


@dataclass(frozen=True)
class Grant:
    """A credit as sent to its holder: create instances needing at most
    ``resources`` in total on ``node_id`` (its agent at ``address``) within
    ``ttl_s`` of receipt."""

    credit_id: str
    node_id: str
    address: str
    resources: Res
    ttl_s: float


@dataclass(frozen=True)
class Use:
    """A holder's report: an instance needing ``need`` was created from the
    credit; ``node_seq`` is the node's status seq when it became ready."""

    credit_id: str
    need: Res
    node_seq: int = 0
