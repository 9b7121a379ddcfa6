"""One instance start of a Dispatch instance: the steps of its attempt loop
(``attempts.StartAttempts``: a credit, then Schedule with spill, then
retries) performed with ``Peers``' calls, and the waiters' fate when it
fails (``start_failed``). ``Dispatcher.start`` counts the start in its
router first (``begin_scale_up``)."""

from __future__ import annotations

import asyncio
import logging
import time
from typing import TYPE_CHECKING

import grpc
from prometheus_client import Counter

from controlplane.runtime.errors import (
    FailedPrecondition,
    GalaxyError,
    ResourceExhausted,
    Unavailable,
)
from controlplane.runtime.validation import short
from functions.dispatch import attempts as at
from functions.dispatch import coordination, fnstats
from functions.dispatch.peers import SCHEDULE
from functions.dispatch.policy import FunctionRouter, Grant
from galaxy.v1 import common_pb2

if TYPE_CHECKING:
    from functions.dispatch.dispatcher import Dispatcher

log = logging.getLogger(__name__)

#: Attempts of one instance start (under one id) that fails in doubt, and
#: the pause before the second (doubling after): ``attempts``' defaults.
START_ATTEMPTS = at.START_ATTEMPTS
START_RETRY_S = at.START_RETRY_S
#: How long a start refused for room waits for the remainders of spent
#: credits to reach their grantors before its retry (CreditWallet.room_retry).
CREDIT_RETURN_WAIT_S = 2.0
ROOM_RETRIED = Counter(
    "galaxy_dispatch_room_retries_total",
    "Starts refused for room, tried again after returning spent credits' remainders",
)
#: How a failed start reaches its waiters, by ``attempts`` failure.
ERRORS: dict[str, type[GalaxyError]] = {
    at.NO_ROOM: ResourceExhausted,
    at.NEVER_FITS: FailedPrecondition,
    at.IN_DOUBT: Unavailable,
}


async def scale_up(d: Dispatcher, router: FunctionRouter, spec: common_pb2.FunctionSpec) -> None:
    """One instance start already counted in router.pending.

    A start failed in doubt may yet complete (Schedule places on past
    the call's deadline): tried again, still pending, as the same id,
    which Schedule joins (a new id: a second instance past max_scale)."""
    d.ops["scale_up"] += 1
    fnstats.cold_start(spec)
    instance_id = d.new_instance_id(spec)
    peers = d.peers
    wallet = peers.credits
    loop = at.StartAttempts(
        f"an instance of {short(spec.name)}",
        lambda: d.membership.ranked(SCHEDULE, spec.name),
        peers.max_spill,
        wallet.room_retry if wallet is not None else None,
        START_ATTEMPTS,
        START_RETRY_S,
    )
    t0 = time.perf_counter()  # this round's start: its cold start's latency
    while True:
        step = loop.next(routed=d.routers.get(router.name) is router)
        info: common_pb2.InstanceInfo | None = None
        if isinstance(step, at.UseCredit):
            t0 = time.perf_counter()
            try:
                info = await peers.from_credit(spec, instance_id, list(step.ranked))
            except GalaxyError as e:
                loop.credit_failed(
                    at.NEVER_FITS if isinstance(e, FailedPrecondition) else at.IN_DOUBT, e.message
                )
            else:
                if info is None:
                    loop.no_credit()
        elif isinstance(step, at.AskSchedule):
            if not step.spill and not loop.credits:
                t0 = time.perf_counter()
            try:
                info = await peers.ask_schedule(spec, instance_id, step.schedule)
            except grpc.aio.AioRpcError as e:
                loop.failed(e.code().name, f"schedule {step.schedule.id}: {e.details()}")
        elif isinstance(step, at.ReturnCredits):
            # No room where Schedule looked. Part of it may be held by this
            # instance's own spent credits (remainders too small for a
            # start, returned with the next exchange): return them now and
            # try again, else the waiters sit out the next autoscaler round
            # with the room unused.
            ROOM_RETRIED.inc()
            await peers.return_credits(CREDIT_RETURN_WAIT_S)
        elif isinstance(step, at.Pause):
            log.info("start of %s in doubt: trying again as the same id", instance_id)
            # A pause before the retry (a loaded Schedule), not a wait for an event.
            await asyncio.sleep(step.seconds)
        else:
            log.warning(step.message)
            start_failed(d, router, spec, ERRORS[step.failure](step.message))
            return
        if info is not None:
            fnstats.cold_start_ready(spec, time.perf_counter() - t0)
            d.add(router, info, cold=True)
            d.backoff.succeeded(spec.name)  # start backoff: a start served
            ask_again(d, router, spec)  # waiters it could not take
            return


def start_failed(
    d: Dispatcher, router: FunctionRouter, spec: common_pb2.FunctionSpec, err: GalaxyError
) -> None:
    """A start of ``router``'s failed for good (``err``): the waiters no
    other start covers fail with it, or go to the function's owner when
    ``router`` was handed over meanwhile. Counted by the start backoff."""
    if d.routers.get(router.name) is not router and coordination.late_start_failed(d, router):
        return  # handed over meanwhile: what it covered went to the owner
    step = d.backoff.failed(spec.name, spec.version, err.message, err.code.name)
    if step is not None:  # one line per backoff step, not per request
        log.warning(
            "starts of %s failed %d times in a row: next attempt in %.1fs; last error: %s",
            step.function, step.failures, step.delay_s, step.error,
        )  # fmt: skip
    # Tell the waiters that nothing will serve them (if that is so).
    for w in router.scale_up_failed():
        fut: asyncio.Future[Grant] = w.token
        if not fut.done():
            fut.set_exception(err)
    # The others were counted on this start: when the starts still under way
    # do not cover them, a replacement starts now, not at the next request
    # (the start backoff may hold it back).
    ask_again(d, router, spec)


def ask_again(d: Dispatcher, router: FunctionRouter, spec: common_pb2.FunctionSpec) -> None:
    """A start of ``router``'s ended: the starts its waiters still need (its
    share when it failed; those the new instance and the starts under way
    do not cover, when it is ready: the count of a waiter may have changed
    with what the requests in flight take) begin now, not at the next
    request or autoscaler round."""
    if router.waiters and d.routers.get(router.name) is router:
        d.trigger_scale_up(router, spec)
