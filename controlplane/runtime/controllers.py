"""Talking to one of several controllers (`galaxy up --ha`).

A controller address may list several controllers, comma-separated
("h1:p1,h2:p2"). Any of them answers every call (a follower forwards to the
leader), so a caller only needs one that is up: ``call`` tries the one that
answered last and moves on to the next on UNAVAILABLE (that controller is
down, or no controller leads for a moment). Which one answered last is
remembered per address list, for the whole process, so every caller in a
process prefers the same controller.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import grpc

from controlplane.runtime import rpc
from galaxy.v1 import controller_pb2_grpc

# address list -> index of the controller that answered last
_preferred: dict[tuple[str, ...], int] = {}


def split(addresses: str | Sequence[str]) -> list[str]:
    """The controller addresses in a comma-separated string (or a list of
    them), blanks dropped, order kept."""
    parts = addresses.split(",") if isinstance(addresses, str) else list(addresses)
    return [p.strip() for p in parts if p and p.strip()]


def ordered(addresses: str | Sequence[str]) -> list[str]:
    """The addresses, the one that answered last first."""
    addrs = split(addresses)
    if not addrs:
        return []
    i = _preferred.get(tuple(addrs), 0) % len(addrs)
    return addrs[i:] + addrs[:i]


async def call(
    pool: rpc.ChannelPool,
    addresses: str | Sequence[str],
    method: str,
    request: Any,
    timeout_s: float | None = None,
    metadata: Sequence[tuple[str, str]] | None = None,
) -> Any:
    """``Controller.<method>(request)`` on the first controller that answers.

    Each controller is tried once, in ``ordered`` order, passing over one
    that is UNAVAILABLE; any other error, or UNAVAILABLE from the last one,
    is raised (``grpc.aio.AioRpcError``).
    """
    addrs = split(addresses)
    if not addrs:
        raise ValueError("no controller address")
    kwargs: dict[str, Any] = {} if timeout_s is None else {"timeout": timeout_s}
    if metadata:
        kwargs["metadata"] = tuple(metadata)
    order = ordered(addrs)
    for k, address in enumerate(order):
        try:
            async with pool.stub(address, controller_pb2_grpc.ControllerStub) as s:
                reply = await getattr(s, method)(request, **kwargs)
        except grpc.aio.AioRpcError as e:
            if e.code() != grpc.StatusCode.UNAVAILABLE or k == len(order) - 1:
                raise
            continue
        if len(addrs) > 1:
            _preferred[tuple(addrs)] = addrs.index(address)
        return reply
    raise AssertionError("unreachable")  # pragma: no cover
