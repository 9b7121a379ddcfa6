"""One instance start of a Dispatch instance: placement through a credit or
Schedule (``Peers.place``), its retries, and the waiters' fate when it fails.
The servicer counts the start in its router first (``begin_scale_up``)."""

from __future__ import annotations

import asyncio
import logging
from typing import TYPE_CHECKING

from prometheus_client import Counter

from controlplane.runtime.errors import GalaxyError, ResourceExhausted, Unavailable
from functions.dispatch import coordination, fnstats
from functions.dispatch.peers import SCHEDULE
from functions.dispatch.policy import FunctionRouter, Grant
from galaxy.v1 import common_pb2

if TYPE_CHECKING:
    from functions.dispatch.service import DispatchServicer

log = logging.getLogger(__name__)

#: Attempts of one instance start (under one id) that fails UNAVAILABLE, and
#: the pause before the second (doubling after).
START_ATTEMPTS = 3
START_RETRY_S = 0.5
#: How long a start refused for room waits for the remainders of spent
#: credits to reach their grantors before its retry (CreditWallet.room_retry).
CREDIT_RETURN_WAIT_S = 2.0
ROOM_RETRIED = Counter(
    "galaxy_dispatch_room_retries_total",
    "Starts refused for room, tried again after returning spent credits' remainders",
)


async def scale_up(
    svc: DispatchServicer, router: FunctionRouter, spec: common_pb2.FunctionSpec
) -> None:
    """One instance start already counted in router.pending.

    A start failed UNAVAILABLE may yet complete (Schedule places on past
    the call's deadline): tried again, still pending, as the same id,
    which Schedule joins (a new id: a second instance past max_scale)."""
    svc.ops["scale_up"] += 1
    fnstats.cold_start(spec)
    instance_id = f"{spec.name}-{svc.instance_id}-{next(svc._ids)}"
    ranked = svc.membership.ranked
    credits, room_retries, doubts = True, 0, 0
    try:
        while True:
            try:
                info = await svc.peers.place(
                    spec, instance_id, ranked(SCHEDULE, spec.name), credits=credits
                )
                break
            except ResourceExhausted:
                # No room where Schedule looked. Part of it may be held
                # by this instance's own spent credits (remainders too
                # small for a start, returned with the next exchange):
                # return them now and try again, else the waiters sit
                # out the next autoscaler round with the room unused.
                wallet = svc.peers.credits
                if (
                    wallet is None
                    or not wallet.room_retry(room_retries)
                    or svc.routers.get(router.name) is not router
                ):
                    raise
                room_retries += 1
                ROOM_RETRIED.inc()
                await svc.peers.return_credits(CREDIT_RETURN_WAIT_S)
            except Unavailable:
                credits = False  # a retry goes through Schedule: it joins the start in doubt
                doubts += 1
                if doubts >= START_ATTEMPTS or svc.routers.get(router.name) is not router:
                    raise
                log.info("start of %s in doubt: trying again as the same id", instance_id)
                # A pause before the retry (a loaded Schedule), not a wait for an event.
                await asyncio.sleep(START_RETRY_S * 2 ** (doubts - 1))
    except GalaxyError as err:
        if svc.routers.get(router.name) is not router and coordination.late_start_failed(
            svc, router
        ):
            return  # handed over meanwhile: what it covered went to the owner
        step = svc.backoff.failed(spec.name, spec.version, err.message, err.code.name)  # backoff
        if step is not None:
            log.warning(
                "starts of %s failed %d times in a row: next attempt in %.1fs; last error: %s",
                step.function, step.failures, step.delay_s, step.error,
            )  # fmt: skip
        # Tell the waiters that nothing will serve them (if that is so).
        for w in router.scale_up_failed():
            fut: asyncio.Future[Grant] = w.token
            if not fut.done():
                fut.set_exception(err)
        return
    svc._add(router, info, cold=True)
    svc.backoff.succeeded(spec.name)  # start backoff: it served
