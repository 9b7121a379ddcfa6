"""Per-namespace quotas (pure): how much a tenant's functions may claim.

A namespace's usage counts what its functions *may* run, not what runs now,
so a deploy is judged once and a burst never breaks a quota later:

- functions: how many it holds;
- instances: the sum of ``max_scale``;
- cpu_millis, memory_mib, gpus: the sum of ``max_scale`` x the per-instance
  resources.

A quota is set per namespace with ``--namespace-quota NS=KEY:N,...`` on the
controller, and ``--namespace-quota '*=...'`` for every namespace without
its own. A key left out is unlimited. A deploy over a quota is
RESOURCE_EXHAUSTED naming the namespace, the key, the quota and what the
deploy would make it; nothing is stored.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, fields

from controlplane.runtime.errors import ResourceExhausted
from galaxy.v1 import common_pb2

#: The namespace a quota with this name applies to: every one without its own.
EVERY = "*"
KEYS = ("functions", "instances", "cpu_millis", "memory_mib", "gpus")


@dataclass(frozen=True)
class Usage:
    """What a set of functions may claim."""

    functions: int = 0
    instances: int = 0
    cpu_millis: int = 0
    memory_mib: int = 0
    gpus: int = 0

    @staticmethod
    def of(specs: Iterable[common_pb2.FunctionSpec]) -> Usage:
        """The usage of specs (their max_scale already defaulted)."""
        f = i = c = m = g = 0
        for s in specs:
            n = s.max_scale
            f += 1
            i += n
            c += n * s.resources.cpu_millis
            m += n * s.resources.memory_mib
            g += n * s.resources.gpus
        return Usage(f, i, c, m, g)

    def plus(self, other: Usage) -> Usage:
        """The sum of two usages."""
        return Usage(*(getattr(self, k) + getattr(other, k) for k in KEYS))


@dataclass(frozen=True)
class Quota:
    """Limits of one namespace; None = unlimited."""

    functions: int | None = None
    instances: int | None = None
    cpu_millis: int | None = None
    memory_mib: int | None = None
    gpus: int | None = None


def parse(text: str) -> tuple[str, Quota]:
    """``NS=KEY:N[,KEY:N...]`` -> (namespace, quota); ValueError naming
    the bad part."""
    ns, sep, rest = text.partition("=")
    if not sep or not ns:
        raise ValueError(f"--namespace-quota: expected NS=KEY:N[,KEY:N], got {text[:40]!r}")
    values: dict[str, int] = {}
    for part in rest.split(","):
        key, colon, n = part.strip().partition(":")
        if key not in KEYS:
            raise ValueError(f"--namespace-quota {ns}: key {key[:20]!r} is not one of {KEYS}")
        if not colon or not n.isdigit():
            raise ValueError(f"--namespace-quota {ns}: {key} needs a whole number, e.g. {key}:10")
        values[key] = int(n)
    return ns, Quota(**values)


class NamespaceQuotas:
    """The quota of each namespace (with the EVERY fallback)."""

    def __init__(self, quotas: Mapping[str, Quota] | None = None) -> None:
        self.quotas = dict(quotas or {})

    def of(self, namespace: str) -> Quota | None:
        """The quota that applies to namespace (None: unlimited)."""
        return self.quotas.get(namespace, self.quotas.get(EVERY))

    def check(
        self,
        namespace: str,
        others: Iterable[common_pb2.FunctionSpec],
        spec: common_pb2.FunctionSpec,
    ) -> None:
        """Raise RESOURCE_EXHAUSTED if namespace, holding others (the other
        functions of namespace) and spec, goes over its quota."""
        quota = self.of(namespace)
        if quota is None:
            return
        after = Usage.of(others).plus(Usage.of([spec]))
        for f in fields(Quota):
            limit = getattr(quota, f.name)
            if limit is not None and getattr(after, f.name) > limit:
                raise ResourceExhausted(
                    f"quota {f.name} of namespace {namespace}: {limit}; this deploy would make it "
                    f"{getattr(after, f.name)} (max_scale x resources of every function counts)"
                )
