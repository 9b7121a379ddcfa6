"""``galaxy bench --recommend``: the cheapest configuration that meets an SLO
at a given load, found by measuring, not by modelling.

Cost is the number of control function processes (Dispatch + Schedule +
ClusterMgr); at equal cost, caches off is cheaper (no memory for them).
Candidates are tried in cost order, each on a fresh control plane with an
open-loop load at the requested rate; the first cost level with a passing
candidate wins. A candidate passes when every objective is met, it carried
at least 90% of the load, and under 1% of its requests failed. Caches off is
only tried where caches on passed with the same instance counts: the caches
only remove work, so turning them off cannot rescue a failing configuration.
"""

from __future__ import annotations

import itertools
import math
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from controlplane.bench import experiment as ex
from controlplane.bench import plan as pl
from controlplane.bench import report, runner, slo

MIN_CARRIED = 0.9
MAX_ERROR_RATE = 0.01


@dataclass(frozen=True)
class Candidate:
    """One point of the configuration space."""

    dispatch: int
    schedule: int
    clustermgr: int
    caches: bool

    @property
    def cost(self) -> int:
        """Control function processes."""
        return self.dispatch + self.schedule + self.clustermgr

    @property
    def label(self) -> str:
        """e.g. 'dispatch=2 schedule=1 clustermgr=1 caches=on'."""
        c = "on" if self.caches else "off"
        return (
            f"dispatch={self.dispatch} schedule={self.schedule} "
            f"clustermgr={self.clustermgr} caches={c}"
        )


def candidates(max_per_kind: int) -> list[Candidate]:
    """Every candidate with caches on, cheapest first (ties: more Dispatch and
    Schedule before more ClusterMgr, which is off the request path)."""
    rng = range(1, max_per_kind + 1)
    out = [Candidate(d, s, c, True) for d, s, c in itertools.product(rng, rng, rng)]
    return sorted(out, key=lambda k: (k.cost, k.clustermgr, -k.dispatch, k.schedule))


def workload(
    base: pl.BenchFile | None, objectives: list[slo.Objective], load: float, duration_s: float
) -> pl.BenchFile:
    """The bench file one trial runs: the given file's first scenario (or a
    default one that fits the objectives) at ``load`` requests/s, open loop."""
    total = max(200, int(load * duration_s))
    warm = max(20, total // 10)
    if base is not None:
        sc = base.experiment.scenarios[0]
        sc = replace(sc, profile=replace(sc.profile, arrival_rate=load))
        # Open loop at exactly the requested load: no rate borrowed from
        # another scenario, no closed-loop maximum search.
        extra = {k: v for k, v in sc.extra.items() if k != "rate_of"}
        sc = replace(sc, extra={**extra, "mode": "open"})
        exp = ex.Experiment(base.experiment.name, [sc], {}, [o.text for o in objectives])
        return replace(base, experiment=exp)
    cold = any(
        o.metric.endswith(("cold_start", "scheduling")) or "instances" in o.metric
        for o in objectives
    )
    sc = ex.Scenario(
        name="cold" if cold else "warm",
        total_requests=total + warm,
        warmup_requests=warm,
        cold_fraction=1.0 if cold else 0.0,
        profile=ex.RequestProfile("poisson", load),
        extra={"mode": "open"},
    )
    exp = ex.Experiment("recommend", [sc], {}, [o.text for o in objectives])
    return pl.BenchFile(Path("recommend"), exp, dict(pl.CP_DEFAULTS), dict(pl.LOAD_DEFAULTS))


def judge(
    plan: dict[str, Any], objectives: list[slo.Objective], load: float
) -> tuple[bool, list[str]]:
    """Does a trial's plan pass? Returns (passed, reasons it did not)."""
    why = []
    for o in objectives:
        v, met = o.check(plan)
        if not met:
            why.append(
                f"{o.text}: measured {v:.1f}" if not math.isnan(v) else f"{o.text}: not measured"
            )
    carried = plan["throughput"]["requests_per_s"] / load
    if not carried >= MIN_CARRIED:
        why.append(f"carried only {carried:.0%} of {load:.0f}/s")
    r = plan["requests"]
    if r["measured"] and r["errors"] / r["measured"] >= MAX_ERROR_RATE:
        why.append(f"{r['errors']} of {r['measured']} requests failed")
    return not why, why


async def recommend(
    base: pl.BenchFile | None,
    objectives: list[slo.Objective],
    load: float,
    opts: runner.RunOptions,
    *,
    max_per_kind: int = 3,
    max_trials: int = 12,
    duration_s: float = 3.0,
) -> dict[str, Any]:
    """Search; returns the recommendation document (also written to out)."""
    bf = workload(base, objectives, load, duration_s)
    trials: list[dict[str, Any]] = []
    best: dict[str, Any] | None = None

    async def trial(c: Candidate) -> dict[str, Any]:
        params = {"dispatch": [c.dispatch], "schedule": [c.schedule]}
        params.update(clustermgr=[c.clustermgr], caches=[c.caches])
        exp = replace(bf.experiment, parameters=params)
        out = opts.out / "trials" / f"{len(trials):02d}"
        res = await runner.run_bench(replace(bf, experiment=exp), replace(opts, out=out))
        report.write_all(res, out)
        entry: dict[str, Any] = {"candidate": c.label, "cost": c.cost, "dir": str(out)}
        if not res["plans"]:
            err = res["failures"][0]["error"] if res["failures"] else "no result"
            entry.update(passed=False, reasons=[f"run failed: {err}"])
        else:
            p = res["plans"][0]
            ok, why = judge(p, objectives, load)
            entry.update(passed=ok, reasons=why, evidence=_evidence(p, objectives))
        trials.append(entry)
        verdict = "PASS" if entry["passed"] else "fail"
        opts.log(f"trial {len(trials)}: {c.label}: {verdict} {entry['reasons']}")
        return entry

    for c in candidates(max_per_kind):
        if len(trials) >= max_trials:
            break
        e = await trial(c)
        if not e["passed"]:
            continue
        best = e
        if len(trials) < max_trials:
            off = await trial(replace(c, caches=False))
            if off["passed"]:
                best = off
        break  # candidates come cheapest first: nothing later is cheaper
    return {
        "load_per_s": load,
        "objectives": [o.text for o in objectives],
        "recommendation": best,
        "trials": trials,
        "rules": __doc__,
    }


def _evidence(p: dict[str, Any], objectives: list[slo.Objective]) -> dict[str, Any]:
    return {
        "measured": {o.text: o.check(p)[0] for o in objectives},
        "requests_per_s": p["throughput"]["requests_per_s"],
        "instances_per_s": p["throughput"]["instances_per_s"],
        "echo_requests_per_s": p["baseline"]["echo"]["requests_per_s"],
        "ratio_to_echo": p["ratio_to_echo"]["requests_per_s"],
        "latency_ms": {
            k: p["latency_ms"][k] for k in ("warm_dispatch", "cold_start", "scheduling")
        },
        "requests": p["requests"],
    }


def render(doc: dict[str, Any]) -> str:
    """The recommendation for a person (printed and written as recommend.md)."""
    lines = [f"# Recommendation for {', '.join(doc['objectives'])} at {doc['load_per_s']:.0f}/s\n"]
    best = doc["recommendation"]
    if best is None:
        lines.append("No configuration tried met the objectives (see the trials below).\n")
    else:
        ev = best["evidence"]
        lines.append(f"**Cheapest passing: {best['candidate']}** ({best['cost']} processes)\n")
        for k, v in ev["measured"].items():
            lines.append(f"- {k}: measured {report._f(v)}")
        lines.append(
            f"- carried {report._f(ev['requests_per_s'], 0)} req/s "
            f"({report._f(ev['ratio_to_echo'])}x the raw echo's "
            f"{report._f(ev['echo_requests_per_s'], 0)} req/s), "
            f"{ev['requests']['errors']} errors of {ev['requests']['measured']}"
        )
        lines.append(f"- full report: {best['dir']}/report.md\n")
    lines.append("| # | candidate | cost | result | why not |")
    lines.append("|---|---|---|---|---|")
    for i, t in enumerate(doc["trials"]):
        res = "pass" if t["passed"] else "fail"
        lines.append(
            f"| {i} | {t['candidate']} | {t['cost']} | {res} | {'; '.join(t['reasons'])} |"
        )
    return "\n".join(lines) + "\n"
