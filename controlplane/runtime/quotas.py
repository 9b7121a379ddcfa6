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

A namespace no quota names gets the *default* quota instead, so that one
namespace cannot take the cluster before an admin set anything: what its
functions keep running idle (the sum of ``min_scale`` x resources, and of
``min_scale``) may be at most a fraction of the cluster (``default_quota``:
of the registered nodes' capacity, and of ``--max-reserved-instances``).
It counts ``min_scale``, not ``max_scale``: functions scale to zero, so the
sum of their ``max_scale`` is far above any cluster in ordinary use
(benchmarks deploy hundreds of functions of ``max_scale`` 1,000), while
``min_scale`` is held whether or not anyone calls.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
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
    def of(specs: Iterable[common_pb2.FunctionSpec], reserved: bool = False) -> Usage:
        """The usage of specs (their max_scale already defaulted); with
        reserved, what their min_scale keeps running."""
        f = i = c = m = g = 0
        for s in specs:
            n = s.min_scale if reserved else s.max_scale
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


#: The share of the cluster one namespace's min_scale may hold by default
#: (``--default-quota-fraction``): two namespaces can each keep half.
DEFAULT_FRACTION = 0.5


def default_quota(
    fraction: float, capacity: common_pb2.Resources | None, max_reserved: int
) -> Quota | None:
    """The default quota (on min_scale): fraction of capacity (the
    registered nodes' total; None when no node is known, then only the
    instance count is bounded) and of max_reserved instances. None when
    fraction is 0 (no default)."""
    if fraction <= 0:
        return None

    def part(total: int) -> int:
        return int(total * fraction)

    if capacity is None:
        return Quota(instances=part(max_reserved))
    return Quota(
        instances=part(max_reserved),
        cpu_millis=part(capacity.cpu_millis),
        memory_mib=part(capacity.memory_mib),
        gpus=part(capacity.gpus),
    )


class NamespaceQuotas:
    """The quota of each namespace (with the EVERY fallback), and the
    default quota's fraction for namespaces without one."""

    def __init__(
        self, quotas: Mapping[str, Quota] | None = None, default_fraction: float = 0.0
    ) -> None:
        self.quotas = dict(quotas or {})
        self.default_fraction = default_fraction

    def of(self, namespace: str) -> Quota | None:
        """The quota that applies to namespace (None: unlimited)."""
        return self.quotas.get(namespace, self.quotas.get(EVERY))

    def check(
        self,
        namespace: str,
        others: Iterable[common_pb2.FunctionSpec],
        spec: common_pb2.FunctionSpec,
        capacity: common_pb2.Resources | None = None,
        max_reserved: int = 0,
    ) -> None:
        """Raise RESOURCE_EXHAUSTED if namespace, holding others (the other
        functions of namespace) and spec, goes over its quota; a namespace
        without one is held to the default quota, from capacity (the
        registered nodes' total, None if unknown) and max_reserved."""
        quota = self.of(namespace)
        if quota is not None:
            after = Usage.of(others).plus(Usage.of([spec]))
            how = "max_scale x resources of every function counts"
            _over(quota, after, lambda key: f"quota {key} of namespace {namespace}", how)
            return
        default = default_quota(self.default_fraction, capacity, max_reserved)
        if default is None:
            return
        used = Usage.of(others, reserved=True).plus(Usage.of([spec], reserved=True))
        share = f"{self.default_fraction:g}"

        def label(key: str) -> str:
            of = "--max-reserved-instances" if key == "instances" else "the registered nodes"
            return f"default quota {key} of namespace {namespace} ({share} of {of})"

        how = "min_scale x resources counts; an admin sets it with --namespace-quota"
        _over(default, used, label, how)


def _over(quota: Quota, after: Usage, label: Callable[[str], str], how: str) -> None:
    """RESOURCE_EXHAUSTED naming the first key of quota that after exceeds
    (label gives the quota's name for a key)."""
    for f in fields(Quota):
        limit = getattr(quota, f.name)
        if limit is not None and getattr(after, f.name) > limit:
            raise ResourceExhausted(
                f"{label(f.name)}: {limit}; this deploy would make it "
                f"{getattr(after, f.name)} ({how})"
            )
