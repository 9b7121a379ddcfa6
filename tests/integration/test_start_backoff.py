"""A function whose command exits at once backs off, through a real `galaxy
up` (process sandboxes): after the starts Dispatch's backoff allows, a
request fails at once with FAILED_PRECONDITION naming the function, the last
start error and the next attempt; `galaxy status` shows it; Dispatch logs
one line per backoff step; and once the function is fixed (redeployed) it
serves."""

from __future__ import annotations

import asyncio
import re

import grpc
import pytest

from galaxy.v1 import dispatch_pb2, dispatch_pb2_grpc
from tests.integration.upctl import REPO, GalaxyUp

pytestmark = [pytest.mark.integration, pytest.mark.slow]

#: Requests tried at most before one meets the backoff (each failed start
#: takes a few seconds: Dispatch tries a start in doubt three times).
MAX_REQUESTS = 8


@pytest.fixture
def up(tmp_path):
    g = GalaxyUp(tmp_path / "run", "--nodes", "1", "--node-cpu-millis", "1000")
    g.start()
    yield g
    pids = g.pids()
    g.stop()
    assert not g.kill_leftovers(pids)


#: A runtime (an admin's) whose command exits at once.
CRASH_RUNTIME = """name: exits-at-once
command: [python3, -c, "raise SystemExit(1)"]
artifact: {required: false}
"""


def spec(tmp_path, body: str) -> str:
    path = tmp_path / "crashy.yaml"
    path.write_text(f"name: crashy\nmax_scale: 1\n{body}")
    return str(path)


def test_failing_starts_back_off_and_a_fix_serves(up, tmp_path):
    runtime = tmp_path / "exits.yaml"
    runtime.write_text(CRASH_RUNTIME)
    r = up.cli("runtimes", "apply", "-f", str(runtime))
    assert r.returncode == 0, r.stderr
    r = up.cli("deploy", "-f", spec(tmp_path, "runtime: exits-at-once\n"))
    assert r.returncode == 0, r.stderr

    async def until_backoff() -> list[tuple[grpc.StatusCode, str]]:
        seen = []
        async with up.channel(up.component("dispatch-0")["address"]) as ch:
            stub = dispatch_pb2_grpc.DispatchStub(ch)
            for _ in range(MAX_REQUESTS):
                try:
                    await stub.Dispatch(
                        dispatch_pb2.DispatchRequest(function="crashy"), timeout=60, metadata=up.md
                    )
                except grpc.aio.AioRpcError as e:
                    seen.append((e.code(), e.details() or ""))
                    if "next attempt in" in seen[-1][1]:
                        return seen
        return seen

    seen = asyncio.run(until_backoff())
    code, text = seen[-1]
    assert code == grpc.StatusCode.FAILED_PRECONDITION, seen
    # (Dispatch routes revisions: the function's first is crashy-00001.)
    expected = r"function crashy-00001: its last \d+ starts failed; next attempt in"
    assert re.match(expected, text), text
    assert "process exited with code 1" in text, text
    # The requests before it each waited for a start that failed.
    assert all("next attempt in" not in t for _, t in seen[:-1]), seen

    r = up.cli("status")
    assert r.returncode == 0, r.stderr
    row = re.search(r"^\s+crashy-00001: (backoff [\d.]+s|retrying): (.*)$", r.stdout, re.M)
    assert row is not None, r.stdout
    assert "process exited with code 1" in row.group(2)
    assert re.search(r"\(\d+ failed starts in a row\)", row.group(2)), row.group(2)

    # One log line per backoff step, never one per request.
    log = (up.run_dir / "logs" / "dispatch-0.log").read_text()
    steps = re.findall(r"starts of crashy-00001 failed (\d+) times in a row", log)
    assert steps and len(steps) == len(set(steps)), steps

    fixed = f"runtime: python\nartifact: {REPO / 'examples' / 'echo_server.py'}\n"
    r = up.cli("deploy", "-f", spec(tmp_path, fixed))
    assert r.returncode == 0, r.stderr
    r = up.cli("invoke", "crashy", "--data", "fixed")
    assert r.returncode == 0, r.stderr
    assert "HTTP 200" in r.stdout, r.stdout
