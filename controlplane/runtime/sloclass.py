"""SLO classes of requests: the gateway reads one from a header, Dispatch's
admission control sheds the lowest first at overload
(``functions/dispatch/admission.py``). The three names are the Gateway API
Inference Extension's criticalities; on the wire a class is its priority
(``RoutingHint.priority``): negative sheddable, 0 standard, positive
critical."""

from __future__ import annotations

#: the request header naming a class (absent: standard)
HEADER = "X-Galaxy-Priority"
#: class name -> priority
CLASSES: dict[str, int] = {"critical": 1, "standard": 0, "sheddable": -1}


def class_of(priority: int) -> str:
    """The class of a priority: its sign."""
    return "critical" if priority > 0 else "sheddable" if priority < 0 else "standard"


def parse(value: str) -> int:
    """The priority a header value names; ValueError naming the header."""
    got = CLASSES.get(value.strip().lower())
    if got is None:
        raise ValueError(f"{HEADER}: one of {', '.join(CLASSES)}")
    return got
