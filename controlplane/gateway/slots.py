"""The gateway's slot cache: a lease from Dispatch is kept after its request
ends and reused for the next request to the same target, so a warm function
costs no Dispatch call per request (as Knative's activator, which balances
over a revision's pods itself once they exist).

What may be reused, and for how long, is Dispatch's answer
(``InstanceAddr.hold_ms``): only a grant whose revision was not drawn from a
split (one revision gets all of the target's traffic), only while no request
waits for the function, and only for ``hold_ms`` from the Dispatch call; a
change of split waits in Dispatch until the holds granted before it have
lapsed (``functions/dispatch/revisions.py``, ``holds_lapse``). Here:

- The key is (function as routed, traffic tag, the caller's token): a lease
  serves only requests that would have made the same Dispatch call, so a
  caller never rides on another caller's authorization, and every new
  caller is judged by Dispatch as before.
- A lease is kept only after a clean exchange (the answer read to its end
  and written to the client): a client that went away, or an instance that
  failed, returns its slot at once.
- A kept lease idle for ``slot_idle_ms`` is released (deferred: it rides on
  the next Dispatch call or goes a few milliseconds later), so Dispatch
  counts an idle held slot as busy for those milliseconds only.
- An instance that cannot be reached drops every lease held on it; the
  request goes to Dispatch for another (retry before the first byte).
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass
from typing import Any

from controlplane.gateway.config import GatewayConfig
from controlplane.gateway.pd import Prepare
from controlplane.runtime.errors import GalaxyError
from controlplane.runtime.metrics import HELD_SLOTS, SLOT_CACHE
from controlplane.sdk.client import GalaxyClient
from controlplane.sdk.http import NotSent
from galaxy.v1 import dispatch_pb2

#: (function as routed, traffic tag, the caller's token or None)
Key = tuple[str, str, str | None]
_HIT, _MISS = SLOT_CACHE.labels("hit"), SLOT_CACHE.labels("miss")


@dataclass(eq=False)
class Held:
    """One lease and what the cache knows of it (loop times, seconds)."""

    addr: dispatch_pb2.InstanceAddr
    key: Key
    #: no new request starts on the lease after this (0: never held)
    until: float
    #: Dispatch's lease ends (a request on it must end by then)
    lease_end: float
    #: set by the user of the slot once its exchange completed cleanly
    reusable: bool = False
    #: requests started on it
    uses: int = 0
    timer: asyncio.TimerHandle | None = None


class SlotCache:
    """Leases held idle between requests, by key; see the module docstring."""

    def __init__(self, client: GalaxyClient, cfg: GatewayConfig) -> None:
        self.client = client
        self.enabled = cfg.slot_cache
        self.idle_s = cfg.slot_idle_ms / 1000.0
        self.max_per_function = cfg.slot_max_per_function
        self.max_total = cfg.slot_max
        self._idle: dict[Key, list[Held]] = {}
        self._per_function: dict[str, int] = {}
        #: leases held idle now; requests served on a held lease, and not
        self.held = 0
        self.hits = self.misses = 0
        self._tasks: set[asyncio.Task[Any]] = set()

    @asynccontextmanager
    async def slot(
        self,
        function: str,
        path: str,
        body: Callable[[], Awaitable[bytes | bytearray]],
        headers: dict[str, str],
        method: str,
        tag: str,
        token: str | None,
        hint: dispatch_pb2.RoutingHint | None = None,
        prepare: Prepare | None = None,
    ) -> AsyncIterator[tuple[Held, Any]]:
        """A slot for one request and the instance's response to it (its
        body unread; None for an emulated sandbox), as the SDK's
        ``granted``, from the cache when it holds one. body reads the
        request's body, once a slot is granted: a request Dispatch refuses
        (no such function, a token it does not accept) is answered without
        reading its body. Set ``reusable`` on
        the slot once the whole answer went out: it is kept for the next
        request; otherwise it is released when the block ends. ``hint``: an
        LLM request's, passed to Dispatch (which grants no hold for an LLM
        function, so its slots are never kept; any other function's are).
        ``prepare(addr, body, seconds left)``: the body to send to that
        instance (a disaggregated LLM request's prefill, ``pd.py``)."""
        client = self.client
        loop = asyncio.get_running_loop()
        deadline = loop.time() + client.timeout
        key: Key = (function, tag, token)
        # The gateway cannot tell an LLM function from its route (any
        # function may be named in an OpenAI body): Dispatch decides, and
        # grants an LLM function's requests no hold, so none is ever kept.
        cache = self.enabled
        failed: list[Held] = []
        h: Held | None = None
        attempts = 0
        try:
            while True:
                h = self._take(key, loop.time()) if cache else None
                if h is None:
                    t0 = loop.time()
                    addr = await client.dispatch(
                        function, deadline_s=max(deadline - t0, 0.001), tag=tag, token=token,
                        hold=cache, hint=hint,
                    )  # fmt: skip
                    attempts += 1
                    self.misses += 1
                    _MISS.inc()
                    # From before the call: the hold ends here no later than
                    # Dispatch counts on.
                    ttl = addr.lease_ttl_ms / 1000.0 if addr.lease_ttl_ms else client.timeout
                    h = Held(addr, key, t0 + addr.hold_ms / 1000.0, t0 + ttl)
                else:
                    self.hits += 1
                    _HIT.inc()
                cached = h.uses > 0
                h.uses += 1
                h.reusable = False
                if h.addr.address.startswith("emulated://"):
                    yield h, None  # no process to call; never kept
                    return
                limit = max(min(deadline, h.lease_end) - loop.time(), 0.001)
                data = await body()  # the caller's reader keeps it for a retry
                if prepare is not None:
                    data = await prepare(h.addr, data, limit)
                    limit = max(min(deadline, h.lease_end) - loop.time(), 0.001)
                try:
                    async with client.http.open(
                        h.addr.address, path, data, limit, method, headers, h.addr.lease_token
                    ) as resp:
                        yield h, resp
                        return
                except NotSent:
                    # The instance is gone: no lease on it is used again. Its
                    # slot is held while another is asked for (so the grant
                    # goes elsewhere), released below.
                    failed.append(h)
                    h = None
                    self._forget(failed[-1].addr.instance_id)
                    if cached:
                        continue  # a lease kept from before: ask Dispatch now
                    if not await client.failover_pause(attempts, deadline):
                        raise
        finally:
            if h is not None and not (cache and h.reusable and self._keep(h, loop.time())):
                failed.append(h)
            for f in failed:
                await self._release(f)

    def _take(self, key: Key, now: float) -> Held | None:
        """The most recently used idle lease of key that may still start a
        request (the warmest connection; the others idle out first)."""
        held = self._idle.get(key)
        while held:
            h = held.pop()
            self._count(h, -1)
            if h.timer is not None:
                h.timer.cancel()
            if h.until > now:
                return h
            self._release_soon(h)
        return None

    def _keep(self, h: Held, now: float) -> bool:
        """Hold h idle for the next request of its key, if its hold and the
        bounds allow."""
        left = h.until - now
        fn = h.key[0]
        if (
            left <= 0
            or self.held >= self.max_total
            or self._per_function.get(fn, 0) >= self.max_per_function
        ):
            return False
        self._idle.setdefault(h.key, []).append(h)
        self._count(h, 1)
        h.timer = asyncio.get_running_loop().call_later(
            self.idle_s if self.idle_s < left else left, self._expire, h
        )
        return True

    def _expire(self, h: Held) -> None:
        held = self._idle.get(h.key)
        if held is None or h not in held:
            return
        held.remove(h)
        if not held:
            del self._idle[h.key]
        self._count(h, -1)
        self._release_soon(h)

    def _forget(self, instance_id: str) -> None:
        """Release every idle lease on an instance that cannot be reached."""
        for key in list(self._idle):
            for h in [h for h in self._idle.get(key, ()) if h.addr.instance_id == instance_id]:
                if h.timer is not None:
                    h.timer.cancel()
                self._expire(h)

    def _count(self, h: Held, n: int) -> None:
        fn = h.key[0]
        left = self._per_function.get(fn, 0) + n
        if left > 0:
            self._per_function[fn] = left
        else:
            self._per_function.pop(fn, None)
        self.held += n
        HELD_SLOTS.inc(n)

    async def _release(self, h: Held) -> None:
        try:
            await self.client.release(h.addr, defer=True)
        except GalaxyError:
            pass  # its Dispatch is gone: the lease goes with it

    def _release_soon(self, h: Held) -> None:
        task = asyncio.get_running_loop().create_task(self._release(h))
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def close(self) -> None:
        """Release every held lease (before the client closes)."""
        for key in list(self._idle):
            for h in list(self._idle.get(key, ())):
                if h.timer is not None:
                    h.timer.cancel()
                self._expire(h)
        if self._tasks:
            await asyncio.gather(*self._tasks, return_exceptions=True)
