"""Rendezvous (highest random weight) hashing on mmh3.

The one partitioning rule of Galaxy: nodes over Schedule and ClusterMgr
instances, functions over Dispatch instances. Every holder of the same member
list computes the same owner for a key, with no coordination. Adding a member
moves only the keys it now wins (about 1/(n+1) of them); removing one moves
only its own keys.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

import mmh3


def score(key: str, member: str) -> int:
    """The weight of member for key; the highest weight owns the key."""
    # One 64-bit hash of the pair; the separator keeps ("ab","c") != ("a","bc").
    return mmh3.hash64(f"{key}\x00{member}", signed=False)[0]


def owner(key: str, members: Iterable[str]) -> str | None:
    """The member that owns key, or None when there are no members."""
    best: str | None = None
    best_score = -1
    for m in members:
        s = score(key, m)
        # Ties are practically impossible with 64 bits; break them by name
        # so the answer never depends on the order of members.
        if s > best_score or (s == best_score and best is not None and m > best):
            best, best_score = m, s
    return best


def ranked(key: str, members: Iterable[str]) -> list[str]:
    """Members ordered by weight for key: the owner first, then spill order."""
    return sorted(members, key=lambda m: (score(key, m), m), reverse=True)


def partition(keys: Iterable[str], members: Sequence[str]) -> dict[str, list[str]]:
    """Map every member to the keys it owns (every member appears, maybe empty)."""
    out: dict[str, list[str]] = {m: [] for m in members}
    if not members:
        return out
    for k in keys:
        o = owner(k, members)
        assert o is not None
        out[o].append(k)
    return out
