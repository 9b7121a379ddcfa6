"""``leader_only``: the one rule that sends a controller RPC to the leader.

A follower forwards the call (with the caller's token, so the leader judges
it again) and returns the leader's answer, so a client or an instance may
talk to any controller. The servicer provides ``_forwarded``.
"""

from __future__ import annotations

import functools
from collections.abc import Awaitable, Callable
from typing import Any

Handler = Callable[[Any, Any, Any], Awaitable[Any]]


def leader_only(method: Handler) -> Handler:
    """Run ``method`` on the leading controller (see the module docstring)."""
    name = method.__name__

    @functools.wraps(method)
    async def wrapper(self: Any, request: Any, context: Any) -> Any:
        forwarded = await self._forwarded(name, request, context)
        if forwarded is not None:
            return forwarded
        return await method(self, request, context)

    return wrapper
