"""Leader election among controllers, and fenced scale targets.

Several controllers may run against one etcd; one leads. ``LeaderElector``
holds the leader key (``PREFIX/leader``) with a lease: created with a
compare-and-swap (only if absent), kept alive every ttl/3. Followers watch
the key and campaign when it is deleted, which etcd does when the leader's
lease expires, so a follower takes over within the lease TTL of the
leader's last keepalive. The key's store revision when it was won is the
leader's *term*: it grows with every election.

A leader considers itself leader only until ``ttl - margin`` after the last
keepalive it sent that was acknowledged; past that its lease may be gone.
That alone cannot stop a leader that was paused (GC, SIGSTOP) in the middle
of an action, so every scale target is committed through ``ScaleLedger``
with a compare-and-swap on the kind's key, and a new leader rewrites every
key when it takes over: a deposed leader's commit then fails, and no scale
action is applied twice.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

from statestore import EventType, LeaseNotFound, StateStore, StoreError, StoreUnavailable

log = logging.getLogger(__name__)

DEFAULT_PREFIX = "/galaxy/controller/"
DEFAULT_TTL_S = 3.0


@dataclass(frozen=True)
class LeaderInfo:
    """Who leads: as stored in the leader key."""

    id: str
    address: str
    term: int = 0


class LeaderElector:
    """Campaigns for ``prefix + "leader"``; see the module docstring.

    on_change(leading) is called whenever this controller gains or loses
    leadership. prepare(), when given, is awaited once the key is won and
    the term known, before this controller counts as leader (bounded by a
    third of the TTL): a new leader loads its predecessor's state there, so
    no call is answered and no scale decision taken from an empty view.
    """

    def __init__(
        self,
        store: StateStore,
        me: LeaderInfo,
        *,
        prefix: str = DEFAULT_PREFIX,
        ttl_s: float = DEFAULT_TTL_S,
        on_change: Callable[[bool], None] | None = None,
        prepare: Callable[[], Awaitable[None]] | None = None,
    ) -> None:
        if ttl_s < 1:
            raise ValueError("ttl_s must be >= 1 (etcd grants whole seconds)")
        self.store = store
        self.me = me
        self.key = prefix + "leader"
        self.ttl_s = ttl_s
        self.on_change = on_change
        self.prepare = prepare
        self._leader: LeaderInfo | None = None
        self._leader_known = asyncio.Event()
        self.term = 0
        self.lease: int | None = None
        self._valid_until = 0.0
        self._task: asyncio.Task[None] | None = None
        self.elected = asyncio.Event()

    @property
    def leader(self) -> LeaderInfo | None:
        """The current leader as last seen (self included), or None."""
        return self._leader

    @leader.setter
    def leader(self, who: LeaderInfo | None) -> None:
        self._leader = who
        if who is None:
            self._leader_known.clear()
        else:
            self._leader_known.set()

    async def wait_leader(self, timeout_s: float) -> LeaderInfo | None:
        """The leader, waiting up to timeout_s for an election to end."""
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self._leader_known.wait(), timeout_s)
        return self._leader

    @property
    def is_leader(self) -> bool:
        """True while this controller holds a lease it knows is alive."""
        return self.lease is not None and time.monotonic() < self._valid_until

    def start(self) -> None:
        """Start campaigning in the background."""
        if self._task is None:
            self._task = asyncio.create_task(self._run(), name="leader-election")

    async def stop(self, resign: bool = True) -> None:
        """Stop; with resign, give the key up at once so a follower need not
        wait for the TTL."""
        task, self._task = self._task, None
        if task is not None:
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)
        lease = self.lease
        self._lose()
        if resign and lease is not None:
            with contextlib.suppress(StoreError):
                await self.store.revoke_lease(lease)

    # -- internals ----------------------------------------------------------

    def _value(self) -> bytes:
        return json.dumps({"id": self.me.id, "address": self.me.address}).encode()

    @staticmethod
    def _decode(value: bytes, version: int) -> LeaderInfo | None:
        try:
            d = json.loads(value)
            return LeaderInfo(str(d["id"]), str(d["address"]), version)
        except (ValueError, KeyError, TypeError):
            return None

    def _lose(self) -> None:
        was = self.lease is not None
        self.lease = None
        self._valid_until = 0.0
        self.elected.clear()
        if was:
            log.warning("controller %s is no longer the leader (term %d)", self.me.id, self.term)
            if self.on_change is not None:
                self.on_change(False)

    async def _run(self) -> None:
        delay = 0.1
        while True:
            try:
                await self._campaign()
                delay = 0.1
            except StoreError as e:
                self._lose()
                log.warning("leader election: state store unavailable: %s", e)
                await asyncio.sleep(delay)  # backoff before trying the store again
                delay = min(delay * 2, self.ttl_s)

    async def _campaign(self) -> None:
        # Watch first, then read: a deletion between the two is not missed.
        async with self.store.watch_prefix(self.key) as watch:
            kv = await self.store.get(self.key)
            if kv is None:
                lease = await self.store.grant_lease(self.ttl_s)
                sent = time.monotonic()
                if await self.store.compare_and_swap(self.key, 0, self._value(), lease=lease):
                    await self._lead(lease, sent, watch)
                    return
                with contextlib.suppress(StoreError):
                    await self.store.revoke_lease(lease)
                kv = await self.store.get(self.key)
            if kv is not None:
                self.leader = self._decode(kv.value, kv.version)
            async for ev in watch:
                if ev.key != self.key:
                    continue
                if ev.type is EventType.DELETE:
                    self.leader = None
                    return  # campaign again
                self.leader = self._decode(ev.value, ev.version)

    async def _lead(self, lease: int, sent: float, watch: Any) -> None:
        kv = await self.store.get(self.key)
        if kv is None or self._decode(kv.value, kv.version) is None:
            return
        # The key is never written again while held, so its version stays
        # the term for everyone who reads it.
        self.term = kv.version
        if self.prepare is not None:
            # Not leader yet: calls meanwhile wait for a leader or get
            # UNAVAILABLE, and retry. The validity still counts from before
            # the win, so a slow prepare cannot stretch the lease.
            try:
                await asyncio.wait_for(self.prepare(), self.ttl_s / 3)
            except Exception as e:  # leading from a partial view beats not leading
                log.warning("preparing to lead (term %d) failed: %r", kv.version, e)
        self.lease = lease
        self._valid_until = sent + self.ttl_s * 0.9
        self.leader = LeaderInfo(self.me.id, self.me.address, self.term)
        log.info(
            "controller %s leads (term %d, lease ttl %.0fs)", self.me.id, self.term, self.ttl_s
        )
        self.elected.set()
        if self.on_change is not None:
            self.on_change(True)
        keepalive = asyncio.create_task(self._keepalive(lease))
        watcher = asyncio.create_task(self._watch_lost(watch))
        try:
            await asyncio.wait({keepalive, watcher}, return_when=asyncio.FIRST_COMPLETED)
        finally:
            for t in (keepalive, watcher):
                t.cancel()
            await asyncio.gather(keepalive, watcher, return_exceptions=True)
            self._lose()

    async def _keepalive(self, lease: int) -> None:
        while True:
            await asyncio.sleep(self.ttl_s / 3)  # the keepalive period
            while True:
                sent = time.monotonic()
                left = self._valid_until - sent
                if left <= 0:
                    log.warning("leader lease of %s not refreshed in time", self.me.id)
                    return
                try:
                    # Bounded by the validity left: past it we must step down.
                    await asyncio.wait_for(self.store.refresh_lease(lease), left)
                except LeaseNotFound:
                    return  # expired: someone else may lead already
                except (StoreUnavailable, TimeoutError) as e:
                    log.info("leader lease refresh failed, retrying: %r", e)
                    await asyncio.sleep(0.05)  # brief backoff before the retry
                    continue
                self._valid_until = sent + self.ttl_s * 0.9
                break

    async def _watch_lost(self, watch: Any) -> None:
        async for ev in watch:
            if ev.key != self.key:
                continue
            if ev.type is EventType.DELETE:
                return
            who = self._decode(ev.value, ev.version)
            if who is None or who.id != self.me.id:
                return


class Fenced(Exception):
    """A newer leader has written the scale targets: this one must stop."""


class ScaleLedger:
    """Committed scale targets, one key per kind (``prefix + "scale/KIND"``),
    and a log of applied actions (``prefix + "actions/"``).

    Every write is a compare-and-swap against the version this controller
    last wrote or adopted, so two controllers can never both commit from the
    same starting point.
    """

    def __init__(self, store: StateStore, prefix: str = DEFAULT_PREFIX) -> None:
        self.store = store
        self.prefix = prefix
        self._versions: dict[str, int] = {}
        self._seq = 0
        self.term = 0
        #: The action ids of the targets adopted, by kind ("" if none recorded).
        self.adopted: dict[str, str] = {}

    def _key(self, kind: str) -> str:
        return f"{self.prefix}scale/{kind}"

    async def adopt(self, term: int, leader_id: str) -> dict[str, int]:
        """Take the targets over for ``term``: rewrite every key (fencing off
        the previous leader) and return the committed targets by kind."""
        self.term = term
        out: dict[str, int] = {}
        self._versions = {}
        self.adopted = {}
        for kv in await self.store.get_prefix(self.prefix + "scale/"):
            kind = kv.key.rsplit("/", 1)[-1]
            version, value = kv.version, kv.value
            while True:
                rec = json.loads(value)
                rec.update(term=term, leader=leader_id)
                new = json.dumps(rec).encode()
                if await self.store.compare_and_swap(kv.key, version, new):
                    break
                cur = await self.store.get(kv.key)  # the old leader wrote in between
                if cur is None:
                    break
                version, value = cur.version, cur.value
            after = await self.store.get(kv.key)
            if after is not None:
                self._versions[kind] = after.version
                rec = json.loads(after.value)
                out[kind] = int(rec["desired"])
                self.adopted[kind] = str(rec.get("action", ""))
        return out

    async def commit(
        self, kind: str, desired: int, *, code: str, reason: str, leader_id: str, action: str = ""
    ) -> None:
        """Commit a new target for kind (decided as ``action``, an
        ``actions.ActionId``); raises ``Fenced`` if another leader wrote
        since this one adopted."""
        key = self._key(kind)
        expected = self._versions.get(kind, 0)
        rec = {
            "action": action,
            "kind": kind,
            "desired": desired,
            "term": self.term,
            "leader": leader_id,
            "code": code,
            "reason": reason,
            "at": time.time(),
        }
        value = json.dumps(rec).encode()
        if not await self.store.compare_and_swap(key, expected, value):
            # A deposed leader may have created the key after this one
            # adopted (adopt rewrites only the keys that existed): an older
            # term's write is overwritten, which fences it off in turn,
            # instead of fencing this leader off the kind for its whole term.
            if not await self._reclaim(kind):
                raise Fenced(f"scale target of {kind} was changed by another controller")
            if not await self.store.compare_and_swap(key, self._versions[kind], value):
                raise Fenced(f"scale target of {kind} was changed by another controller")
        kv = await self.store.get(key)
        if kv is None or kv.value != value:
            raise Fenced(f"scale target of {kind} was changed by another controller")
        self._versions[kind] = kv.version
        self._seq += 1
        log_key = f"{self.prefix}actions/{self.term:020d}-{self._seq:06d}-{kind}"
        await self.store.put(log_key, value)

    async def _reclaim(self, kind: str) -> bool:
        """Whether kind's key, written since this leader last saw it, holds
        an older term's record (or is gone): then its version is taken as
        the one to replace."""
        kv = await self.store.get(self._key(kind))
        if kv is None:
            self._versions[kind] = 0
            return True
        try:
            term = int(json.loads(kv.value).get("term", 0))
        except (ValueError, TypeError, AttributeError):
            term = 0  # unreadable: not a newer leader's
        if term >= self.term:
            return False
        self._versions[kind] = kv.version
        return True

    async def still_mine(self, kind: str) -> bool:
        """Whether kind's target is still the one this controller last
        committed or adopted (read just before applying it: a new leader
        that adopted meanwhile has rewritten it)."""
        kv = await self.store.get(self._key(kind))
        return kv is not None and kv.version == self._versions.get(kind)

    async def actions(self) -> list[dict[str, Any]]:
        """The applied-action log, oldest first."""
        kvs = await self.store.get_prefix(self.prefix + "actions/")
        return [json.loads(kv.value) for kv in kvs]
