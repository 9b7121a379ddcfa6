"""Time `galaxy serve controller --insecure` from spawn to its READY line.

    python scripts/measure_start.py [--tries 5] [TREE ...]

With several source trees (checkouts), they are timed alternately (each
run with PYTHONPATH set to its tree), so that a machine whose speed drifts
affects them alike; prints each tree's median and the times.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

READY = "GALAXY_READY "


def start_once(tree: Path) -> float:
    """Seconds from spawn to READY for one controller started from tree."""
    env = dict(os.environ, PYTHONPATH=str(tree))
    cmd = [
        sys.executable, "-m", "controlplane.tools.cli", "serve", "controller",
        "--listen", "127.0.0.1:0", "--metrics-listen", "", "--lifeline", "--insecure",
    ]  # fmt: skip
    t0 = time.perf_counter()
    p = subprocess.Popen(
        cmd, cwd=tree, env=env, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
        stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    try:
        assert p.stdout is not None
        for line in p.stdout:
            if line.startswith(READY):
                return time.perf_counter() - t0
        err = p.stderr.read() if p.stderr is not None else ""
        raise RuntimeError(f"{tree}: the controller exited: {err[-500:]}")
    finally:
        p.terminate()
        p.wait()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--tries", type=int, default=5)
    ap.add_argument("trees", nargs="*", default=[str(Path(__file__).resolve().parents[1])])
    a = ap.parse_args()
    trees = [Path(t).resolve() for t in a.trees]
    times: dict[Path, list[float]] = {t: [] for t in trees}
    for _ in range(a.tries):
        for t in trees:
            times[t].append(start_once(t))
    for t, ts in times.items():
        print(f"{t}: median {statistics.median(ts):.3f} s ({' '.join(f'{x:.2f}' for x in ts)})")


if __name__ == "__main__":
    main()
