"""`galaxy serve dispatch`: flags and the Component the host runs."""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import logging
import time
from typing import Any

from controlplane.runtime import access, authn, config, controllers, leasetoken, scoring
from controlplane.runtime.config import RpcConfig
from controlplane.runtime.host import HostContext
from controlplane.runtime.metrics import QUEUE_LIMIT
from controlplane.runtime.rpc import ChannelPool
from functions.dispatch import autoscale, llmroute, routedcheck
from functions.dispatch.backoff import StartBackoff
from functions.dispatch.config import DispatchConfig
from functions.dispatch.credits import CreditWallet
from functions.dispatch.service import DispatchServicer
from galaxy.v1 import common_pb2, controller_pb2, dispatch_pb2_grpc
from statestore import StoreError
from statestore.records import Recorder

log = logging.getLogger(__name__)
# How long start-up may wait for instance records before starting empty.
RECOVER_TIMEOUT_S = 5.0
TOKEN_LOOKUP_TIMEOUT_S = 2.0


def add_arguments(p: argparse.ArgumentParser) -> None:
    """Dispatch flags (common ones are added by the CLI): ``DispatchConfig``
    and the function autoscaler's."""
    config.add_arguments(p, DispatchConfig)
    autoscale.add_arguments(p)
    config.add_arguments(p, RpcConfig, config.TOKEN_FLAGS)


class DispatchComponent:
    """A Dispatch instance as a host Component."""

    kind = common_pb2.CONTROL_KIND_DISPATCH

    def __init__(self, args: argparse.Namespace) -> None:
        self.args = args
        cfg = config.from_args(DispatchConfig, args)
        self.recorder = Recorder(cfg.state, cfg.record_ttl_s)
        # Placeholder pool until start() hands over the host's.
        self.servicer = DispatchServicer(
            instance_id=args.id,
            pool=ChannelPool(),
            controller=args.controller,
            lease_ttl_s=cfg.lease_ttl_ms / 1000.0,
            max_queue=cfg.max_queue,
            max_spill=cfg.max_spill,
            record=self.recorder,
            autoscale=autoscale.AutoscaleSettings.from_args(args),
            llm_picker=cfg.llm_picker,
        )
        self.dispatcher = self.servicer.dispatcher
        self.dispatcher.backoff = StartBackoff(cfg.start_backoff(), self.dispatcher.clock)
        # Bounds per function router; the waiting gauge is the instance's total.
        QUEUE_LIMIT.labels("galaxy_dispatch_waiting").set(cfg.max_queue)
        if cfg.credits:  # scale-ups that fit a credit skip Schedule (peers.py)
            peers = self.dispatcher.peers
            peers.credits = CreditWallet(
                target=cfg.credit_target,
                floor=cfg.credit_floor,
                shrink_s=cfg.credit_shrink_ms / 1000.0,
                renew_s=cfg.credit_renew_ms / 1000.0,
                idle_s=cfg.credit_idle_ms / 1000.0,
                max_starting=cfg.credit_max_starting,
                score=scoring.lookup(cfg.scoring),
            )
        self.servicer.lease_key = key = leasetoken.from_args(args)
        if key is not None:  # the node's entry asks for a lease token, as for a request

            def sign(instance_id: str) -> str:
                ends_ms = time.time_ns() // 1_000_000 + llmroute.SCRAPE_TOKEN_MS
                return key.sign(instance_id, ends_ms)

            # Scrapes, and sleep, wake and state calls (from the recovery on).
            self.dispatcher.sleeping.sign = sign
        self._housekeeping: asyncio.Task[None] | None = None
        self._routed_check: asyncio.Task[None] | None = None
        self._scrapes: asyncio.Task[None] | None = None
        # Tokens are verified against the controller's records, cached.
        rpc = config.rpc_of(args)
        self.authenticator = (
            authn.Authenticator(self._lookup_token, access.TokenCache(ttl_s=rpc.token_cache_s))
            if rpc.tokens_enabled()
            else None
        )

    async def _lookup_token(self, token_id: str) -> access.TokenRecord | None:
        reply = await controllers.call(
            self.dispatcher.pool,
            self.args.controller,
            "LookupToken",
            controller_pb2.LookupTokenRequest(id=token_id),
            timeout_s=TOKEN_LOOKUP_TIMEOUT_S,
        )
        return authn.record_of(reply)

    def services(self) -> list[tuple[Any, Any, str]]:
        return [
            (dispatch_pb2_grpc.add_DispatchServicer_to_server, self.servicer, "galaxy.v1.Dispatch")
        ]

    async def start(self, ctx: HostContext) -> None:
        self.dispatcher.bind(ctx.address, ctx.pool)
        self.recorder.start()
        await self._recover()
        self._housekeeping = asyncio.create_task(self._expire_loop())
        self._routed_check = asyncio.create_task(self._routed_loop())
        self._scrapes = asyncio.create_task(self._scrape_loop())

    async def _recover(self) -> None:
        """Rebuild the routing view from instance records plus node agents.

        Bounded: a store that does not answer must not keep Dispatch from
        starting (it then starts empty and cold-starts as needed).
        """
        try:
            kvs = await asyncio.wait_for(
                self.recorder.store.get_prefix("/galaxy/instances/"), RECOVER_TIMEOUT_S
            )
        except (TimeoutError, StoreError) as e:
            log.warning("instance records unavailable, starting empty: %s", e)
            return
        infos = [common_pb2.InstanceInfo.FromString(kv.value) for kv in kvs]
        if infos:
            n = await self.dispatcher.recover(infos)
            log.info("recovered %d of %d recorded instances", n, len(infos))

    async def _routed_loop(self) -> None:
        # Periodic by nature: an agent that lost instances sends nothing.
        while True:
            await asyncio.sleep(routedcheck.CHECK_S)
            try:
                await self.dispatcher.check_routed()
            except Exception:
                # A bug in one round must not stop the checks for good.
                log.exception("routed-instances check failed")

    async def _scrape_loop(self) -> None:
        # Periodic by nature: an engine's load changes without a request here.
        d, sign = self.dispatcher, self.dispatcher.sleeping.sign
        while True:
            await asyncio.sleep(llmroute.SCRAPE_S)
            try:
                targets = d.llm.targets(d.routers, d.specs)
                if targets:
                    await d.llm.scrape_round(targets, sign)
            except Exception:
                log.exception("LLM signal scrape failed")

    async def _expire_loop(self) -> None:
        # Periodic by nature: reclaims leases of clients that never Released,
        # and runs the function autoscaler every tick.
        tick = self.dispatcher.autoscaling.settings.tick_s
        loop = asyncio.get_running_loop()
        next_expire = loop.time() + 1.0
        while True:
            await asyncio.sleep(min(tick, 1.0))
            if loop.time() >= next_expire:
                self.dispatcher.expire_leases()
                self.dispatcher.peers.credit_upkeep()
                next_expire = loop.time() + 1.0
            try:
                self.dispatcher.autoscale_tick()
            except Exception:
                # A bug in one round must not stop autoscaling for good.
                log.exception("autoscale tick failed")

    def on_membership(self, membership: common_pb2.Membership) -> None:
        self.dispatcher.membership_changed(membership)

    def load_counters(self) -> dict[str, int]:
        """Cumulative operation counts for the load reporter: dispatch
        (requests this instance routed), scale_up, forwarded."""
        return dict(self.dispatcher.ops)

    def queue_depth(self) -> int:
        """Work in progress: requests waiting for an instance, plus the
        background work under way (scale-ups, handovers to a new owner,
        deletes). The controller stops a drained instance only at zero, so a
        handover is never cut off."""
        waiting = sum(len(r.waiters) for r in self.dispatcher.routers.values())
        return waiting + self.dispatcher.background

    async def stop(self) -> None:
        for task in (self._housekeeping, self._routed_check, self._scrapes):
            if task:
                task.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await task
        await self.dispatcher.close()
        await self.dispatcher.peers.close()
        await self.recorder.stop()


def build(args: argparse.Namespace) -> DispatchComponent:
    """The Dispatch component from parsed flags."""
    return DispatchComponent(args)
