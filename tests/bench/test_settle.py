"""The runner lets a plan's aftermath pass before it measures the echo
again (``profile.settle``): it waits while the processes are busy."""

from __future__ import annotations

import asyncio
import sys

import pytest

from controlplane.bench import profile

_BUSY_THEN_IDLE = (
    "import sys, time\n"
    "while time.process_time() < 0.6: pass\n"
    "print('idle', flush=True)\n"
    "time.sleep(60)\n"
)


@pytest.mark.slow
async def test_settle_waits_until_the_processes_are_idle() -> None:
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-c", _BUSY_THEN_IDLE, stdout=asyncio.subprocess.PIPE
    )
    try:
        waited = await profile.settle({"p": proc.pid}, below_cores=0.05, within_s=30, step_s=0.2)
        assert proc.stdout is not None
        # It returned only once the busy part was over (the line is written).
        line = await asyncio.wait_for(proc.stdout.readline(), 0.1)
        assert line == b"idle\n"
        assert waited < 30
        # An idle process: one step.
        assert await profile.settle({"p": proc.pid}, 0.05, 30, step_s=0.2) < 5.0
    finally:
        proc.kill()
        await proc.wait()


_IDLE_THEN_BUSY = (
    "import sys, time\n"
    "print('ready', flush=True)\n"
    "time.sleep(0.5)\n"
    "t = time.process_time()\n"
    "while time.process_time() - t < 0.6: pass\n"
    "print('idle', flush=True)\n"
    "time.sleep(60)\n"
)


@pytest.mark.slow
async def test_a_quiet_spell_before_the_wave_is_not_settled() -> None:
    # The aftermath of a plan can start after a quiet moment (the next
    # autoscaler round): with quiet_s, a quiet step before it does not
    # count as settled (with one step it would: 0.2 s of sleep).
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-c", _IDLE_THEN_BUSY, stdout=asyncio.subprocess.PIPE
    )
    try:
        assert proc.stdout is not None
        assert await asyncio.wait_for(proc.stdout.readline(), 30) == b"ready\n"
        await profile.settle({"p": proc.pid}, 0.05, 30, step_s=0.2, quiet_s=1.0)
        line = await asyncio.wait_for(proc.stdout.readline(), 0.1)
        assert line == b"idle\n"  # it returned only after the busy wave
    finally:
        proc.kill()
        await proc.wait()
