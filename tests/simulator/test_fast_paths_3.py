"""Fast paths of the request data path against the plain code: the
Frontend's fused serve/done/release steps and its requests as plain tuples
until they wait, and the router's leases as plain tuples."""

from __future__ import annotations

import random
from typing import Any

import pytest

from controlplane.runtime.clock import ManualClock
from controlplane.runtime.compiled import is_compiled
from functions.dispatch.ownership import handover
from functions.dispatch.policy import FunctionRouter, Grant, Instance
from simulator import frontend
from simulator import workload as wl
from simulator.frontend import Frontend
from simulator.runner import run_one
from simulator.system import Req, SimConfig

# -- the warm path as separate steps (serve -> done -> release -> released) ---
# -- with a Req for every request ---------------------------------------------


def _plain_request(self: Frontend, fn: int, duration: float) -> None:
    now = self.sim.now
    self.requests += 1
    req = Req(fn, now, duration)
    dispatch = lambda r: _plain_dispatch(self, r)  # noqa: E731
    if self.client is not None:
        t = self.client.finish(now, self.s_client()) + self.net.hop()
        self.sim.pipeline(t, [(self.owner(fn), self._s_dispatch(), 0.0)], dispatch, req)
        return
    if self.via is not None:
        t = self.via.finish(now + self.net.hop(), self._s_dispatch()) + self.net.hop()
        self.sim.pipeline(t, [(self.owner(fn), self._s_dispatch(), 0.0)], dispatch, req)
        return
    st = self.owners[fn] or self.owner(fn)
    t = st.finish(now + self.net.hop(), self._s_dispatch())
    self.sim.at(t, dispatch, req)


def _plain_dispatch(self: Frontend, req: Req) -> None:
    router = self.routers[req.fn] or self.router(req.fn)
    g = router.acquire()
    if g is not None:
        _plain_serve(self, req, g, self.sim.now + self.net.hop())
        return
    router.enqueue(req)
    self.on_wait(req.fn, router)


def _plain_serve(self: Frontend, req: Req, g: Grant, reply_at: float) -> None:
    self.rec.granted(req.arrival, reply_at, g.cold_start)
    hop = self.net.hop
    done = reply_at + hop() + req.duration + hop()
    self.sim.at(done, lambda a: _plain_done(self, a), (req, g.lease_id))


def _plain_done(self: Frontend, a: tuple[Req, str]) -> None:
    req, lease = a
    self.rec.completed(self.sim.now)
    _plain_release(self, req, lease)


def _plain_release(self: Frontend, req: Req, lease: str) -> None:
    fn = req.fn
    st = self.owners[fn] or self.owner(fn)
    t = st.finish(self.sim.now + self.net.hop(), self._s_release())
    self.sim.at(t, lambda a: _plain_released(self, a), (fn, lease))


def _plain_released(self: Frontend, a: tuple[int, str]) -> None:
    router = self.routers[a[0]]
    assert router is not None
    _plain_serve_all(self, router.release(a[1])[1])


def _plain_serve_all(self: Frontend, grants: list[Any]) -> None:
    for w, g in grants:
        _plain_serve(self, w.token, g, self.sim.now + self.net.hop())


def _results(system: str, seed: int, cal: Any) -> dict[str, Any]:
    w = wl.poisson(150.0, 12.0, n_functions=12, mean_duration_s=0.3, seed=seed)
    r = run_one(system, w, SimConfig(nodes=30, seed=seed, keep_alive_s=2.0), cal)
    r.pop("perf")
    return r


@pytest.mark.skipif(is_compiled(frontend), reason="patches a class of the compiled build")
@pytest.mark.parametrize(("system", "seed"), [("galaxy", 1), ("galaxy", 2), ("knative", 3)])
def test_fused_warm_path_gives_the_plain_results(system, seed, cal, monkeypatch):
    fast = _results(system, seed, cal)
    monkeypatch.setattr(Frontend, "request", _plain_request)
    monkeypatch.setattr(Frontend, "_serve_all", _plain_serve_all)
    plain = _results(system, seed, cal)
    assert fast["counts"]["completed"] > 300
    assert fast["counts"]["instances_started"] > 0
    assert fast == plain


# -- leases as plain (instance_id, expires_at) tuples ------------------------


@pytest.mark.parametrize("seed", range(5))
def test_leases_match_a_plain_ledger(seed):
    # Random grants, releases, expiries and removals: the router's leases
    # always equal a ledger kept the plain way, and expire_leases releases
    # exactly the expired ones.
    rng = random.Random(seed)
    clock = ManualClock()
    r = FunctionRouter("f", 3, 100, clock, lease_ttl_s=5.0)
    ledger: dict[str, tuple[str, float]] = {}
    iids: list[str] = []
    for step in range(3000):
        op = rng.random()
        if op < 0.1 or not iids:
            iid = f"i{step}"
            iids.append(iid)
            for _, g in r.add_instance(Instance(iid, "a", "n", 3)):
                ledger[g.lease_id] = (g.instance.instance_id, clock.now() + 5.0)
        elif op < 0.5:
            g = r.acquire()
            if g is not None:
                ledger[g.lease_id] = (g.instance.instance_id, clock.now() + 5.0)
            else:
                r.enqueue(step)
        elif op < 0.75 and ledger:
            lid = rng.choice(sorted(ledger))
            del ledger[lid]
            known, grants = r.release(lid)
            assert known
            for _, g in grants:
                ledger[g.lease_id] = (g.instance.instance_id, clock.now() + 5.0)
        elif op < 0.8:
            iid = rng.choice(iids)
            iids.remove(iid)
            r.remove_instance(iid)
            ledger = {k: v for k, v in ledger.items() if v[0] != iid}
        elif op < 0.9:
            clock.advance(rng.random() * 2)
            expired = {k for k, v in ledger.items() if v[1] <= clock.now()}
            for k in expired:
                del ledger[k]
            for _, g in r.expire_leases():
                ledger[g.lease_id] = (g.instance.instance_id, clock.now() + 5.0)
            assert not expired & set(r.leases)
        else:
            moved = dict((i.instance_id, sorted(ls)) for i, ls in handover(r))
            want: dict[str, list[str]] = {i: [] for i in r.instances}
            for lid, (iid, _) in ledger.items():
                want.setdefault(iid, []).append(lid)
            assert moved == {i: sorted(ls) for i, ls in want.items()}
        assert r.leases == ledger
        assert r.load() == sum(i.in_flight for i in r.instances.values()) + len(r.waiters)
