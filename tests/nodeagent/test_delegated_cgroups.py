"""The Kubernetes-shaped agent: not root, with only a delegated cgroup
subtree writable (made here for real, handed to an unprivileged user with
chown, as an init container or systemd's Delegate= would). Its instances'
memory and pids limits hold there, inside bubblewrap sandboxes."""

from __future__ import annotations

import json
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from .delegation import (
    SYSTEM_PYTHON,
    Delegated,
    agent_env,
    as_nobody,
    delegated_subtree,
    skip_reason,
    unprivileged,
)

HERE = Path(__file__).resolve().parent
MAX_PIDS = 16

_SKIP = skip_reason()
pytestmark = [pytest.mark.slow, pytest.mark.skipif(_SKIP is not None, reason=_SKIP or "")]


@pytest.fixture
def delegated() -> Iterator[Delegated]:
    user = unprivileged()
    assert user is not None
    with delegated_subtree(user) as d:
        yield d


def test_limits_hold_in_a_delegated_subtree_for_an_agent_that_is_not_root(delegated):
    root, work, groups = delegated.root, delegated.work, delegated.groups
    user = unprivileged()
    assert user is not None
    r = subprocess.run(
        [
            *as_nobody(user),
            SYSTEM_PYTHON,
            str(HERE / "delegated_agent.py"),
            str(root),
            str(work),
            str(MAX_PIDS),
        ],
        capture_output=True,
        text=True,
        env=agent_env(work),
        cwd=work,
        timeout=120,
    )
    assert r.returncode == 0, r.stderr[-3000:]
    doc = json.loads(r.stdout.splitlines()[-1])
    assert doc["euid"] == user.pw_uid != 0
    # The instance's groups were made inside the delegated subtree.
    assert doc["hog_groups"] and all(
        any(Path(d).resolve().is_relative_to(g) or d.startswith(str(root)) for g in groups)
        for d in doc["hog_groups"]
    ), doc
    assert "out of memory" in doc["hog_exit"] and "64 MiB" in doc["hog_exit"], doc
    forked, error = doc["fork"].split()
    assert int(forked) < MAX_PIDS and error == "BlockingIOError", doc
