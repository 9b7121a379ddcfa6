"""Placement scoring terms, by name.

A term scores one candidate node for one placement: ``(node, free estimate,
need, function) -> float``, higher is better. ``ScheduleConfig.scoring``
names the term a Schedule instance uses, so a new term (a model-cache
locality term, say) is one function registered here plus one config value.
"""

from __future__ import annotations

from collections.abc import Callable

from functions.schedule.model import Score, least_loaded

SCORES: dict[str, Score] = {"least_loaded": least_loaded}


def register(name: str) -> Callable[[Score], Score]:
    """Decorator: make ``fn`` the scoring term called ``name``."""

    def add(fn: Score) -> Score:
        if name in SCORES and SCORES[name] is not fn:
            raise ValueError(f"scoring term {name!r} is already registered")
        SCORES[name] = fn
        return fn

    return add


def lookup(name: str) -> Score:
    """The term called ``name``; ``ValueError`` listing the known ones."""
    try:
        return SCORES[name]
    except KeyError:
        known = ", ".join(sorted(SCORES))
        raise ValueError(f"unknown scoring term {name[:40]!r} (known: {known})") from None
