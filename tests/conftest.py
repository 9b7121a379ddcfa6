"""Root test configuration: the real etcd server, the ``slow`` tier and its guard.

Tiers
-----
``python -m pytest`` is the full suite (what ``.ci/run`` runs).
``python -m pytest -m "not slow"`` is the fast tier, the inner loop: it must stay
under 3 minutes on a 2-core machine.

When to mark a test ``slow``
----------------------------
Mark a test ``@pytest.mark.slow`` (or a whole module with
``pytestmark = pytest.mark.slow``) when its call phase can take more than about
one second on a loaded machine: it starts Galaxy processes (``galaxy up``,
``galaxy chaos``), runs an external tool over the tree (mypy, checkov), or waits
out real timeouts. The guard below fails any *unmarked* test whose call phase
takes longer than ``GALAXY_FAST_TEST_S`` seconds (default 2; CI uses the
default), naming the test, so the fast tier cannot grow slow unnoticed. Mark
anything near the bound ``slow`` rather than raising the bound: CI machines are
loaded and a test at 1.8 s here is a flaky failure there. A busy developer
machine may export ``GALAXY_FAST_TEST_S=5`` for a local run.

Parallel by default
-------------------
With pytest-xdist installed (the dev extra), a run without ``-n`` uses
``DEFAULT_WORKERS`` worker processes and ``--dist loadfile`` (set in
``pytest_cmdline_main`` below rather than in pyproject's ``addopts``, so that
``-p no:xdist`` still parses). ``-n 0`` or ``-p no:xdist`` runs in this process
(one test, a debugger). ``loadfile`` keeps a module on one worker, so a
module- or session-scoped fixture (a shared ``galaxy up``, an etcd) is started
once per worker that needs it, never shared across processes. The suite mostly
waits on process starts, not CPU, which is why more workers than cores pay.
Files go out longest first (``tests/durations.json``, refreshed with
``python -m tests.durations RUN.xml``) and a worker gets its next file only
when it has nothing else to run (``pytest_xdist_make_scheduler``), so the
workers end together.

Every test must be safe next to other test processes: ports are bound to 0,
names of network namespaces, cgroups and run dirs carry a random tag or the
pid, files live under ``tmp_path``.

The fast-test bound under parallel load
---------------------------------------
Workers compete for the cores, so a test's wall time stretches with the ratio
of workers to CPUs. The bound is ``GALAXY_FAST_TEST_S`` times
``max(1, workers / CPUs)`` (4 s for 4 workers on 2 cores): the same work per
core, not a looser bound. A serial run (``-n 0``) keeps the plain bound.

Where the CPU goes
------------------
The suite keeps 2 cores ~160-175% busy: it waits on process starts and real
timers as much as on the CPU, so less CPU and more overlap both shorten it.
``GALAXY_CPU_REPORT=DIR python -m pytest`` writes each test file's CPU seconds
(the worker's and those of the processes it started and reaped) and wall
seconds under DIR; ``python -m tests.cpureport DIR`` lists the costliest files.

Shared real parts
-----------------
- ``etcd_server`` (session) / ``etcd_url`` (function, own key prefix): a real
  etcd from :mod:`tests.etcd_server`, started once per run.
- ``tests.cluster.InProcessCluster``: real components on real sockets in the
  test's event loop; ``small_cluster`` builds the usual one.
- ``tests/integration/upctl.GalaxyUp``: a real ``galaxy up`` subprocess (its
  ``cli`` runs `galaxy` commands in this process, tests/clirun.py; ``cli_process``
  in a real one, for a test whose point is the process); tests
  that only read or deploy functions under their own names share one per module
  (``up`` fixture in ``tests/integration/test_up.py``); a test that kills or
  reconfigures processes starts its own and is marked ``slow``.
"""

from __future__ import annotations

import json
import os
import resource
import subprocess
import time
from collections.abc import Generator
from pathlib import Path
from typing import Any

import pytest

from controlplane.runtime.metrics import register_all
from tests import durations

pytest_plugins = ["tests.etcd_server"]

# In-process tests host every component in one process: export every
# metric family (a real process registers only its own kind's).
register_all()

REPO = Path(__file__).resolve().parents[1]

#: Worker processes for a run that does not say ``-n`` (measured: README, Tests).
DEFAULT_WORKERS = 4


def _load_factor() -> float:
    """Workers per CPU in this run (1 when serial or fewer workers than CPUs)."""
    workers = int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1"))
    return max(1.0, workers / (os.cpu_count() or 1))


#: The call-phase bound, in seconds, of a test not marked ``slow``.
FAST_TEST_BOUND_S = float(os.environ.get("GALAXY_FAST_TEST_S", "2")) * _load_factor()


@pytest.hookimpl(tryfirst=True)
def pytest_cmdline_main(config: pytest.Config) -> None:
    """Default to ``-n DEFAULT_WORKERS --dist loadfile`` when xdist is loaded and
    the command line names no ``-n``. Runs before xdist's own hook (both are
    ``tryfirst``; a conftest registers later, so it is called first), which
    turns the count into worker processes. A worker never spawns workers."""
    if not config.pluginmanager.hasplugin("xdist") or hasattr(config, "workerinput"):
        return
    if config.option.numprocesses is None and not config.option.collectonly:
        config.option.numprocesses = DEFAULT_WORKERS
        if config.option.dist == "no":
            config.option.dist = "loadfile"
            # Hand files out in collection order (longest first, below),
            # not xdist's default of most tests first, which left the long
            # files of one or two tests (a bench plan run, mypy) for the end.
            config.option.loadscopereorder = False


def pytest_xdist_make_scheduler(config: pytest.Config, log: Any) -> Any:
    """``--dist loadfile`` that hands a worker its next file only once it has
    nothing left but the test it holds back (xdist runs a test when it knows
    the next one), instead of while it still runs one (xdist's own rule:
    two tests or fewer left). A worker running a long file of one or two
    tests took the next file too, and the files it hoarded waited behind it
    while other workers ran out of work: in a full run (2026-11-29, 482b7e1
    at load 7-31) three workers ended 57 s before the fourth."""
    if config.getvalue("dist") != "loadfile":
        return None
    from xdist.scheduler import LoadFileScheduling

    class OneFileAhead(LoadFileScheduling):
        def _reschedule(self, node: Any) -> None:
            if node.shutting_down:
                return
            if not self.workqueue:
                node.shutdown()
                return
            if self._pending_of(self.assigned_work[node]) <= 1:
                self._assign_work_unit(node)

    return OneFileAhead(config, log)


def deploy_changed() -> bool:
    """Whether ``deploy/`` differs from the last commit's parent (or the work tree
    from the last commit). Unknown (no git, a one-commit shallow clone) counts as
    changed, so the checks run rather than silently not."""

    def git(*args: str) -> int:
        try:
            return subprocess.run(
                ["git", *args], cwd=REPO, capture_output=True, timeout=30
            ).returncode
        except (OSError, subprocess.TimeoutExpired):
            return 2

    # rc 0: no difference, 1: difference, anything else: git could not tell.
    dirty = git("diff", "--quiet", "HEAD", "--", "deploy")
    last = git("diff", "--quiet", "HEAD~1", "HEAD", "--", "deploy")
    return not (dirty == 0 and last == 0)


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """A ``checkov`` test is ``slow`` unless ``deploy/`` changed: the fast tier
    runs checkov only when the manifests it checks moved; the full suite always.
    Then the longest files run first (see ``_longest_files_first``)."""
    checkov = [i for i in items if i.get_closest_marker("checkov") is not None]
    if checkov and not deploy_changed():
        for item in checkov:
            item.add_marker(pytest.mark.slow)
    # The vllm tier costs minutes (a model conversion, vLLM's engine start)
    # and needs a virtualenv of its own: run only when asked for (-m vllm),
    # so the default suite is the same whatever is installed on the machine.
    if "vllm" not in (config.option.markexpr or ""):
        asked = pytest.mark.skip(reason="the vllm tier runs with -m vllm")
        for item in items:
            if item.get_closest_marker("vllm") is not None:
                item.add_marker(asked)
    _longest_files_first(items)


def _longest_files_first(items: list[pytest.Item]) -> None:
    """Order the files longest first: those of the committed duration table
    (tests/durations.json, :mod:`tests.durations`) by their seconds, then
    the files it does not list, those with a ``slow`` test first; the order
    of tests within a file is kept.

    ``--dist loadfile`` hands files to workers in this order, the next file
    to the first worker with (almost) nothing left (with xdist's reordering
    by test count turned off, ``pytest_cmdline_main``): longest first is the
    greedy schedule that ends the workers closest together. In collection
    order the long files came in clumps (the LLM and chaos directories) and
    the last one to start kept one worker busy while the others idled: ~30 s
    of the run (2026-11-29, main 5891d0a, the per-worker busy time that
    ``python -m tests.cpureport`` prints). A file new since the table was
    made goes after the listed ones, so a file that is missing does no
    worse than collection order."""
    table = durations.load()
    slow = {item.path for item in items if item.get_closest_marker("slow") is not None}

    def key(item: pytest.Item) -> tuple[float, bool]:
        return (-table.get(item.location[0], 0.0), item.path not in slow)

    items.sort(key=key)  # stable: the order within a file is kept


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(
    item: pytest.Item, call: pytest.CallInfo[None]
) -> Generator[None, pytest.TestReport, None]:
    """Fail an unmarked test whose call phase took longer than the bound.

    Only the call phase counts: fixture setup (a shared etcd or cluster) is paid
    once and attributed to whichever test happens to run first.
    """
    outcome = yield
    report: pytest.TestReport = outcome.get_result()
    if (
        report.when != "call"
        or not report.passed
        or item.get_closest_marker("slow") is not None
        or item.get_closest_marker("checkov") is not None
        or report.duration <= FAST_TEST_BOUND_S
    ):
        return
    report.outcome = "failed"
    report.longrepr = (
        f"{item.nodeid} took {report.duration:.2f} s in its call phase, over the fast "
        f"tier's {FAST_TEST_BOUND_S:g} s bound (GALAXY_FAST_TEST_S): mark it "
        "@pytest.mark.slow, or make it faster"
    )


def _cpu_s() -> float:
    """User+system CPU seconds of this process and its reaped children."""
    own = resource.getrusage(resource.RUSAGE_SELF)
    kids = resource.getrusage(resource.RUSAGE_CHILDREN)
    return own.ru_utime + own.ru_stime + kids.ru_utime + kids.ru_stime


#: Per test file: [CPU seconds, wall seconds], when ``GALAXY_CPU_REPORT`` names
#: a directory to write them to (one JSON file per worker process).
_FILE_COST: dict[str, list[float]] = {}
#: When this process's first test started and its last one ended (epoch
#: seconds): with the busy time, a worker's idle time (``GALAXY_CPU_REPORT``).
_SPAN: list[float] = []


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_protocol(item: pytest.Item, nextitem: pytest.Item | None) -> Generator[None]:
    """Charge a test's setup, call and teardown CPU (its subprocesses included,
    once reaped) and wall time to its file, for ``GALAXY_CPU_REPORT``."""
    if not os.environ.get("GALAXY_CPU_REPORT"):
        yield
        return
    cpu, wall = _cpu_s(), time.monotonic()
    _SPAN[:] = [_SPAN[0] if _SPAN else time.time(), 0.0]
    yield
    cost = _FILE_COST.setdefault(item.location[0], [0.0, 0.0])
    cost[0] += _cpu_s() - cpu
    cost[1] += time.monotonic() - wall
    _SPAN[1] = time.time()


def pytest_sessionfinish(session: pytest.Session) -> None:
    """Write this process's per-file costs under ``GALAXY_CPU_REPORT``."""
    out = os.environ.get("GALAXY_CPU_REPORT")
    if out and _FILE_COST:
        name = os.environ.get("PYTEST_XDIST_WORKER", "main")
        Path(out, f"{name}-{os.getpid()}.json").write_text(json.dumps(_FILE_COST))
        Path(out, f"{name}-{os.getpid()}.span").write_text(json.dumps(_SPAN))
