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
import time
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
#: Report interval while the instance is saturated: a flood is seen four
#: times sooner, and the controller can decide as often as reports come.
BURST_INTERVAL_S = 0.25
#: CPU per instance (cores) from which it counts as saturated.
SATURATED_CPU = 0.9
#: Counter key of the process CPU the reporter adds to every report, in
#: milliseconds (so its rate is ms/s: 1000 is one busy core).
CPU_KEY = "cpu_ms"
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


def process_cpu_ms() -> int:
    """CPU this process has used (user + system, all threads), in ms."""
    return int(time.process_time() * 1000)


def busy_cores(ops: Mapping[str, float]) -> float:
    """Busy cores in a report's rates (0 when it carries no CPU)."""
    return ops.get(CPU_KEY, 0.0) / 1000.0


def report_due(since_report_s: float, interval_s: float, cores: float) -> bool:
    """Whether to report now: the interval has passed, or the instance was
    saturated (``cores`` busy since the last check) and the controller should
    hear of it at once rather than at the end of the interval."""
    return since_report_s >= interval_s - 1e-9 or cores >= SATURATED_CPU


class CpuMeter:
    """Busy cores of a process between two reads of its CPU counter (pure:
    the caller passes the counter, in ms, and the time)."""

    def __init__(self, cpu_ms: int, now: float) -> None:
        self._at = (cpu_ms, now)

    def read(self, cpu_ms: int, now: float) -> float:
        """Busy cores since the last read (or construction)."""
        last_cpu, last_at = self._at
        self._at = (cpu_ms, now)
        return (cpu_ms - last_cpu) / 1000.0 / max(now - last_at, 1e-6)


class LoadReporter:
    """Sends a ``LoadReport`` for one instance every ``interval_s``; it checks
    its process's CPU every ``burst_interval_s`` and reports at once when the
    instance was saturated (``report_due``).

    Every report carries the process's CPU (``CPU_KEY``): what the
    controller's per-operation prices (T) cannot see when the operation mix
    changes.

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
        burst_interval_s: float = BURST_INTERVAL_S,
        reregister: Callable[[], Awaitable[common_pb2.Membership]] | None = None,
        on_membership: Callable[[common_pb2.Membership], None] | None = None,
        on_reply: Callable[[controller_pb2.ReportLoadReply], None] | None = None,
        clock: Clock | None = None,
        cpu_ms: Callable[[], int] = process_cpu_ms,
    ) -> None:
        if interval_s <= 0 or burst_interval_s <= 0:
            raise ValueError(
                f"intervals must be > 0, got {interval_s} and burst {burst_interval_s}"
            )
        self.component = component
        self.instance = instance
        self.controller = controller
        self.pool = pool
        self.interval_s = interval_s
        self.burst_interval_s = min(burst_interval_s, interval_s)
        self.reregister = reregister
        self.on_membership = on_membership
        self.on_reply = on_reply
        self.clock = clock or MonotonicClock()
        self.cpu_ms = cpu_ms
        self.sent = 0
        self._prev = self._counters()
        self._prev_at = self.clock.now()
        self._meter = CpuMeter(self._prev[CPU_KEY], self._prev_at)
        self._task: asyncio.Task[None] | None = None

    def _counters(self) -> dict[str, int]:
        cur = read_counters(self.component)
        cur[CPU_KEY] = self.cpu_ms()
        return cur

    def sample(self) -> controller_pb2.LoadReport:
        """Take a snapshot and build the report for the interval since the last."""
        now = self.clock.now()
        cur = self._counters()
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
        if self.on_reply is not None:
            self.on_reply(reply)
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

    def due(self) -> bool:
        """Whether a report is due now (interval passed, or saturated since
        the last check)."""
        now = self.clock.now()
        cores = self._meter.read(self.cpu_ms(), now)
        return report_due(now - self._prev_at, self.interval_s, cores)

    async def _run(self) -> None:
        while True:
            # A timer is the point of this loop: reports are periodic (and
            # sooner under saturation, checked on the shorter period).
            await asyncio.sleep(self.burst_interval_s)
            if not self.due():
                continue
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
