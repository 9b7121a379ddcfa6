"""procs.spawn: children started by CPython's Popen with the asyncio
Process interface the launchers use, and no launcher starting children
through the event loop's subprocess support."""

from __future__ import annotations

import asyncio
import os
import re
import signal
import subprocess
import sys
from pathlib import Path

import grpc

from controlplane.runtime import procs

REPO = Path(__file__).resolve().parents[2]


async def test_a_piped_child_is_read_line_by_line_and_its_exit_is_seen() -> None:
    p = await procs.spawn(
        sys.executable, "-c", "import sys; print('ready'); sys.stdin.read(); sys.exit(3)",
        stdin=subprocess.PIPE, stdout=subprocess.PIPE,
    )  # fmt: skip
    assert p.stdout is not None and p.stdin is not None
    assert await asyncio.wait_for(p.stdout.readline(), 30) == b"ready\n"
    assert p.returncode is None
    p.stdin.close()  # the lifeline: the child reads EOF and exits
    assert await asyncio.wait_for(p.wait(), 30) == 3
    assert p.returncode == 3
    assert await p.stdout.readline() == b""


async def test_terminate_escalates_to_kill_and_signals_after_exit_are_ignored() -> None:
    # The child ignores SIGTERM, so only the SIGKILL after the grace ends it.
    p = await procs.spawn(
        sys.executable, "-c",
        "import signal, sys, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); "
        "print('up', flush=True); time.sleep(60)",
        stdout=subprocess.PIPE,
    )  # fmt: skip
    assert p.stdout is not None
    assert await asyncio.wait_for(p.stdout.readline(), 30) == b"up\n"
    await procs.terminate(p, grace_s=0.3)
    assert p.returncode == -signal.SIGKILL
    p.kill()  # already gone: no ProcessLookupError, no signal to a reused pid


def _running(pid: int) -> bool:
    """Alive and not a zombie (an orphan's zombie is its new parent's to reap)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().split(") ", 1)[1][0] != "Z"
    except OSError:
        return False


async def test_a_killed_child_leaves_none_of_its_own_children() -> None:
    # A node agent past its grace is killed; its instances would outlive it
    # for a moment (their parent-death signal) or, without one, for good.
    # This child ignores SIGTERM and has a grandchild that has no such signal.
    p = await procs.spawn(
        sys.executable, "-c",
        "import signal, subprocess, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); "
        "g = subprocess.Popen(['sleep', '60']); print(g.pid, flush=True); time.sleep(60)",
        stdout=subprocess.PIPE,
    )  # fmt: skip
    assert p.stdout is not None
    grandchild = int(await asyncio.wait_for(p.stdout.readline(), 30))
    try:
        assert grandchild in procs.descendants(p.pid)
        await procs.terminate(p, grace_s=0.3, tree_grace_s=0.3)
        assert p.returncode == -signal.SIGKILL
        assert not _running(grandchild)
    finally:
        if _running(grandchild):
            os.kill(grandchild, signal.SIGKILL)


async def test_children_start_beside_live_grpc_threads() -> None:
    # A gRPC channel with its threads and a pending call in this process:
    # the case in which forking through the event loop aborted children.
    async with grpc.aio.insecure_channel("127.0.0.1:9") as ch:
        call = ch.unary_unary("/x.Y/Z")(b"", timeout=30)
        codes = await asyncio.gather(
            *[(await procs.spawn("true", stdout=subprocess.DEVNULL)).wait() for _ in range(20)]
        )
        call.cancel()
    assert codes == [0] * 20


def test_no_launcher_starts_children_through_the_event_loop() -> None:
    # Every process that starts children runs gRPC threads (servers, clients,
    # the chaos tool's load, a bench runner's deploys), so the loop's
    # subprocess support is banned there. The benches too: `galaxy bench`
    # and the suite's short runs start control planes, load generators and
    # servers from a process with gRPC channels open, under uvloop (the CLI
    # installs it; in a test worker, any in-process CLI call before did).
    offenders = []
    for root in ("controlplane", "functions", "simulator"):
        for path in (REPO / root).rglob("*.py"):
            if re.search(r"create_subprocess_(exec|shell)\(", path.read_text()):
                offenders.append(str(path.relative_to(REPO)))
    assert offenders == []
