"""An agent whose cgroup v2 root is its own group (a container with a cgroup
namespace: ``/sys/fs/cgroup`` is the container's group, and the agent is in
it) moves itself into a leaf before it enables controllers for its
instances' groups, as the "no internal processes" rule demands. Run on a
real cgroup v2 hierarchy (the host's, or the v2 half of a hybrid host, with
any controller it offers), in a subprocess that plays the agent."""

from __future__ import annotations

import contextlib
import json
import os
import subprocess
import sys
import uuid
from pathlib import Path

import pytest

from controlplane.nodeagent.sandbox.cgroups import ROOT

REPO = Path(__file__).resolve().parents[2]


def _v2() -> tuple[Path, str] | None:
    """A writable v2 hierarchy and a controller it offers."""
    for d in (ROOT, ROOT / "unified"):
        try:
            offered = (d / "cgroup.controllers").read_text().split()
        except OSError:
            continue
        if offered and os.access(d / "cgroup.procs", os.W_OK):
            return d, offered[0]
    return None


_V2 = _v2()
pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(_V2 is None, reason="no writable cgroup v2 hierarchy with a controller"),
]

AGENT = """
import json, os, sys
from pathlib import Path
from controlplane.nodeagent.sandbox import cgroups
top, group, controller = Path(sys.argv[1]), Path(sys.argv[2]), sys.argv[3]
group.mkdir()
(group / "cgroup.procs").write_text(str(os.getpid()))  # the agent in its own root
try:
    cgroups._enable(group, "+" + controller, group)
    out = {"enabled": (group / "cgroup.subtree_control").read_text().split(),
           "mine": (group / "agent" / "cgroup.procs").read_text().split()}
finally:
    (top / "cgroup.procs").write_text(str(os.getpid()))
print(json.dumps(out))
"""


@pytest.fixture
def offered():
    """The hierarchy and a controller its children may use (enabled in its
    subtree_control for the test when it was not; put back after)."""
    assert _V2 is not None
    top, controller = _V2
    control = top / "cgroup.subtree_control"
    had = controller in control.read_text().split()
    if not had:
        control.write_text("+" + controller)
    yield top, controller
    if not had:
        with contextlib.suppress(OSError):  # another group may use it by now
            control.write_text("-" + controller)


def test_the_agent_moves_into_a_leaf_to_enable_controllers(offered):
    top, controller = offered
    group = top / f"galaxy-leaf-{uuid.uuid4().hex[:12]}"
    try:
        r = subprocess.run(
            [sys.executable, "-c", AGENT, str(top), str(group), controller],
            capture_output=True, text=True, cwd=REPO, timeout=60,
        )  # fmt: skip
        assert r.returncode == 0, r.stderr[-2000:]
        doc = json.loads(r.stdout)
        assert controller in doc["enabled"], doc
        assert len(doc["mine"]) == 1, doc  # the agent was there, and only it
    finally:
        for d in (group / "agent", group):
            if d.exists():
                d.rmdir()


def test_without_the_leaf_the_kernel_refuses(offered):
    """The rule itself: a group with a process cannot enable controllers
    for its children (what made the leaf necessary)."""
    top, controller = offered
    group = top / f"galaxy-leaf-{uuid.uuid4().hex[:12]}"
    group.mkdir()
    p = subprocess.Popen(["sleep", "30"])
    try:
        (group / "cgroup.procs").write_text(str(p.pid))
        with pytest.raises(OSError) as e:
            (group / "cgroup.subtree_control").write_text("+" + controller)
        assert e.value.errno == 16  # EBUSY
    finally:
        p.kill()
        p.wait()
        group.rmdir()
