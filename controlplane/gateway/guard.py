"""What the gateway refuses, how it says so, and the bounds it keeps:

- ``Refusals``: one metric per refusal kind
  (``galaxy_gateway_refused_total{reason}``) and one log line per refused
  request, without a traceback, rate-limited per kind by ``LogLimiter`` (a
  flood of bad requests must not become a flood of log lines).
- ``UploadBudget``: the request body bytes the gateway holds at once.
- ``parse_json``: JSON with a depth limit. The standard library's parser
  recurses once per nesting level and raises RecursionError (a 500) on a
  body of ``[`` x 100,000; orjson, a maintained parser, refuses nesting
  deeper than 1,024 with a plain decode error, which becomes a 400.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import orjson
from prometheus_client import Counter

log = logging.getLogger("controlplane.gateway")

REFUSED = Counter(
    "galaxy_gateway_refused_total",
    "Requests and connections the gateway refused before proxying, by reason",
    ["reason"],
)
# A series per known reason from the start: a rate over a counter that
# appears only at its first event misses that event.
for _reason in ("connections", "header_timeout", "body_timeout", "body_size", "in_flight",
                "upload_bytes", "route", "unauthenticated", "permission_denied",
                "not_found"):  # fmt: skip
    REFUSED.labels(_reason)

#: orjson's fixed nesting limit (documented by orjson; not configurable).
JSON_MAX_DEPTH = 1024


class BadJson(ValueError):
    """The body is not JSON within the limits; the message says why."""


def parse_json(body: bytes | bytearray) -> Any:
    """The JSON document of body (its size is bounded by the caller, which
    read at most ``--max-body-bytes``); BadJson when it is not JSON or is
    nested deeper than ``JSON_MAX_DEPTH``."""
    try:
        return orjson.loads(body)
    except orjson.JSONDecodeError as e:
        if "depth limit" in str(e):
            raise BadJson(f"body: JSON nested deeper than {JSON_MAX_DEPTH} levels") from None
        raise BadJson("body: not valid JSON") from None


@dataclass
class LogLimiter:
    """Pure: whether a log line of a kind may be written now, at most one
    per ``interval_s`` per kind; says how many were held back since the
    last one (the clock is the caller's)."""

    interval_s: float = 1.0
    _last: dict[str, float] = field(default_factory=dict)
    _held: dict[str, int] = field(default_factory=dict)

    def allow(self, kind: str, now: float) -> tuple[bool, int]:
        """(write the line?, lines of this kind held back before it)."""
        last = self._last.get(kind)
        if last is not None and now - last < self.interval_s:
            self._held[kind] = self._held.get(kind, 0) + 1
            return False, 0
        self._last[kind] = now
        return True, self._held.pop(kind, 0)


class Refusals:
    """Counts and logs refused requests (see the module docstring)."""

    def __init__(
        self, interval_s: float = 1.0, clock: Callable[[], float] = time.monotonic
    ) -> None:
        self.limiter = LogLimiter(interval_s)
        self.clock = clock

    def refuse(self, reason: str, peer: str, what: str, message: str) -> None:
        """Account for one refusal: the metric always, a line when allowed."""
        REFUSED.labels(reason).inc()
        ok, held = self.limiter.allow(reason, self.clock())
        if ok:
            more = f" ({held} more of this kind since the last line)" if held else ""
            log.warning("refused %s %s %s: %s%s", reason, peer or "-", what or "-", message, more)


class UploadBudget:
    """Bytes of request bodies held at once, at most ``limit``: a
    body that does not fit is refused (503) before a byte of it is read."""

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self.used = 0

    def take(self, n: int) -> bool:
        """Reserve n bytes; False (nothing reserved) when they do not fit."""
        if self.used + n > self.limit:
            return False
        self.used += n
        return True

    def give(self, n: int) -> None:
        """Return bytes taken before."""
        self.used -= n
