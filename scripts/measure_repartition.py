"""Measure repartitioning (issue: many instances of every control function).

1. Keys moved when going from n to n+1 Schedule instances, for 210 and
   10,000 nodes, and the time to recompute the whole partition (pure
   rendezvous hashing, the work every holder of the membership does).
2. Time to *apply* a new partition in a live cluster: the real controller,
   ClusterMgr, Schedule and node agent (210 emulated nodes) run in-process;
   a Schedule instance joins, and we time from its registration until every
   Schedule instance holds exactly the nodes rendezvous assigns it.

    python scripts/measure_repartition.py [--apply-nodes 210] [--max-n 8]
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from controlplane.runtime import rendezvous


def moved_table(n_nodes: int, max_n: int) -> list[tuple[int, float, float, float]]:
    """(n, fraction moved n->n+1, ideal 1/(n+1), recompute ms) rows."""
    nodes = [f"node-{i}" for i in range(n_nodes)]
    rows = []
    for n in range(1, max_n + 1):
        before = [f"schedule-{i}" for i in range(n)]
        after = [*before, f"schedule-{n}"]
        old = {k: rendezvous.owner(k, before) for k in nodes}
        times = []
        for _ in range(5):
            t0 = time.perf_counter()
            new = {k: rendezvous.owner(k, after) for k in nodes}
            times.append((time.perf_counter() - t0) * 1000)
        moved = sum(1 for k in nodes if old[k] != new[k])
        rows.append((n, moved / n_nodes, 1 / (n + 1), statistics.median(times)))
    return rows


async def apply_time(n_nodes: int, joins: int) -> list[float]:
    """Milliseconds from a Schedule instance's registration to converged partitions."""
    from tests.cluster import InProcessCluster, eventually

    c = InProcessCluster()
    out: list[float] = []
    try:
        await c.add("controller", "controller")
        await c.add("clustermgr", "clustermgr-0")
        await c.add("schedule", "schedule-0")
        await c.add("nodeagent", "agent-0", "--nodes", str(n_nodes), "--sandbox", "emulated")
        scheds = ["schedule-0"]
        await eventually(
            lambda: len(c.parts["schedule-0"].component.servicer.policy) == n_nodes, 60
        )
        node_ids = [f"node-{i}" for i in range(n_nodes)]

        def converged() -> bool:
            want = rendezvous.partition(node_ids, scheds)
            return all(
                sorted(n.node_id for n in c.parts[s].component.servicer.policy.nodes())
                == sorted(want[s])
                for s in scheds
            )

        for j in range(1, joins + 1):
            name = f"schedule-{j}"
            t0 = time.perf_counter()
            await c.add("schedule", name)  # returns once registered
            scheds.append(name)
            t_reg = time.perf_counter()
            await eventually(converged, 30, what="partitions converge")
            out.append((time.perf_counter() - t_reg) * 1000)
            print(
                f"  join {name}: {out[-1]:.1f} ms after registration "
                f"({(t_reg - t0) * 1000:.1f} ms to start and register)"
            )
    finally:
        await c.close()
    return out


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--max-n", type=int, default=8)
    p.add_argument("--apply-nodes", type=int, default=210)
    p.add_argument("--joins", type=int, default=3)
    a = p.parse_args()
    for n_nodes in (210, 10_000):
        print(f"\n{n_nodes} nodes: n -> n+1 Schedule instances")
        print("  n   moved    ideal 1/(n+1)   recompute (ms, median of 5)")
        for n, frac, ideal, ms in moved_table(n_nodes, a.max_n):
            print(f"  {n:<3} {frac:6.1%}   {ideal:6.1%}          {ms:8.2f}")
    print(f"\nApply in a live in-process cluster ({a.apply_nodes} emulated nodes):")
    times = asyncio.run(apply_time(a.apply_nodes, a.joins))
    print(f"  median {statistics.median(times):.1f} ms, max {max(times):.1f} ms")


if __name__ == "__main__":
    main()
