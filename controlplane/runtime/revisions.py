"""Revision names and traffic splits (pure; no I/O).

A function's revisions are immutable specs numbered 1, 2, 3, ... Each is
routed, scaled and placed like a function of its own, named NAME-NNNNN (five
digits, as Knative names revisions), so Schedule, node agents, records and
the autoscaler need no notion of revisions. Dispatch ownership hashes the
function's name, not the revision's: every revision of a function lives on
the Dispatch instance that owns the function, so a split costs no extra hop.
"""

from __future__ import annotations

import functools
import re
from collections.abc import Callable, Sequence

from controlplane.runtime.errors import InvalidArgument, NotFound
from controlplane.runtime.validation import NAME_RE, short
from galaxy.v1 import common_pb2

#: Five digits: revision numbers 1 to 99,999.
MAX_REVISION = 99_999
_REVISION_RE = re.compile(r"^(?P<base>.+)-(?P<n>\d{5})$")
MAX_TARGETS = 100


def revision_name(function: str, revision: int) -> str:
    """NAME-NNNNN."""
    return f"{function}-{revision:05d}"


# Cached: Dispatch and the SDK ask on every request (ownership hashes the
# function's name); names are few and bounded by the cache.
@functools.lru_cache(maxsize=65_536)
def split(name: str) -> tuple[str, int]:
    """(function, revision) of a revision name; (name, 0) for anything else."""
    m = _REVISION_RE.match(name)
    if m is None or not NAME_RE.match(m["base"]) or int(m["n"]) == 0:
        return name, 0
    return m["base"], int(m["n"])


def routing_key(name: str) -> str:
    """What Dispatch ownership is hashed on: the function's name."""
    return split(name)[0]


def check_targets(targets: Sequence[common_pb2.TrafficTarget], latest: int) -> None:
    """A traffic split: shares add up to 100, revisions exist, tags unique."""
    if len(targets) > MAX_TARGETS:
        raise InvalidArgument(f"traffic: at most {MAX_TARGETS} targets, got {len(targets)}")
    if not targets:
        raise InvalidArgument("traffic: at least one target (e.g. latest=100)")
    tags: set[str] = set()
    total = 0
    for i, t in enumerate(targets):
        if t.revision > latest:
            raise InvalidArgument(
                f"traffic[{i}].revision: {t.revision} does not exist (latest is {latest})"
            )
        if t.percent > 100:
            raise InvalidArgument(f"traffic[{i}].percent: must be 0-100, got {t.percent}")
        total += t.percent
        if t.tag:
            if len(t.tag) > 20 or not NAME_RE.match(t.tag):
                raise InvalidArgument(
                    f"traffic[{i}].tag: a DNS label of at most 20 characters, got {short(t.tag)}"
                )
            if t.tag in tags:
                raise InvalidArgument(f"traffic[{i}].tag: {t.tag!r} is used twice")
            tags.add(t.tag)
    if total != 100:
        raise InvalidArgument(f"traffic: percents must add up to 100, got {total}")


def latest_ready(latest: int, ready: Callable[[int], bool], oldest: int = 1) -> int:
    """The newest revision with a ready instance, else the latest: traffic
    moves to a new revision once it can serve, so a rollout never waits on a
    cold start (and a revision that cannot start never takes traffic while
    an older one serves)."""
    for rev in range(latest, max(oldest, latest - 20) - 1, -1):
        if ready(rev):
            return rev
    return latest


def choose(spec: common_pb2.FunctionSpec, tag: str, u: float, ready: Callable[[int], bool]) -> int:
    """The revision that serves one request.

    spec: the function's spec (``revision`` = latest, ``traffic``); tag: the
    request's tag ("" = none); u: uniform in [0, 1), drawn by the caller
    (so this stays deterministic); ready: whether a revision has a ready
    instance. Raises NotFound for an unknown tag.
    """
    latest = spec.revision
    if tag:
        for t in spec.traffic:
            if t.tag == tag:
                return t.revision or latest_ready(latest, ready)
        raise NotFound(f"function {short(spec.name)} has no revision tagged {short(tag)}")
    if not spec.traffic:
        return latest_ready(latest, ready)
    point = u * 100.0
    for t in spec.traffic:
        if point < t.percent:
            return t.revision or latest_ready(latest, ready)
        point -= t.percent
    # Only rounding can get here: the last target with a share.
    last = [t for t in spec.traffic if t.percent] or list(spec.traffic)
    return last[-1].revision or latest_ready(latest, ready)


def settled(spec: common_pb2.FunctionSpec, tag: str, ready: Callable[[int], bool]) -> bool:
    """True when ``choose`` has no draw to make for requests with this tag:
    one target gets all of them, and it is not ``latest`` while a rollout
    waits for the latest revision to be ready. Only then may a caller reuse
    a slot of the chosen revision for its next requests (a slot cache)."""
    if tag:
        target = next((t for t in spec.traffic if t.tag == tag), None)
    else:
        shares = [t for t in spec.traffic if t.percent] or [common_pb2.TrafficTarget(percent=100)]
        target = shares[0] if len(shares) == 1 else None
    if target is None:
        return False
    return target.revision != 0 or latest_ready(spec.revision, ready) == spec.revision


def routed(spec: common_pb2.FunctionSpec, ready: Callable[[int], bool]) -> set[int]:
    """Revisions that may receive new requests now (a share, or a tag).
    The others drain: their idle instances retire at once."""
    if not spec.revision:
        return set()
    targets = list(spec.traffic) or [common_pb2.TrafficTarget(percent=100)]
    out = set()
    for t in targets:
        if t.percent or t.tag:
            out.add(t.revision or latest_ready(spec.revision, ready))
    return out
