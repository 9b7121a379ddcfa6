"""Two running clusters through their gateways, interleaved so that the
machine's drift cannot decide (`python -m controlplane.bench.gateway_ab
--cluster process=RUN_DIR --cluster bwrap=RUN_DIR`): for each pair and each
concurrency, ``gateway.measure`` runs against one cluster and then the other
(the order flips every pair; a third ``--cluster``, e.g. another tree's
code, joins each pair and the order rotates), on the direct path and the caching gateway
only. The report gives every pair (requests/s, p50, the node's CPU per
request and the agent's share of it, load averages) and, per concurrency,
the medians over pairs of the second cluster against the first: the change
in throughput, the p50 added, the node CPU added per request, and the
change in throughput where every core is busy (the inverse of the CPU a
request costs the node, the gateway and the load generator together; less
noisy on a shared machine than requests/s, which at concurrency 1 is the
inverse of the latency).

Needs both `galaxy up` run dirs with examples/echo.yaml deployed (at
`min_scale` 2, so that no instance starts during a run).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
from pathlib import Path

from controlplane.bench import gateway
from controlplane.runtime.host import install_uvloop

#: The paths each run measures: the instance's address and the caching gateway.
MODES = ("direct", "gateway_cache")
_PATH = "gateway_cache"


def order(pair: int, labels: list[str]) -> list[str]:
    """The clusters' order in pair number pair: rotated by one every pair
    (two clusters: flipped every other pair), so that each runs first, and
    after each other, as often as the others."""
    k = pair % len(labels)
    return labels[k:] + labels[:k]


def _total(path: dict[str, float]) -> float:
    """CPU (µs) a request costs the node, the gateway and the load generator
    together: where every core is busy, throughput is its inverse."""
    parts = ("node", "proxy", "client")
    return round(sum(path[f"{k}_cpu_us_per_request"] for k in parts), 1)


def summarize(runs: list[dict[str, object]], base: str, other: str) -> dict[str, object]:
    """Per concurrency: each pair of base against other through the caching
    gateway, and the medians over pairs. runs: one record per measurement,
    {"pair", "concurrency", "cluster", "modes": gateway.measure's modes}."""
    out: dict[str, object] = {}
    for c in sorted({int(r["concurrency"]) for r in runs}):  # type: ignore[call-overload]
        got: dict[tuple[int, str], dict[str, float]] = {
            (int(r["pair"]), str(r["cluster"])): r["modes"][_PATH]  # type: ignore[call-overload,index]
            for r in runs
            if r["concurrency"] == c
        }
        rows = []
        for pair in sorted({p for p, _ in got}):
            a, b = got.get((pair, base)), got.get((pair, other))
            if a is None or b is None:
                continue  # a pair cut short
            rows.append(
                {
                    "pair": pair,
                    f"{base}_rps": a["requests_per_s"],
                    f"{other}_rps": b["requests_per_s"],
                    "throughput_change_pct": round(
                        (b["requests_per_s"] / a["requests_per_s"] - 1) * 100, 1
                    ),
                    "added_p50_ms": round(b["p50_ms"] - a["p50_ms"], 3),
                    f"{base}_node_cpu_us": a["node_cpu_us_per_request"],
                    f"{other}_node_cpu_us": b["node_cpu_us_per_request"],
                    "added_node_cpu_us": round(
                        b["node_cpu_us_per_request"] - a["node_cpu_us_per_request"], 1
                    ),
                    f"{other}_agent_cpu_us": b["agent_cpu_us_per_request"],
                    f"{base}_total_cpu_us": _total(a),
                    f"{other}_total_cpu_us": _total(b),
                    "cpu_bound_throughput_change_pct": round((_total(a) / _total(b) - 1) * 100, 1),
                }
            )
        if not rows:
            continue

        def med(k: str, rows: list[dict[str, float]] = rows) -> float:
            return round(statistics.median(r[k] for r in rows), 3)

        out[f"concurrency_{c}"] = {
            "pairs": rows,
            "median_throughput_change_pct": med("throughput_change_pct"),
            "median_added_p50_ms": med("added_p50_ms"),
            "median_added_node_cpu_us": med("added_node_cpu_us"),
            "median_cpu_bound_throughput_change_pct": med("cpu_bound_throughput_change_pct"),
            f"median_{base}_node_cpu_us": med(f"{base}_node_cpu_us"),
            f"median_{other}_node_cpu_us": med(f"{other}_node_cpu_us"),
        }
    return out


async def run(
    clusters: dict[str, Path],
    pairs: int,
    concurrencies: list[int],
    n: int,
    rounds: int,
    agent_pids: dict[str, tuple[int, ...]],
) -> dict[str, object]:
    """Every measurement, interleaved, and the summary."""
    labels = list(clusters)
    runs: list[dict[str, object]] = []
    for pair in range(pairs):
        for c in concurrencies:
            for label in order(pair, labels):
                load = os.getloadavg()[0]
                got = await gateway.measure(
                    clusters[label], n, rounds, c, None, agent_pids.get(label, ()), MODES
                )
                runs.append(
                    {
                        "pair": pair,
                        "concurrency": c,
                        "cluster": label,
                        "load_before": round(load, 2),
                        "load_after": round(os.getloadavg()[0], 2),
                        "modes": got["modes"],
                    }
                )
    return {
        "requests_per_run": n * rounds,
        "runs": runs,
        "summary": summarize(runs, labels[0], labels[1]),
        # With more than two clusters, each against the first (the second's
        # is "summary").
        "summaries": {other: summarize(runs, labels[0], other) for other in labels[1:]},
    }


def _label_value(text: str, what: str) -> tuple[str, str]:
    label, sep, value = text.partition("=")
    if not sep or not label or not value:
        raise SystemExit(f"{what}: LABEL=VALUE, got {text!r}")
    return label, value


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument(
        "--cluster",
        action="append",
        required=True,
        help="LABEL=RUN_DIR, two or more times: the baseline first",
    )
    p.add_argument("--pairs", type=int, default=4)
    p.add_argument("--concurrency", type=int, action="append", help="repeatable (default 1, 8)")
    p.add_argument("--requests", type=int, default=1000, help="per mode and round")
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument(
        "--agent-pid",
        action="append",
        default=[],
        help="LABEL=PID: a node agent of that cluster not started by its `galaxy up`",
    )
    a = p.parse_args()
    clusters = dict(_label_value(c, "--cluster") for c in a.cluster)
    if len(clusters) < 2:
        raise SystemExit(f"--cluster: two labels or more, got {len(clusters)}")
    pids: dict[str, tuple[int, ...]] = {}
    for text in a.agent_pid:
        label, pid = _label_value(text, "--agent-pid")
        if label not in clusters or not pid.isdigit():
            raise SystemExit(f"--agent-pid: LABEL=PID with a label of --cluster, got {text!r}")
        pids[label] = (*pids.get(label, ()), int(pid))
    install_uvloop()  # as `galaxy serve` (the gateways) runs
    out = asyncio.run(
        run(
            {k: Path(v) for k, v in clusters.items()},
            a.pairs,
            a.concurrency or [1, 8],
            a.requests,
            a.rounds,
            pids,
        )
    )
    print(json.dumps(out, indent=2))


if __name__ == "__main__":
    main()
