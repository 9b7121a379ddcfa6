"""Sleeping LLM instances on a Dispatch instance: the servicer's side of
``controlplane.llm.sleep.SleepPolicy`` (the decisions; pure).

A function whose runtime serves an LLM (``FunctionSpec.llm``) and whose
``autoscaling.max_asleep`` is above 0 keeps instances the autoscaler gives
up asleep (weights loaded, context released) instead of removing them:

- scale-in (``retire``): the policy says sleep or remove; a sleeping
  instance leaves the router at once (no capacity, no requests) and gets
  ``POST /v1/galaxy/sleep`` within ``SLEEP_TIMEOUT_S``; when that fails it
  is removed like any retired instance;
- scale-out (``wake``, from ``Dispatcher.start``): the most recently asleep
  go back into the router first, before any cold start; one that a waiting
  request gets at once is woken by that request (an instance wakes on its
  next request by itself), the others get ``POST /v1/galaxy/wake`` ahead of
  their requests, and one that does not answer it within ``WAKE_TIMEOUT_S``
  is removed;
- every autoscaler tick (``tick``): instances asleep ``keep_asleep_ms`` are
  removed, and those of a function no longer routed here go to its owner
  (as routed instances) or, the function deleted, are removed.

A sleeping instance keeps its instance record, and ``ListInstances`` lists
it (``asleep``), so the node agents' orphan checks leave it alone. A
Dispatch that restarts asks each recorded instance of a sleeping LLM
function its state (``recovered``, ``GET /v1/galaxy/state``): one asleep
sleeps on here (its ``keep_asleep_ms`` counted from when it fell asleep,
which it reports), listed from the start; one awake, or one that does not
answer, is recovered as any instance is.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from prometheus_client import Counter, Gauge

from controlplane.runtime import leasetoken
from controlplane.runtime.clock import Clock
from controlplane.runtime.sleeppolicy import SleepPolicy, Step
from functions.dispatch.policy import FunctionRouter
from galaxy.v1 import common_pb2, dispatch_pb2

if TYPE_CHECKING:
    # Imported on the first sleep or wake (as in llmroute): a Dispatch that
    # serves no LLM never pays aiohttp's import.
    import aiohttp

    from functions.dispatch.dispatcher import Dispatcher

log = logging.getLogger(__name__)

#: deadlines of the calls to an instance (the real sleep closes a context and
#: trims the heap; the real wake builds a context: 0.03-0.4 s, docs/llm.md)
SLEEP_TIMEOUT_S = 10.0
WAKE_TIMEOUT_S = 10.0
#: deadline of a recovering Dispatch's state question, and how many at once
STATE_TIMEOUT_S = 2.0
STATE_PARALLEL = 32
#: how long an instance stays asleep when the spec says 0
KEEP_ASLEEP_S = 300.0

ASLEEP = Gauge(
    "galaxy_llm_instances_asleep", "LLM instances asleep, of the functions this Dispatch owns"
)
SLEEPS = Counter(
    "galaxy_llm_sleeps_total", "LLM instances a scale-in put to sleep (once they answered)"
)
WAKES = Counter("galaxy_llm_wakes_total", "Sleeping LLM instances a scale-out woke")
REMOVED = Counter(
    "galaxy_llm_asleep_removed_total",
    "Sleeping LLM instances removed: expired, sleep_failed, wake_failed, unrouted",
    ["reason"],
)
for _reason in ("expired", "sleep_failed", "wake_failed", "unrouted"):
    REMOVED.labels(_reason)


class Sleeping:
    """The sleeping instances of the LLM functions one Dispatch routes: a
    ``SleepPolicy`` per function (or revision) and each instance's record."""

    def __init__(self, clock: Clock) -> None:
        self.clock = clock
        #: function (or revision) -> its policy
        self.policies: dict[str, SleepPolicy] = {}
        #: instance id -> its record, while asleep
        self.infos: dict[str, common_pb2.InstanceInfo] = {}
        #: the lease token a node's entry asks of a call (None: no entry checks)
        self.sign: Callable[[str], str] | None = None
        self._session: aiohttp.ClientSession | None = None
        ASLEEP.set_function(lambda: len(self.infos))

    def policy(self, spec: common_pb2.FunctionSpec) -> SleepPolicy | None:
        """The function's policy, its limits the spec's (None: its
        instances do not sleep)."""
        a = spec.autoscaling
        p = self.policies.get(spec.name)
        if not spec.llm or not a.max_asleep:
            return p  # (one left from before the spec changed: its sleepers expire)
        keep_s = a.keep_asleep_ms / 1000.0 if a.keep_asleep_ms else KEEP_ASLEEP_S
        if p is None:
            p = self.policies[spec.name] = SleepPolicy(keep_s, a.max_asleep, self.clock.now)
        p.keep_asleep_s, p.max_asleep = keep_s, a.max_asleep
        return p

    def of(self, function: str) -> list[common_pb2.InstanceInfo]:
        """The function's sleeping instances, oldest asleep first."""
        p = self.policies.get(function)
        return [] if p is None else [self.infos[i] for i in p.asleep if i in self.infos]

    def take(self, function: str, instance_id: str) -> common_pb2.InstanceInfo | None:
        """Forget a sleeping instance; its record (None if not asleep here)."""
        p = self.policies.get(function)
        if p is not None:
            p.forget(instance_id)
        return self.infos.pop(instance_id, None)

    async def call(
        self, info: common_pb2.InstanceInfo, action: str, timeout_s: float
    ) -> dict[str, Any]:
        """``POST /v1/galaxy/<action>`` (``GET`` for ``state``) to the
        instance within ``timeout_s``: its JSON answer (raises on failure;
        an emulated sandbox's instance has nothing to call: ``{}``)."""
        if info.address.startswith("emulated://"):
            return {}
        import aiohttp

        if self._session is None or self._session.closed:
            self._session = aiohttp.ClientSession()
        headers = {leasetoken.HEADER: self.sign(info.instance_id)} if self.sign else None
        url = f"http://{info.address}/v1/galaxy/{action}"
        method = "GET" if action == "state" else "POST"
        timeout = aiohttp.ClientTimeout(total=timeout_s)
        async with self._session.request(method, url, headers=headers, timeout=timeout) as r:
            if r.status != 200:
                raise RuntimeError(f"{action}: HTTP {r.status}: {(await r.text())[:200]}")
            got = await r.json()
        return got if isinstance(got, dict) else {}

    async def close(self) -> None:
        """Close the HTTP session."""
        if self._session is not None:
            await self._session.close()
            self._session = None


def retire(d: Dispatcher, router: FunctionRouter, spec: common_pb2.FunctionSpec, iid: str) -> bool:
    """The autoscaler retires instance ``iid`` (drained, idle): put it to
    sleep when its function's policy says so (True); False: remove it."""
    policy = d.sleeping.policy(spec) if spec.llm and spec.autoscaling.max_asleep else None
    inst = router.instances.get(iid)
    if policy is None or inst is None or inst.meta is None or inst.in_flight:
        return False
    if policy.scale_in(iid) is Step.REMOVE:
        return False
    router.remove_instance(iid)  # not capacity, no requests; its record stays
    d.sleeping.infos[iid] = inst.meta
    log.info("putting %s of %s to sleep", iid, spec.name)
    d.spawn(_sleep(d, spec.name, inst.meta))
    return True


async def _sleep(d: Dispatcher, function: str, info: common_pb2.InstanceInfo) -> None:
    try:
        await d.sleeping.call(info, "sleep", SLEEP_TIMEOUT_S)
    except Exception as e:  # (any failure: the instance cannot be kept asleep)
        if d.sleeping.take(function, info.instance_id) is not None:
            log.warning("%s did not sleep (%s): removing it", info.instance_id, _why(e))
            _remove(d, function, info, "sleep_failed")
        return
    SLEEPS.inc()  # (counted once the instance says it sleeps)


def wake(d: Dispatcher, router: FunctionRouter, spec: common_pb2.FunctionSpec, n: int) -> int:
    """Route up to ``n`` sleeping instances of ``spec`` again, most recently
    asleep first (a scale-out, before any cold start); returns how many."""
    policy = d.sleeping.policy(spec) if spec.llm else None
    if policy is None or n <= 0:
        return 0
    woken = 0
    for iid in policy.wake(n):
        info = d.sleeping.infos.pop(iid, None)
        if info is None:
            continue
        woken += 1
        WAKES.inc()
        d.add(router, info, cold=False)
        inst = router.instances.get(iid)
        if inst is not None and inst.in_flight:
            # A waiting request got it: that request wakes it (one call to
            # the instance, not a wake and then the request, both through
            # its node's entry, on a loaded machine).
            log.info("%s of %s woken by a request", iid, spec.name)
            continue
        log.info("waking %s of %s ahead of its requests", iid, spec.name)
        d.spawn(_wake(d, router, info))
    return woken


async def _wake(d: Dispatcher, router: FunctionRouter, info: common_pb2.InstanceInfo) -> None:
    try:
        await d.sleeping.call(info, "wake", WAKE_TIMEOUT_S)
    except Exception as e:  # (any failure: it cannot serve)
        log.warning("%s did not wake (%s): removing it", info.instance_id, _why(e))
        REMOVED.labels("wake_failed").inc()
        router.drain(info.instance_id)
        if d.remove(router, info.instance_id) is not None:
            d.spawn(d.peers.delete_on_node(info))


def tick(d: Dispatcher) -> None:
    """Remove the instances asleep too long, and hand over or remove those of
    functions that moved or were deleted (run with each autoscaler tick)."""
    s = d.sleeping
    for function in list(s.policies):
        policy = s.policies[function]
        spec = d.specs.get(function)
        owner = d.owner(function)
        # (a spec is re-read on an update: absent a moment, its router stays)
        if owner is not None or (spec is None and function not in d.routers):
            for iid in list(policy.asleep):
                info = s.take(function, iid)
                if info is None:
                    continue
                if owner is not None:  # moved: its new owner routes it (awake)
                    d.spawn(d.peers.send_instance(owner, info, []))
                else:
                    _remove(d, function, info, "unrouted")
            del s.policies[function]
            continue
        if spec is not None and not (spec.llm and spec.autoscaling.max_asleep):
            policy.keep_asleep_s = 0.0  # sleep turned off: none stays
        for iid in policy.expired():
            info = s.infos.pop(iid, None)
            if info is not None:
                log.info("%s of %s asleep too long: removing it", iid, function)
                _remove(d, function, info, "expired")


def _remove(d: Dispatcher, function: str, info: common_pb2.InstanceInfo, reason: str) -> None:
    REMOVED.labels(reason).inc()
    d.unrouted(function, info.instance_id)
    d.spawn(d.peers.delete_on_node(info))


def _why(e: BaseException) -> str:
    return str(e)[:200] or type(e).__name__


async def recovered(
    d: Dispatcher, live: list[common_pb2.InstanceInfo]
) -> list[common_pb2.InstanceInfo]:
    """After a restart: the recorded instances still running that are
    asleep go back to sleep here (re-recorded); returns the others, to be
    recovered as any instance is."""
    gate = asyncio.Semaphore(STATE_PARALLEL)

    async def asleep(
        info: common_pb2.InstanceInfo,
    ) -> tuple[common_pb2.FunctionSpec, float] | None:
        try:
            spec = await d.spec(info.function)
            if not (spec.llm and spec.autoscaling.max_asleep):
                return None
            async with gate:
                state = await d.sleeping.call(info, "state", STATE_TIMEOUT_S)
        except Exception as e:  # (no answer: recovered as awake, its request wakes it)
            log.info("state of %s unknown (%s): recovered awake", info.instance_id, _why(e))
            return None
        return (spec, _asleep_s(state)) if state.get("asleep") is True else None

    found = await asyncio.gather(*(asleep(i) for i in live))
    out = []
    for info, got in zip(live, found, strict=True):
        spec, asleep_s = got if got is not None else (None, 0.0)
        policy = d.sleeping.policy(spec) if spec is not None else None
        # (its keep_asleep_ms counted from when it fell asleep, not from now)
        if policy is None or policy.scale_in(info.instance_id, asleep_s) is Step.REMOVE:
            out.append(info)  # (more asleep than max_asleep now: routed, woken by use)
            continue
        d.sleeping.infos[info.instance_id] = info
        d.record(f"/galaxy/instances/{info.function}/{info.instance_id}", info.SerializeToString())
    return out


def _asleep_s(state: dict[str, Any]) -> float:
    """The seconds an instance says it has slept (0 when it does not say,
    or says something that is not a duration)."""
    v = state.get("asleep_s")
    if isinstance(v, bool) or not isinstance(v, int | float) or not 0 <= v < 10 * 365 * 86400:
        return 0.0
    return float(v)


def listed(d: Dispatcher, function: str) -> list[dispatch_pb2.InstanceState]:
    """The function's sleeping instances as ``ListInstances`` shows them."""
    return [dispatch_pb2.InstanceState(instance=i, asleep=True) for i in d.sleeping.of(function)]
