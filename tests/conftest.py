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

Shared real parts
-----------------
- ``etcd_server`` (session) / ``etcd_url`` (function, own key prefix): a real
  etcd from :mod:`tests.etcd_server`, started once per run.
- ``tests.cluster.InProcessCluster``: real components on real sockets in the
  test's event loop; ``small_cluster`` builds the usual one.
- ``tests/integration/upctl.GalaxyUp``: a real ``galaxy up`` subprocess; tests
  that only read or deploy functions under their own names share one per module
  (``up`` fixture in ``tests/integration/test_up.py``); a test that kills or
  reconfigures processes starts its own and is marked ``slow``.
"""

from __future__ import annotations

import os
import subprocess
from collections.abc import Generator
from pathlib import Path

import pytest

from controlplane.runtime.metrics import register_all

pytest_plugins = ["tests.etcd_server"]

# In-process tests host every component in one process: export every
# metric family (a real process registers only its own kind's).
register_all()

REPO = Path(__file__).resolve().parents[1]

#: The call-phase bound, in seconds, of a test not marked ``slow``.
FAST_TEST_BOUND_S = float(os.environ.get("GALAXY_FAST_TEST_S", "2"))


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
    runs checkov only when the manifests it checks moved; the full suite always."""
    checkov = [i for i in items if i.get_closest_marker("checkov") is not None]
    if checkov and not deploy_changed():
        for item in checkov:
            item.add_marker(pytest.mark.slow)


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
