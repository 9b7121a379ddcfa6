"""CPU of each `galaxy up` process at idle, heartbeat batches on and off
alternating (docs/results/benchmarks-2026-11.md, 2026-11-26, "batched heartbeats").

    python scripts/measure_idle_heartbeats.py [--nodes 210] [--pairs 2] [--window-s 30]

Each phase starts `galaxy up --nodes N --sandbox emulated --insecure` (with
``--no-heartbeat-batches`` for "off") in a run directory of its own under
/tmp, waits for its endpoints file and ``--settle-s`` more, then reads
every child process's CPU time from /proc over ``--window-s`` and prints
one JSON line: cores per process, by kind. At idle the node machinery
(heartbeats, ClusterMgr, Schedule's refreshes) is all that runs.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HZ = os.sysconf("SC_CLK_TCK")
KINDS = ("nodeagent", "clustermgr", "schedule", "dispatch", "controller")


def children(pid: int) -> list[int]:
    """Direct children of pid."""
    out = []
    for d in os.listdir("/proc"):
        if not d.isdigit():
            continue
        try:
            with open(f"/proc/{d}/stat") as f:
                stat = f.read()
        except OSError:
            continue
        if int(stat.rsplit(")", 1)[1].split()[1]) == pid:
            out.append(int(d))
    return out


def cpu_s(pid: int) -> float:
    """User + system CPU seconds of pid."""
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / HZ


def kind(pid: int) -> str:
    with open(f"/proc/{pid}/cmdline") as f:
        cmd = f.read().split("\0")
    return next((k for k in KINDS if k in cmd), "other")


def phase(batches: bool, nodes: int, settle_s: float, window_s: float, run: Path) -> dict:
    env = dict(os.environ, GALAXY_RUN_DIR=str(run))
    cmd = [
        sys.executable, "-m", "controlplane.tools.cli", "up", "--nodes", str(nodes),
        "--sandbox", "emulated", "--insecure", "--gateway-port", "-1", "--runtimes", "",
    ] + ([] if batches else ["--no-heartbeat-batches"])  # fmt: skip
    p = subprocess.Popen(cmd, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + 120
        while not (run / "endpoints.json").exists():
            if time.monotonic() > deadline or p.poll() is not None:
                raise RuntimeError(f"galaxy up did not come up; see {run}/logs")
            time.sleep(0.5)
        time.sleep(settle_s)  # registrations done, heartbeats in their rhythm
        kids = children(p.pid)
        before = {k: cpu_s(k) for k in kids}
        t0 = time.monotonic()
        time.sleep(window_s)
        dt = time.monotonic() - t0
        cores: dict[str, list[float]] = {}
        for k in kids:
            cores.setdefault(kind(k), []).append(round((cpu_s(k) - before[k]) / dt, 3))
        load1 = round(os.getloadavg()[0], 1)
        return {"batches": batches, "load1": load1, **dict(sorted(cores.items()))}
    finally:
        p.send_signal(signal.SIGINT)
        try:
            p.wait(60)
        except subprocess.TimeoutExpired:
            p.kill()
            p.wait()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--nodes", type=int, default=210)
    ap.add_argument("--pairs", type=int, default=2)
    ap.add_argument("--settle-s", type=float, default=10.0)
    ap.add_argument("--window-s", type=float, default=30.0)
    args = ap.parse_args()
    with tempfile.TemporaryDirectory(prefix="idle-heartbeats-") as tmp:
        for i in range(2 * args.pairs):
            run = Path(tmp) / str(i)
            run.mkdir()
            row = phase(i % 2 == 0, args.nodes, args.settle_s, args.window_s, run)
            print(json.dumps(row), flush=True)


if __name__ == "__main__":
    main()
