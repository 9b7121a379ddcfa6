"""Durable function specs in the state store, served from memory.

Deploy and delete are the only synchronous writes in Galaxy: a user is told
"deployed" only once the spec is durable. Reads (Dispatch fetching a spec on
a function's first request, `galaxy status`) are served from an in-memory
copy, so the dispatch path never waits on the store: with etcd down,
deployed functions keep serving and only deploy/delete fail (UNAVAILABLE).
The copy is filled by this controller's own writes and by reads that reach
the store; a controller taking over leadership fills it from the store.

Revisions: a deploy that changes a function's spec writes the next revision
(``/galaxy/revisions/NAME/NNNNN``, immutable) and the function's record (the
latest spec, its revision number and the traffic split) in one transaction;
a deploy of an unchanged spec writes nothing new. The oldest revisions
beyond ``MAX_REVISIONS`` that no traffic target names are deleted.
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence

from controlplane.controller import placeable
from controlplane.runtime import revisions, validation
from controlplane.runtime import spec as specs
from controlplane.runtime.access import DEFAULT_NAMESPACE
from controlplane.runtime.errors import InvalidArgument, NotFound, PermissionDenied, Unavailable
from controlplane.runtime.quotas import NamespaceQuotas
from controlplane.runtime.validation import short
from galaxy.v1 import common_pb2
from statestore import StateStore, StoreUnavailable

PREFIX = "/galaxy/functions/"
REVISIONS = "/galaxy/revisions/"
#: Revisions kept per function (older ones no traffic names are deleted).
MAX_REVISIONS = 20


class FunctionStore:
    """Function specs keyed by name, versioned by the store's revision.

    max_functions bounds how many functions the cluster holds (a deploy of a
    new name beyond it is RESOURCE_EXHAUSTED), which also bounds the size of
    a listing (see validation.MAX_MESSAGE_BYTES); max_instances_per_function
    bounds a spec's max_scale and min_scale, max_reserved_instances the
    min_scale of all functions together; quotas bound each namespace
    (``controlplane.runtime.quotas``).
    """

    def __init__(
        self,
        store: StateStore,
        max_functions: int = validation.MAX_FUNCTIONS_DEFAULT,
        max_instances_per_function: int = validation.MAX_INSTANCES_PER_FUNCTION_DEFAULT,
        max_reserved_instances: int = validation.MAX_RESERVED_INSTANCES_DEFAULT,
        quotas: NamespaceQuotas | None = None,
        egress_namespaces: frozenset[str] = frozenset({"*"}),
    ) -> None:
        self.store = store
        self.quotas = quotas or NamespaceQuotas()
        #: namespaces whose functions may set ``egress`` ("*": every one)
        self.egress_namespaces = egress_namespaces
        self.max_functions = max_functions
        self.max_instances_per_function = max_instances_per_function
        self.max_reserved_instances = max_reserved_instances
        self._deploying = asyncio.Lock()
        self._cache: dict[str, common_pb2.FunctionSpec] = {}
        # True once the whole prefix has been read: the cache is then a full
        # (possibly slightly stale) listing, good enough while the store is down.
        self._complete = False

    async def deploy(
        self,
        spec: common_pb2.FunctionSpec,
        nodes: Sequence[common_pb2.Resources] = (),
    ) -> common_pb2.FunctionSpec:
        """Validate, fill defaults, write durably; returns the stored spec
        (a new revision when the spec changed, the current one otherwise).
        nodes: the capacities of the registered nodes (none known: empty),
        which a spec must fit (``placeable``) and the default quota is a
        share of."""
        stored = specs.with_defaults(spec)
        placeable.check_placeable(stored, nodes)
        stored.version = 0
        stored.revision = 0
        del stored.traffic[:]  # set with set_traffic only
        # One deploy at a time, so two new names cannot both take the last place.
        async with self._deploying:
            if not self._complete:
                await self.list()  # fills the cache with every stored function
            current = self._cache.get(stored.name)
            if current is None:
                validation.check_function_count(len(self._cache), self.max_functions)
            elif current.revision and _content(current) == _content(stored):
                return _copy(current)  # unchanged: no new revision
            ns = stored.namespace or DEFAULT_NAMESPACE
            if stored.egress and not ({"*", ns} & self.egress_namespaces):
                raise PermissionDenied(
                    f"egress: functions of namespace {ns} may not open connections "
                    "out of their sandbox (controller --egress-namespaces)"
                )
            elsewhere = sum(f.min_scale for n, f in self._cache.items() if n != stored.name)
            validation.check_instance_quota(
                stored, self.max_instances_per_function, elsewhere, self.max_reserved_instances
            )
            self.quotas.check(
                ns,
                (
                    f
                    for n, f in self._cache.items()
                    if n != stored.name and (f.namespace or DEFAULT_NAMESPACE) == ns
                ),
                stored,
                placeable.total(nodes),
                self.max_reserved_instances,
            )
            n = (current.revision if current is not None else 0) + 1
            if n > revisions.MAX_REVISION:
                raise InvalidArgument(f"function {short(stored.name)}: too many revisions")
            stored.revision = n
            if current is not None:
                stored.traffic.extend(current.traffic)
            rev_key = f"{REVISIONS}{stored.name}/{n:05d}"
            try:
                version = await self.store.put_many(
                    [(PREFIX + stored.name, stored.SerializeToString()),
                     (rev_key, stored.SerializeToString())]
                )  # fmt: skip
            except StoreUnavailable as e:
                raise Unavailable(f"state store unavailable, function not deployed: {e}") from e
            stored.version = version
            self._cache[stored.name] = _copy(stored)
            await self._prune(stored)
        return stored

    async def _prune(self, spec: common_pb2.FunctionSpec) -> None:
        """Delete revisions beyond MAX_REVISIONS that no traffic names."""
        oldest = spec.revision - MAX_REVISIONS
        if oldest < 1:
            return
        named = {t.revision for t in spec.traffic}
        keys = [
            f"{REVISIONS}{spec.name}/{n:05d}"
            for n in range(max(1, oldest - 10), oldest + 1)
            if n not in named
        ]
        try:
            await self.store.delete_many(keys)
        except StoreUnavailable:
            pass  # the next deploy tries again

    async def set_traffic(
        self, name: str, targets: list[common_pb2.TrafficTarget]
    ) -> common_pb2.FunctionSpec:
        """Replace a function's traffic split; returns its spec."""
        async with self._deploying:
            current = await self.get(name)
            revisions.check_targets(targets, current.revision)
            for i, t in enumerate(targets):
                if t.revision and await self._revision(name, t.revision) is None:
                    raise InvalidArgument(f"traffic[{i}].revision: {t.revision} was deleted")
            del current.traffic[:]
            current.traffic.extend(targets)
            current.version = 0
            try:
                current.version = await self.store.put(PREFIX + name, current.SerializeToString())
            except StoreUnavailable as e:
                raise Unavailable(f"state store unavailable, traffic not changed: {e}") from e
            self._cache[name] = _copy(current)
            return current

    async def _revision(self, name: str, n: int) -> common_pb2.FunctionSpec | None:
        try:
            kv = await self.store.get(f"{REVISIONS}{name}/{n:05d}")
        except StoreUnavailable as e:
            raise Unavailable(f"state store unavailable: {e}") from e
        return None if kv is None else _decode(kv.value, kv.version)

    async def get_revision(self, name: str) -> common_pb2.FunctionSpec:
        """A revision's spec, named NAME-NNNNN (what Dispatch routes), or NotFound."""
        base, n = revisions.split(name)
        spec = await self._revision(base, n) if n else None
        if spec is None:
            # A deleted function takes its revisions with it: a caller still
            # holding a revision name (a frontend's cached split) gets the
            # function's message, which says what to do.
            await self.get(base)
            raise NotFound(f"revision {short(name)} not found")
        spec.name = name
        del spec.traffic[:]
        return spec

    async def list_revisions(self, name: str) -> list[common_pb2.FunctionSpec]:
        """Every kept revision of a function, oldest first (NotFound if none)."""
        await self.get(name)
        try:
            kvs = await self.store.get_prefix(f"{REVISIONS}{name}/")
        except StoreUnavailable as e:
            raise Unavailable(f"state store unavailable: {e}") from e
        out = []
        for kv in sorted(kvs, key=lambda kv: kv.key):
            spec = _decode(kv.value, kv.version)
            spec.name = revisions.revision_name(name, spec.revision)
            del spec.traffic[:]
            out.append(spec)
        return out

    async def get(self, name: str) -> common_pb2.FunctionSpec:
        """The spec (from memory when known), or NotFound. A revision name
        (NAME-NNNNN) gets that revision's spec."""
        if revisions.split(name)[1]:
            return await self.get_revision(name)
        cached = self._cache.get(name)
        if cached is not None:
            return _copy(cached)
        try:
            kv = await self.store.get(PREFIX + name)
        except StoreUnavailable as e:
            raise Unavailable(f"state store unavailable: {e}") from e
        if kv is None:
            raise NotFound(
                f"function {short(name)} not found; deploy it with `galaxy deploy -f SPEC`"
            )
        spec = _decode(kv.value, kv.version)
        self._cache[name] = spec
        return _copy(spec)

    async def list(self) -> list[common_pb2.FunctionSpec]:
        """All specs, sorted by name (from memory if the store is down)."""
        try:
            kvs = await self.store.get_prefix(PREFIX)
        except StoreUnavailable as e:
            if self._complete:
                return [_copy(self._cache[n]) for n in sorted(self._cache)]
            raise Unavailable(f"state store unavailable: {e}") from e
        out = [_decode(kv.value, kv.version) for kv in kvs]
        self._cache = {s.name: s for s in out}
        self._complete = True
        return [_copy(s) for s in out]

    async def delete(self, name: str) -> None:
        """Delete the spec and its revisions, or NotFound."""
        try:
            deleted = await self.store.delete(PREFIX + name)
            await self.store.delete_prefix(f"{REVISIONS}{name}/")
        except StoreUnavailable as e:
            raise Unavailable(f"state store unavailable, function not deleted: {e}") from e
        self._cache.pop(name, None)
        if not deleted:
            raise NotFound(f"function {short(name)} not found")


def _decode(value: bytes, version: int) -> common_pb2.FunctionSpec:
    s = common_pb2.FunctionSpec.FromString(value)
    s.version = version
    return s


def _content(spec: common_pb2.FunctionSpec) -> bytes:
    """What makes a revision: the spec without its bookkeeping fields."""
    out = _copy(spec)
    out.version = 0
    out.revision = 0
    del out.traffic[:]
    return out.SerializeToString(deterministic=True)


def _copy(spec: common_pb2.FunctionSpec) -> common_pb2.FunctionSpec:
    # Callers may mutate what they get; the cache must not change with them.
    out = common_pb2.FunctionSpec()
    out.CopyFrom(spec)
    return out
