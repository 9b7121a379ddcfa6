"""The suite's cost per test file: ``python -m tests.cpureport DIR [N]`` sums the
files a run wrote with ``GALAXY_CPU_REPORT=DIR python -m pytest`` (one per
worker, tests/conftest.py) and prints the N files (default 15) that used the
most CPU: user+system seconds of the worker and of the processes it started and
reaped (a `galaxy up`, a bench or chaos run), with the wall time beside them.
Then each worker's busy time (the wall seconds of its tests, summed) and how
long before the last worker it ran out of files: the time an uneven split of
the files cost the run."""

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


def ends(folder: Path) -> dict[str, float]:
    """Per worker: the seconds between its last test's end and the last
    test's end on any worker (what an uneven split of the files costs)."""
    last: dict[str, float] = {}
    for f in folder.glob("*.span"):
        span = json.loads(f.read_text())
        if len(span) == 2:
            last[f.stem.rsplit("-", 1)[0]] = span[1]
    end = max(last.values(), default=0.0)
    return {w: end - t for w, t in last.items()}


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
    spans = ends(Path(argv[0]))
    for w, s in sorted(per_worker.items()):
        idle = f", idle at the end {spans[w]:5.1f} s" if w in spans else ""
        print(f"{w:>6}: tests {s:6.1f} s{idle}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
