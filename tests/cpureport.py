"""The suite's cost per test file: ``python -m tests.cpureport DIR [N]`` sums the
files a run wrote with ``GALAXY_CPU_REPORT=DIR python -m pytest`` (one per
worker, tests/conftest.py) and prints the N files (default 15) that used the
most CPU: user+system seconds of the worker and of the processes it started and
reaped (a `galaxy up`, a bench or chaos run), with the wall time beside them.
Then each worker's busy time (the wall seconds of its tests, summed) and its
idle time between the first test's start and the last test's end on any
worker: what an uneven split of the files cost the run."""

from __future__ import annotations

import json
import sys
from pathlib import Path


def totals(folder: Path) -> dict[str, tuple[float, float]]:
    """Per test file: (CPU seconds, wall seconds), summed over the workers."""
    out: dict[str, tuple[float, float]] = {}
    for f in sorted(folder.glob("*.json")):
        for name, (cpu, wall) in json.loads(f.read_text()).items():
            c, w = out.get(name, (0.0, 0.0))
            out[name] = (c + cpu, w + wall)
    return out


def busy(folder: Path) -> dict[str, float]:
    """Per worker (gw0, gw1, ...; "main" without xdist): the wall seconds its
    tests took, summed (setup, call and teardown)."""
    out: dict[str, float] = {}
    for f in sorted(folder.glob("*.json")):
        worker = f.stem.rsplit("-", 1)[0]
        walls = [wall for _, wall in json.loads(f.read_text()).values()]
        out[worker] = out.get(worker, 0.0) + sum(walls)
    return out


def run_span(folder: Path) -> float:
    """Seconds from the first test's start on any worker to the last test's
    end on any worker."""
    spans = [json.loads(f.read_text()) for f in folder.glob("*.span")]
    spans = [x for x in spans if len(x) == 2 and x[1]]
    return max(x[1] for x in spans) - min(x[0] for x in spans) if spans else 0.0


def main(argv: list[str]) -> int:
    """Print the table; 2 with a usage line when no DIR is given."""
    if not argv:
        print("usage: python -m tests.cpureport DIR [N]", file=sys.stderr)
        return 2
    cost = totals(Path(argv[0]))
    top = int(argv[1]) if len(argv) > 1 else 15
    print(f"{sum(c for c, _ in cost.values()):8.1f} s CPU in {len(cost)} files")
    print(f"{'CPU s':>8} {'wall s':>8}  file")
    for name, (cpu, wall) in sorted(cost.items(), key=lambda kv: -kv[1][0])[:top]:
        print(f"{cpu:8.1f} {wall:8.1f}  {name}")
    per_worker = busy(Path(argv[0]))
    span = run_span(Path(argv[0]))
    for w, s in sorted(per_worker.items()):
        idle = f", idle {span - s:5.1f} s of the {span:.1f} s the tests ran" if span else ""
        print(f"{w:>6}: tests {s:6.1f} s{idle}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
