"""A node agent stopped (SIGSTOP) during a burst of cold starts, through a
real `galaxy up` with process sandboxes on two nodes: every start placed on
the stopped node is given up there and placed on the other node within the
requests' deadline, so every invocation succeeds (none DEADLINE_EXCEEDED)."""

from __future__ import annotations

import asyncio
import os
import signal
import urllib.request

import pytest
from prometheus_client.parser import text_string_to_metric_families

from controlplane.runtime import spec as specs
from controlplane.sdk.client import GalaxyClient
from controlplane.tools.chaos_faults import ECHO
from tests.integration.upctl import GalaxyUp

pytestmark = [pytest.mark.integration, pytest.mark.slow]

#: Functions of one instance each (max_scale 1): each request's only start,
#: so a start stuck on the stopped node cannot be covered by another instance.
FUNCTIONS = 8
#: Each invocation's deadline: far below a stuck create's (the function's
#: startup timeout + 5 s), above a process sandbox's cold start on a loaded
#: machine plus the time to give a stopped node up (at most about 5 s: it
#: is declared dead 3 s after its last heartbeat, or a 3 s probe after 2 s).
DEADLINE_S = 25.0
#: Functions started before the fault, spread over both nodes.
WARM = 4
RETRIED = ("galaxy_schedule_starts_retried", "galaxy_dispatch_starts_retried")


@pytest.fixture
def up(tmp_path):
    g = GalaxyUp(tmp_path / "run", "--nodes", "2", "--sandbox", "process")
    g.start()
    g.stopped: list[int] = []  # type: ignore[attr-defined]
    yield g
    for pid in g.stopped:  # type: ignore[attr-defined]
        os.kill(pid, signal.SIGCONT)  # else the supervisor cannot stop it
    pids = g.pids()
    g.stop()
    assert not g.kill_leftovers(pids)


def retried(up: GalaxyUp) -> dict[str, float]:
    """The retry counters of Schedule and Dispatch, by component and reason."""
    out: dict[str, float] = {}
    for name in ("schedule-0", "dispatch-0"):
        url = f"http://{up.component(name)['metrics']}/metrics"
        text = urllib.request.urlopen(url, timeout=5).read().decode()
        for fam in text_string_to_metric_families(text):
            if fam.name in RETRIED:
                for s in fam.samples:
                    if s.name.endswith("_total"):
                        out[f"{name}/{s.labels['reason']}"] = s.value
    return out


def test_starts_on_a_stopped_agent_are_retried_on_another_node(up) -> None:
    names = [f"burst-{i}" for i in range(FUNCTIONS)]

    async def run() -> list[BaseException | object]:
        async with GalaxyClient(
            up.controller, timeout=DEADLINE_S, tls=up.tls(), token=up.token
        ) as c:
            warm = [f"warm-{i}" for i in range(WARM)]
            for n in warm + names:
                spec = specs.load_file(ECHO)  # a real process per instance
                spec.name, spec.concurrency, spec.max_scale = n, 1, 1
                await c.deploy(spec)
            # Starts on both nodes first: Schedule and Dispatch then hold
            # open streams to both agents, and a create sent on an open
            # stream to a stopped agent waits (a new connection to it fails
            # at once, UNAVAILABLE, and is retried so already).
            for r in await asyncio.gather(*(c.invoke(n, b"w") for n in warm)):
                assert r.status == 200
            victim = up.component("agent-0")
            os.kill(int(victim["pid"]), signal.SIGSTOP)
            up.stopped.append(int(victim["pid"]))
            # The burst: one cold start per function, about half of them
            # placed on the stopped node (nothing has told anyone yet).
            return await asyncio.gather(*(c.invoke(n, b"x") for n in names), return_exceptions=True)

    results = asyncio.run(run())
    failed = [(n, r) for n, r in zip(names, results, strict=True) if isinstance(r, BaseException)]
    assert not failed, failed
    assert all(r.status == 200 for r in results), results  # type: ignore[union-attr]
    # Some start was indeed placed on the stopped node and moved.
    counts = retried(up)
    assert sum(counts.values()) >= 1, counts
