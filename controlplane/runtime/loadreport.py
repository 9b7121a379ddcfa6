"""The periodic load report every control function instance sends.

A component may expose cumulative counters, ``load_counters() -> dict[str,
int]`` (for example ``{"dispatch": 1234, "scale_up": 56}``; the key
``"errors"`` is special), and ``queue_depth() -> int``. The host runs one
``LoadReporter`` per registered component: every interval it turns the
counter deltas into operations per second (``rates``) and calls
``Controller.ReportLoad``. When the controller answers that it does not know
the instance (it restarted, or a new controller took over), the reporter
registers again and hands the membership to the component, so a controller
rebuilds its view from fresh reports.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Awaitable, Callable, Mapping
from typing import Any, cast

import grpc

from controlplane.runtime import controllers, rpc
from controlplane.runtime.clock import Clock, MonotonicClock
from controlplane.runtime.metrics import RPC_REQUESTS
from galaxy.v1 import common_pb2, controller_pb2

log = logging.getLogger(__name__)

#: Default report interval (the issue asks for 1 s).
DEFAULT_INTERVAL_S = 1.0
#: Counter key reported as ``LoadReport.errors`` instead of as a rate.
ERRORS_KEY = "errors"


def rates(
    prev: Mapping[str, int], cur: Mapping[str, int], elapsed_s: float
) -> tuple[dict[str, float], int]:
    """Per-second rates between two snapshots of cumulative counters, and
    the errors counted in between.

    A counter that went backwards (the component restarted it) counts from
    zero; a counter first seen now counts all it has. The errors key is
    returned as a count, not a rate.
    """
    if elapsed_s <= 0:
        raise ValueError(f"elapsed_s must be > 0, got {elapsed_s}")
    out: dict[str, float] = {}
    errors = 0
    for key, value in cur.items():
        before = prev.get(key, 0)
        delta = value - before if value >= before else value
        if key == ERRORS_KEY:
            errors = max(0, delta)
        else:
            out[key] = max(0, delta) / elapsed_s
    return out, errors


def rpcs_handled(*methods: str) -> int:
    """RPCs of these methods ("Service/Method") this process has answered,
    any status, from the server interceptor's counter.

    For components whose servicer keeps no counter of its own. The counter
    is per process, which is one component in every deployment Galaxy makes.
    """
    wanted = set(methods)
    total = 0.0
    for family in RPC_REQUESTS.collect():
        for s in family.samples:
            if s.name.endswith("_total") and s.labels.get("method") in wanted:
                total += s.value
    return int(total)


def read_counters(component: Any) -> dict[str, int]:
    """The component's cumulative counters ({} if it exposes none)."""
    fn = getattr(component, "load_counters", None)
    return dict(fn()) if callable(fn) else {}


def read_queue_depth(component: Any) -> int:
    """The component's queue depth (0 if it exposes none)."""
    fn = getattr(component, "queue_depth", None)
    return max(0, int(fn())) if callable(fn) else 0


class LoadReporter:
    """Sends a ``LoadReport`` for one instance every ``interval_s``.

    reregister: called when the controller does not know this instance; its
    membership result goes to ``on_membership``. Errors never stop the loop:
    the controller may be restarting.
    """

    def __init__(
        self,
        component: Any,
        instance: common_pb2.ControlInstance,
        controller: str,
        pool: rpc.ChannelPool,
        *,
        interval_s: float = DEFAULT_INTERVAL_S,
        reregister: Callable[[], Awaitable[common_pb2.Membership]] | None = None,
        on_membership: Callable[[common_pb2.Membership], None] | None = None,
        clock: Clock | None = None,
    ) -> None:
        if interval_s <= 0:
            raise ValueError(f"interval_s must be > 0, got {interval_s}")
        self.component = component
        self.instance = instance
        self.controller = controller
        self.pool = pool
        self.interval_s = interval_s
        self.reregister = reregister
        self.on_membership = on_membership
        self.clock = clock or MonotonicClock()
        self.sent = 0
        self._prev = read_counters(component)
        self._prev_at = self.clock.now()
        self._task: asyncio.Task[None] | None = None

    def sample(self) -> controller_pb2.LoadReport:
        """Take a snapshot and build the report for the interval since the last."""
        now = self.clock.now()
        cur = read_counters(self.component)
        ops, errors = rates(self._prev, cur, max(now - self._prev_at, 1e-6))
        self._prev, self._prev_at = cur, now
        return controller_pb2.LoadReport(
            instance=self.instance,
            ops_per_second=ops,
            queue_depth=read_queue_depth(self.component),
            errors=errors,
        )

    async def report_once(self) -> controller_pb2.ReportLoadReply | None:
        """Send one report; re-register if the controller asks. None on error."""
        report = self.sample()
        try:
            reply = cast(
                controller_pb2.ReportLoadReply,
                await controllers.call(
                    self.pool,
                    self.controller,
                    "ReportLoad",
                    report,
                    timeout_s=max(self.interval_s, 1.0),
                ),
            )
        except grpc.aio.AioRpcError as e:
            log.debug("load report to %s failed: %s", self.controller, e.details())
            return None
        self.sent += 1
        if reply.membership_stale and self.reregister is not None:
            log.info("controller does not know %s: registering again", self.instance.id)
            try:
                m = await self.reregister()
            except Exception as e:  # retried on the next report
                log.warning("re-registration of %s failed: %s", self.instance.id, e)
                return reply
            if self.on_membership is not None:
                self.on_membership(m)
        return reply

    async def _run(self) -> None:
        while True:
            # A timer is the point of this loop: reports are periodic.
            await asyncio.sleep(self.interval_s)
            try:
                await self.report_once()
            except Exception:  # a bug in one report must not end reporting
                log.exception("load report failed")

    def start(self) -> None:
        """Start reporting in the background."""
        if self._task is None:
            self._task = asyncio.create_task(self._run(), name="load-reporter")

    async def stop(self) -> None:
        """Stop reporting."""
        task, self._task = self._task, None
        if task is not None:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task
