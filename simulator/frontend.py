"""The request data path every model shares.

Requests reach the process that routes their function (a Galaxy Dispatch
instance, Knative's activator, a Ray proxy, Atoll's semi-global scheduler),
which routes them with the function's production ``FunctionRouter``: a slot
on the least-loaded instance, else the request waits (FIFO) and the model's
``on_wait`` hook decides what to start. Routing costs the calibrated
Dispatch/Release service times on that process. Sharing this path means
systems differ only where their control planes differ.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import asdict, is_dataclass
from typing import Any

from controlplane.runtime.compiled import mypyc_attr
from functions.dispatch.policy import FunctionRouter, Grant, Instance, QueueFull, Waiter
from simulator.autoscale import FunctionScaling, galaxy_kpa
from simulator.cluster import SimNode
from simulator.engine import Station
from simulator.system import Env, Req, SystemModel

OwnerFn = Callable[[int], Station]
WaitFn = Callable[[int, FunctionRouter], None]
#: a request on its way to its owner: (function index, arrival, duration)
Sent = tuple[int, float, float]


class Frontend:
    """Routers of all functions; owner(fn) is the process routing fn."""

    def __init__(
        self, model: SystemModel, owner: OwnerFn, on_wait: WaitFn, via: Station | None = None
    ) -> None:
        self.m = model
        #: a process every request passes first (a central load balancer)
        self.via = via
        #: the client's process, when its CPU counts (one machine: fidelity)
        self.client: Station | None = None
        self.s_client = model.env.op("client.rpc")
        self.sim, self.net, self.rec = model.sim, model.net, model.rec
        self.owner = owner
        self.on_wait = on_wait
        self.routers: list[FunctionRouter | None] = [None] * len(model.fns)
        self._s_dispatch = model.env.op("dispatch.dispatch")
        self._s_release = model.env.op("dispatch.release")
        self.requests = 0
        #: how long a request may wait for a slot (None: no bound)
        self.wait_s: float | None = model.wait_s
        #: per function, the process of its owner when the model keeps it
        #: here (None: ask ``owner``); Galaxy keeps its Dispatch owners here
        self.owners: list[Station | None] = [None] * len(model.fns)
        #: told of a release of a lease fn's router does not know (a model
        #: whose routing state changes hands: Galaxy's Dispatch handover)
        self.on_unknown_release: Callable[[int, str], None] | None = None
        # Bound once: the warm path below uses them for every request (and
        # a method looked up on an object is a new object each time).
        self._hop, self._at = self.net.hop, self.sim.at
        self._on_dispatch, self._on_done = self._dispatch, self._done
        self._on_released = self._released

    def router(self, fn: int) -> FunctionRouter:
        """fn's router (created at first use)."""
        r = self.routers[fn]
        if r is None:
            r = self.routers[fn] = self.m.make_router(fn)
        return r

    # -- the warm path (lean: it runs for every request) ----------------------

    def request(self, fn: int, duration: float) -> None:
        """A request arrives now at the client, which sends it to fn's owner."""
        now = self.sim.now
        self.requests += 1
        # On its way to the owner a request is a plain tuple, not a ``Req``:
        # most get a slot at once and never need one (see ``_dispatch``).
        sent = (fn, now, duration)
        if self.client is not None:
            t = self.client.finish(now, self.s_client()) + self.net.hop()
            stages = [(self.owner(fn), self._s_dispatch(), 0.0)]
            self.sim.pipeline(t, stages, self._dispatch, sent)
            return
        if self.via is not None:
            t = self.via.finish(now + self.net.hop(), self._s_dispatch()) + self.net.hop()
            stage = (self.owner(fn), self._s_dispatch(), 0.0)
            self.sim.pipeline(t, [stage], self._dispatch, sent)
            return
        st = self.owners[fn] or self.owner(fn)
        t = st.finish(now + self._hop(), self._s_dispatch())
        self._at(t, self._on_dispatch, sent)

    def _dispatch(self, sent: Sent) -> None:
        fn, arrival, duration = sent
        router = self.routers[fn] or self.router(fn)
        g = router.acquire()
        if g is not None:
            # _serve, inline (most requests find a free slot)
            hop = self._hop
            reply_at = self.sim.now + hop()
            self.rec.granted(arrival, reply_at, g.cold_start)
            done = reply_at + hop() + duration + hop()
            self._at(done, self._on_done, (fn, g.lease_id))
            return
        self._wait(router, Req(fn, arrival, duration))

    def _wait(self, router: FunctionRouter, req: Req) -> None:
        """Queue a request that found no slot, within the router's waiter
        bound (production's ``DispatchConfig.max_queue``): past it the
        request fails as the servicer refuses it (RESOURCE_EXHAUSTED)."""
        try:
            w = router.enqueue(req)
        except QueueFull:
            self.rec.failed("queue_full")
            return
        if self.wait_s is not None:  # production's wait timeout (``waits``)
            self._at(self.sim.now + self.wait_s, self._wait_over, (router, w))
        self.on_wait(req.fn, router)

    def _wait_over(self, a: tuple[FunctionRouter, Waiter]) -> None:
        """A waiter's wait ran out: refused unless it was served (or handed on)."""
        if a[0].cancel(a[1]):
            self.rec.failed("wait_timeout")

    def _serve(self, req: Req, grant: Grant, reply_at: float) -> None:
        """The client gets its slot at reply_at and calls the instance; the
        request ends two hops and its duration later (``_done``)."""
        self.rec.granted(req.arrival, reply_at, grant.cold_start)
        hop = self._hop
        done = reply_at + hop() + req.duration + hop()
        self._at(done, self._on_done, (req.fn, grant.lease_id))

    def _serve_all(self, grants: list[tuple[Waiter, Grant]]) -> None:
        """Answer waiters that got slots, each one hop from now."""
        now = self.sim.now
        for w, g in grants:
            self._serve(w.token, g, now + self._hop())

    def serve_all(self, grants: list[tuple[Waiter, Grant]]) -> None:
        """Answer waiters served elsewhere than on this path (a handover's
        ``Serve``), as ``_serve_all`` does."""
        self._serve_all(grants)

    def _done(self, a: tuple[int, str]) -> None:
        """A request (of function a[0], holding lease a[1]) ended: its client
        returns the slot to fn's owner (one hop), which releases it when
        served (``_released``, with the same tuple)."""
        now = self.sim.now
        self.rec.completed(now)
        fn = a[0]
        st = self.owners[fn] or self.owner(fn)
        t = st.finish(now + self._hop(), self._s_release())
        self._at(t, self._on_released, a)

    def _released(self, a: tuple[int, str]) -> None:
        router = self.routers[a[0]]
        known, grants = (False, []) if router is None else router.release(a[1])
        if grants:
            self._serve_all(grants)
        if not known and self.on_unknown_release is not None:
            self.on_unknown_release(a[0], a[1])

    # -- instances -------------------------------------------------------------

    def ready(self, fn: int, inst: Instance) -> None:
        """A started instance is known to fn's router: waiters get its slots."""
        grants = self.router(fn).scale_up_done(inst)
        if grants:
            self._serve_all(grants)

    def redispatch(self, req: Req) -> None:
        """A request forwarded by its function's previous owner reaches the
        router now: a slot, else it waits like any other."""
        router = self.router(req.fn)
        g = router.acquire()
        if g is not None:
            self._serve(req, g, self.sim.now + self._hop())
            return
        self._wait(router, req)

    def failed(self, fn: int, reason: str) -> None:
        """A start failed; waiters nothing will serve fail."""
        for _ in self.router(fn).scale_up_failed():
            self.rec.failed(reason)

    def remove(self, fn: int, instance_id: str) -> Instance | None:
        """Stop routing to an (idle) instance; returns it."""
        r = self.routers[fn]
        return None if r is None else r.remove_instance(instance_id)

    def live(self) -> int:
        """Instances routable across all functions."""
        return sum(len(r.instances) for r in self.routers if r is not None)


@mypyc_attr(allow_interpreted_subclasses=True)
class RoutedModel(SystemModel):
    """A system model on the shared data path: a ``Frontend``, function
    autoscaling by the production KPA (Galaxy's defaults unless a subclass
    brings its own) and instance life-cycle plumbing. Subclasses implement
    ``start_instances`` (their control plane) and may override the hooks."""

    def __init__(self, env: Env, owner: OwnerFn, via: Station | None = None) -> None:
        super().__init__(env)
        self.front = Frontend(self, owner, self.waiting, via)
        self.scaling = self.make_scaling()
        self.a_create = env.op("agent.create")
        self.a_delete = env.op("agent.delete")

    def request(self, fn: int, duration: float) -> None:
        """A request arrives now: the shared data path."""
        self.front.request(fn, duration)

    def arrivals(self) -> Callable[[int, float], None]:
        """The data path itself (one call less per request)."""
        return self.front.request

    def make_scaling(self) -> FunctionScaling:
        """The function autoscaler (Galaxy's KPA defaults)."""
        return galaxy_kpa(self, self.front.routers, self.start_instances, self.retire)

    def start(self) -> None:
        self.scaling.start()

    def finish(self) -> None:
        self.scaling.flush()  # the autoscalers as deciding every round leaves them
        self.rec.live_instances(self.sim.now, self.env.cluster.live)

    def params(self) -> dict[str, Any]:
        cfg = getattr(self, "cfg", None)
        own = asdict(cfg) if is_dataclass(cfg) and not isinstance(cfg, type) else {}
        return {**own, "function_scaling": self.scaling.describe()}

    def waiting(self, fn: int, router: FunctionRouter) -> None:
        """A request queued: start what the production coalescing rule
        (``scale_ups_needed``) asks for; the autoscaler watches fn."""
        self.scaling.touched(fn)
        n = router.scale_ups_needed()
        if n:
            self.start_instances(fn, n)

    def start_instances(self, fn: int, n: int) -> None:
        """Start n instances of fn (the control plane under test)."""
        raise NotImplementedError

    def create_on(self, node: SimNode, fn: int, iid: str, at: float) -> None:
        """The node's agent creates the (already allocated) instance; it is
        ready after the sandbox start, then ``ready`` runs."""
        cold = self.fns[fn].cold_start_s
        models = self.env.models
        if models is not None:  # no node cache: the model over the node's link
            load = models.fetch_only(node.id, fn)
            self.rec.sample("model_load", self.sim.now, load)
            cold += load
        stages = [(node.agent, self.a_create(), 0.0), (node.creator, cold, 0.0)]
        self.sim.pipeline(at, stages, self.ready, (node, fn, iid))

    def ready(self, a: tuple[SimNode, int, str]) -> None:
        """An instance is up on its node; its router learns of it one hop later."""
        node, fn, iid = a
        self.rec.started(self.sim.now)
        inst = Instance(iid, node.address, node.id, self.fns[fn].concurrency, meta=node)
        self.sim.at(self.sim.now + self.net.hop(), self.routable, (fn, inst))

    def routable(self, a: tuple[int, Instance]) -> None:
        """The router can use the instance: waiters get its slots."""
        fn, inst = a
        self.scaling.added(fn, inst)
        self.front.ready(fn, inst)

    def retire(self, fn: int, instance_id: str) -> None:
        """Remove an idle instance the autoscaler chose: out of the routing
        table first, then its node deletes it."""
        inst = self.front.remove(fn, instance_id)
        if inst is not None:
            self.delete_on_node(inst.meta, instance_id, self.a_delete())
