"""Sampling profiles of the bench's processes with py-spy, during the
measured phase only, and where their time goes.

``py-spy record --format raw`` writes collapsed stacks ("frame;frame;leaf
COUNT"); ``top_functions`` turns them into the share of samples in which a
function is running (self) or on the stack (total), which is what the
report prints and what a fix is aimed at.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import re
import shutil
import signal
import subprocess
import time
from collections import Counter
from pathlib import Path
from typing import Any

from controlplane.runtime import procs

# "name (path/file.py:LINE)" -> "name (path/file.py)": lines split one function.
_LINE = re.compile(r":\d+\)$")
# Frames whose file is in these trees are the interpreter's and libraries'.
_SHORTEN = ("site-packages/", "lib/python3")


_TICKS = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100


def cpu_seconds(pid: int) -> float | None:
    """User + system CPU seconds a process has used so far (Linux /proc)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
    except OSError:
        return None
    # fields[11], fields[12]: utime and stime (fields 14 and 15 of stat(5)).
    return (int(fields[11]) + int(fields[12])) / _TICKS


def machine_cpu() -> dict[str, float]:
    """Machine-wide CPU seconds so far, summed over CPUs (Linux /proc/stat):
    ``busy`` (user, nice, system, irq, softirq), ``steal`` (time the
    hypervisor gave our vCPUs to someone else) and ``at`` (monotonic time of
    the reading). Empty where /proc/stat is missing."""
    try:
        with open("/proc/stat") as f:
            head = f.readline().split()
    except OSError:
        return {}
    # cpu user nice system idle iowait irq softirq steal guest guest_nice
    v = [int(x) for x in head[1:9]] + [0] * max(0, 9 - len(head))
    busy = v[0] + v[1] + v[2] + v[5] + v[6]
    return {"busy": busy / _TICKS, "steal": v[7] / _TICKS, "at": time.monotonic()}


def schedstat(pid: int) -> tuple[float, float] | None:
    """(seconds on a CPU, seconds runnable but waiting in a run queue) of a
    process's main thread so far (/proc/PID/schedstat), or None if it is
    gone. The main thread runs the event loop: its wait is time a request
    that had work to do waited for a CPU."""
    try:
        with open(f"/proc/{pid}/schedstat") as f:
            run_ns, wait_ns = f.read().split()[:2]
    except (OSError, ValueError):
        return None
    return int(run_ns) / 1e9, int(wait_ns) / 1e9


def cpu_snapshot(pids: dict[str, int]) -> dict[str, float]:
    """cpu_seconds of every named pid that is still there."""
    out = {}
    for name, pid in pids.items():
        v = cpu_seconds(pid)
        if v is not None:
            out[name] = v
    return out


async def settle(
    pids: dict[str, int],
    below_cores: float,
    within_s: float,
    step_s: float = 0.5,
    quiet_s: float = 0.0,
) -> float:
    """Wait until the processes together use less than below_cores over
    every step_s of quiet_s in a row (one step when quiet_s <= step_s), at
    most within_s; returns the seconds waited. After a plan the control
    plane may still be busy with its aftermath (thousands of idle
    instances deleted): the echo measured after it would count that. The
    aftermath comes in waves (the autoscaler decides every 2 s), so one
    quiet step can fall before the first wave."""
    loop = asyncio.get_running_loop()
    start = loop.time()
    before = sum(cpu_snapshot(pids).values())
    quiet = 0.0
    while loop.time() - start < within_s:
        await asyncio.sleep(step_s)
        now = sum(cpu_snapshot(pids).values())
        quiet = quiet + step_s if (now - before) / step_s < below_cores else 0.0
        if quiet >= max(quiet_s, step_s):
            break
        before = now
    return loop.time() - start


def available() -> bool:
    """Is py-spy installed?"""
    return shutil.which("py-spy") is not None


def _frame(f: str) -> str:
    f = _LINE.sub(")", f.strip())
    for marker in _SHORTEN:
        i = f.find(marker)
        if i >= 0:
            head = f[: f.index("(") + 1] if "(" in f else ""
            f = head + f[i + len(marker) :]
    return f


def top_functions(collapsed: str, n: int = 12) -> dict[str, Any]:
    """Samples, and the top n functions by self and by total share (0..1)."""
    selfc: Counter[str] = Counter()
    total: Counter[str] = Counter()
    samples = 0
    for line in collapsed.splitlines():
        stack, _, count = line.rpartition(" ")
        if not stack or not count.isdigit():
            continue
        c = int(count)
        frames = [_frame(f) for f in stack.split(";") if f]
        # py-spy puts "process NNN" / thread names first; skip non-code frames.
        frames = [f for f in frames if "(" in f]
        if not frames:
            continue
        samples += c
        selfc[frames[-1]] += c
        for f in set(frames):
            total[f] += c
    if samples == 0:
        return {"samples": 0, "self": [], "total": []}
    # Frames on (nearly) every stack -- the entry point, the event loop --
    # say nothing about where the time goes.
    inner = [(f, c) for f, c in total.most_common() if c < 0.9 * samples]
    return {
        "samples": samples,
        "self": [[f, c / samples] for f, c in selfc.most_common(n)],
        "total": [[f, c / samples] for f, c in inner[:n]],
    }


class Profilers:
    """py-spy recorders attached to running processes until ``stop``."""

    def __init__(self, out_dir: Path, rate_hz: int = 200) -> None:
        self.out_dir = out_dir
        self.rate_hz = rate_hz
        self.procs: dict[str, tuple[procs.Spawned, Path]] = {}

    async def start(self, targets: dict[str, int]) -> None:
        """Attach to each pid (name -> pid)."""
        self.out_dir.mkdir(parents=True, exist_ok=True)
        for name, pid in targets.items():
            path = self.out_dir / f"{name}.txt"
            # --nonblocking: sample without pausing the target, so the
            # profiler does not itself slow the process it measures.
            # --gil: only samples holding the GIL, i.e. Python running, not
            # the event loop waiting in epoll (which would swamp the shares).
            p = await procs.spawn(
                "py-spy",
                "record",
                "--pid",
                str(pid),
                "--rate",
                str(self.rate_hz),
                "--format",
                "raw",
                "--nonblocking",
                "--gil",
                "--output",
                str(path),
                stdout=subprocess.DEVNULL,
                stderr=subprocess.DEVNULL,
            )
            self.procs[name] = (p, path)

    async def stop(self) -> dict[str, Any]:
        """Stop recording (SIGINT makes py-spy write its file); returns the
        top functions per process."""
        out: dict[str, Any] = {}
        for name, (p, path) in self.procs.items():
            if p.returncode is None:
                with contextlib.suppress(ProcessLookupError):
                    p.send_signal(signal.SIGINT)
            try:
                await asyncio.wait_for(p.wait(), 20)
            except TimeoutError:
                with contextlib.suppress(ProcessLookupError):
                    p.kill()
                await p.wait()
            try:
                text = path.read_text()
            except OSError:
                continue  # the target exited before py-spy attached
            out[name] = {"file": str(path), **top_functions(text)}
        self.procs.clear()
        return out
