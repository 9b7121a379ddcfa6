"""LLM functions on the request path: which instance serves a request, and
the load signals the picker and the autoscaler read.

A function whose runtime declares LLM serving (``FunctionSpec.llm``) gets
its instance per request from the LLM picker
(``controlplane.runtime.llmpicker``): among its instances with a free slot,
the best weighted score of queue depth, KV-cache use and prefix affinity
(the request's leading block hashes, which the gateway sends as
``DispatchRequest.hint``). The function's owning Dispatch decides, as for
every grant, so no index is shared between Dispatch instances: each picker
remembers the prefixes it sent and reads the signals it scraped.

Signals are scraped (``run``): every ``scrape_s`` each routed instance of an
LLM function answers its ``/metrics`` (vLLM's names) within a deadline; the
last sample of each is kept in a ``LoadBook`` (stale after ``max_age_s``:
the picker then goes by its own in-flight counts). Scraping rather than
pushing keeps engines unchanged (vLLM, llama.cpp and the emulated server
all serve ``/metrics``); its cost per instance is measured in docs/llm.md.

Each scrape also reads the instance's TTFT and TPOT histograms into its
function's ``LatencyWindow`` (``controlplane.runtime.llmlatency``): the
fleet's recent p90 over ``LATENCY_WINDOW_S``, which the autoscaler turns
into SLO pressure (``fleet``) and admission into a predicted wait.

``LlmRouting`` holds the decisions' state and is driven by the Dispatcher
(``acquire``) and the autoscaler (``loads_of``, ``fleet``);
``scrape_round`` is its only I/O.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Iterable, Mapping
from typing import TYPE_CHECKING

from prometheus_client import Counter

from controlplane.runtime import leasetoken
from controlplane.runtime.clock import Clock
from controlplane.runtime.llmlatency import Latency, LatencyWindow
from controlplane.runtime.llmpicker import Ask, Candidate, Picker, make
from controlplane.runtime.llmsignals import Load, LoadBook, Sample, SignalError, scrape
from functions.dispatch.admission import shed_demand
from functions.dispatch.autoscaling.llmsignal import LATENCY_WINDOW_S, ScalingSignal, fleet_value
from functions.dispatch.autoscaling.llmsignal import observed as pressured
from functions.dispatch.pdpair import PrefillPairing
from functions.dispatch.policy import FunctionRouter, Grant
from galaxy.v1 import common_pb2, dispatch_pb2

if TYPE_CHECKING:
    import aiohttp

log = logging.getLogger(__name__)

#: scrape cadence and per-scrape deadline (a slow instance is skipped, not waited for)
SCRAPE_S = 0.5
SCRAPE_TIMEOUT_S = 0.3
#: a sample older than this is not used (missed scrapes: the instance is busy or gone)
MAX_AGE_S = 2.0
#: scrapes in flight at once per round (bounds sockets and the round's burst)
SCRAPE_PARALLEL = 32
#: prefill instances paired with a decode instance, by the link between them
PD_PAIRS = Counter(
    "galaxy_dispatch_pd_pairs_total",
    "Prefill instances granted for a disaggregated request, by the link to its decode instance",
    ["link"],
)
#: the lease token shown to a node's entry for a scrape lives this long
SCRAPE_TOKEN_MS = 5_000


class LlmRouting:
    """Pickers and load signals of the LLM functions one Dispatch routes."""

    def __init__(self, clock: Clock, policy: str = "llm", max_age_s: float = MAX_AGE_S) -> None:
        make(policy, clock.now)  # a policy name that is not known fails here, not per request
        self.clock = clock
        self.policy = policy
        self.book = LoadBook(max_age_s)
        self._pickers: dict[str, Picker] = {}
        #: the prefill half of a disaggregated request (``pdpair``)
        self.pairing = PrefillPairing()
        #: recent TTFT/TPOT per function, and the function of each scraped instance
        self._latency: dict[str, LatencyWindow] = {}
        self._function_of: dict[str, str] = {}
        #: requests shed per function since its last autoscaling round
        self._shed: dict[str, int] = {}
        self._session: aiohttp.ClientSession | None = None

    def picker(self, function: str) -> Picker:
        """The picker of one function (or revision), made on first use."""
        p = self._pickers.get(function)
        if p is None:
            p = self._pickers[function] = make(self.policy, self.clock.now)
        return p

    def acquire(
        self,
        router: FunctionRouter,
        spec: common_pb2.FunctionSpec,
        hint: dispatch_pb2.RoutingHint,
    ) -> Grant | None:
        """A slot for one request: on the picker's choice for an LLM
        function, on the least-loaded instance for any other (``None``: no
        free slot, or waiters queued first)."""
        if not spec.llm and not hint.decode_node:  # (a prefill pool need not scrape)
            return router.acquire()
        if router.waiters:
            return None  # the queue goes first, as for any function
        now = self.clock.now()
        book = self.book
        free = [
            Candidate(i.instance_id, i.in_flight, book.get(i.instance_id, now))
            for i in router.instances.values()
            if i.free > 0
        ]
        if not free:
            return None
        if hint.decode_node:  # a prefill for a decode instance on that node
            free_insts = (router.instances[c.instance] for c in free)
            pair = self.pairing.choose(free_insts, lambda iid: book.get(iid, now), hint)
            assert pair is not None  # free is not empty
            PD_PAIRS.labels(pair.link.name).inc()
            return router.acquire_on(pair.prefill.instance_id)
        ask = Ask(tuple(hint.prefix_blocks), hint.adapter)
        return router.acquire_on(self.picker(router.name).pick(free, ask))

    def loads_of(self, router: FunctionRouter) -> list[Load]:
        """The signals of the function's routable instances: the fresh
        scraped ones, and for an instance without (just started, or not
        answering) a stand-in of its requests in flight as running."""
        now = self.clock.now()
        out = []
        for iid, inst in router.instances.items():
            if inst.draining:
                continue
            load = self.book.get(iid, now)
            out.append(load if load is not None else Load(iid, now, Sample(running=inst.in_flight)))
        return out

    def latency(self, function: str) -> Latency:
        """The function's fleet p90 TTFT and TPOT over the last
        ``LATENCY_WINDOW_S`` (None each when nothing was observed)."""
        w = self._latency.get(function)
        return w.latency(self.clock.now()) if w is not None else Latency(None, None, 0.0)

    def fleet(self, signal: ScalingSignal, router: FunctionRouter, rps: float) -> float:
        """What the autoscaler observes of the function: the fleet value of
        its scaling metric (``llmsignal.fleet_value``; requests waiting here
        for a slot count in the queue: with no instance yet, they are all of
        it), times the SLO pressure of its recent latency while no
        instance is starting (``llmsignal.observed``)."""
        loads = self.loads_of(router)
        value = fleet_value(signal, loads, float(router.load()), rps)
        value = value + len(router.waiters) if signal.metric == "queue" else value
        value = shed_demand(signal, value, self._shed.pop(router.name, 0))
        if not (signal.ttft_s or signal.tpot_s):
            return value
        lat = self.latency(router.name)
        waiting = self.waiting(router, loads)
        return pressured(signal, value, lat.ttft_s, lat.tpot_s, router.pending, waiting)

    def shed(self, function: str) -> None:
        """Admission turned a request of ``function`` away: the next
        autoscaling round counts it as demand (``admission.shed_demand``)."""
        self._shed[function] = self._shed.get(function, 0) + 1

    def waiting(self, router: FunctionRouter, loads: list[Load] | None = None) -> int:
        """Requests of the function waiting: in its engines' queues (as
        last scraped) and here for a slot."""
        loads = self.loads_of(router) if loads is None else loads
        return sum(x.sample.waiting for x in loads) + len(router.waiters)

    def targets(
        self,
        routers: Mapping[str, FunctionRouter],
        specs: Mapping[str, common_pb2.FunctionSpec],
    ) -> list[tuple[str, str]]:
        """(instance id, address) of every routed instance of an LLM
        function; forgets the signals and prefixes of instances gone."""
        out: list[tuple[str, str]] = []
        for name, router in routers.items():
            spec = specs.get(name)
            if spec is None or not spec.llm:
                continue
            for iid, i in router.instances.items():
                if not i.address.startswith("emulated://"):
                    out.append((iid, i.address))
                    self._function_of[iid] = name
        self._forget_except({iid for iid, _ in out}, routers)
        return out

    def _forget_except(self, live: set[str], routers: Iterable[str]) -> None:
        for iid in (self.book.known() | set(self._function_of)) - live:
            self.book.forget(iid)
            for p in self._pickers.values():
                p.forget(iid)
            w = self._latency.get(self._function_of.pop(iid, ""))
            if w is not None:
                w.forget(iid)
        for name in set(self._pickers) - set(routers):
            del self._pickers[name]  # the function is no longer routed here
        for name in set(self._latency) - set(routers):
            del self._latency[name]
        for name in set(self._shed) - set(routers):
            del self._shed[name]

    def observe(self, iid: str, sample: Sample, sent_at: float | None = None) -> None:
        """Record one scrape of an instance: its load, and its latency
        histograms into its function's window. ``sent_at``: when the scrape
        left (the load is as of then: a slot returned after it makes the
        sample stale; default now)."""
        now = self.clock.now()
        self.book.observe(iid, sample, now if sent_at is None else sent_at)
        fn = self._function_of.get(iid)
        if fn is not None and (sample.ttft is not None or sample.tpot is not None):
            w = self._latency.get(fn)
            if w is None:
                w = self._latency[fn] = LatencyWindow(LATENCY_WINDOW_S)
            w.observe(iid, sample.ttft, sample.tpot, now)

    async def scrape_round(
        self, targets: list[tuple[str, str]], sign: Callable[[str], str] | None = None
    ) -> int:
        """Scrape every target once (at most ``SCRAPE_PARALLEL`` at a time,
        each within ``SCRAPE_TIMEOUT_S``); returns how many answered.
        ``sign`` makes the lease token a node's entry asks for."""
        if self._session is None or self._session.closed:
            import aiohttp  # here: only a Dispatch that routes an LLM pays its import

            self._session = aiohttp.ClientSession()
        session, gate = self._session, asyncio.Semaphore(SCRAPE_PARALLEL)

        async def one(iid: str, address: str) -> bool:
            headers = {leasetoken.HEADER: sign(iid)} if sign is not None else None
            async with gate:
                sent_at = self.clock.now()
                try:
                    sample = await scrape(
                        session, f"http://{address}/metrics", SCRAPE_TIMEOUT_S, headers=headers
                    )
                except SignalError as e:
                    log.debug("no signals from %s: %s", iid, e)
                    return False
            self.observe(iid, sample, sent_at)
            return True

        got = await asyncio.gather(*(one(i, a) for i, a in targets))
        return sum(got)

    async def close(self) -> None:
        """Close the scrape session."""
        if self._session is not None:
            await self._session.close()
            self._session = None
