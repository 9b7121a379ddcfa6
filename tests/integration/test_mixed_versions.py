"""Mixed versions during a rolling upgrade: the control functions and node
agent of the previous release (``PREVIOUS``, taken from git history with
``git archive``) run against this release's controller and gateway, and a
function deploys and answers through them. docs/operations.md ("Versions and
upgrades") states what each side does with a peer it does not know."""

from __future__ import annotations

import io
import json
import os
import subprocess
import sys
import tarfile
from pathlib import Path

import pytest

from controlplane.runtime.host import READY_PREFIX
from tests.integration.upctl import REPO, GalaxyUp

pytestmark = [pytest.mark.integration, pytest.mark.slow]

#: The previous release: main before the operations work (2026-11-29).
PREVIOUS = "def424f"


def _previous_tree(dest: Path) -> Path:
    r = subprocess.run(["git", "archive", PREVIOUS], cwd=REPO, capture_output=True, timeout=120)
    if r.returncode != 0:
        why = f"git archive {PREVIOUS} failed: {r.stderr.decode()[-300:]}"
        if os.environ.get("CI"):
            pytest.fail(why + " (CI runs in a full clone)")
        pytest.skip(why)
    # The archive is this repository's own; the "data" filter (which refuses
    # links out of dest and special files) is used where tarfile has it:
    # Python 3.11.4 and later, not Debian 12's 3.11.2.
    safe: dict[str, str] = {"filter": "data"} if hasattr(tarfile, "data_filter") else {}
    with tarfile.open(fileobj=io.BytesIO(r.stdout)) as tar:
        tar.extractall(dest, **safe)  # type: ignore[arg-type]
    return dest


class OldComponent:
    """One `galaxy serve KIND` of the previous release (its own tree as cwd,
    so its modules, not this checkout's, are imported)."""

    def __init__(self, tree: Path, kind: str, *flags: str) -> None:
        self.log = open(tree.parent / f"old-{kind}.log", "wb")
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "controlplane.tools.cli", "serve", kind, "--id", f"{kind}-old",
             "--listen", "127.0.0.1:0", "--metrics-listen", "", "--lifeline", *flags],
            cwd=tree, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=self.log,
            env={**os.environ, "PYTHONPATH": str(tree)},
        )  # fmt: skip
        assert self.proc.stdout is not None
        for line in self.proc.stdout:  # the ready line is the event
            text = line.decode().strip()
            if text.startswith(READY_PREFIX):
                self.ready = json.loads(text[len(READY_PREFIX) :])
                return
        self.stop()
        raise AssertionError(f"old {kind} exited: {(tree.parent / f'old-{kind}.log').read_text()}")

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
        self.proc.wait(timeout=10)
        self.log.close()


def test_previous_release_components_serve_under_this_controller(tmp_path: Path) -> None:
    tree = _previous_tree(tmp_path / "previous")
    # This release: the controller and the gateway only (plaintext, no tokens,
    # so the old processes need no certificates of this run).
    g = GalaxyUp(tmp_path / "run", "--insecure", "--nodes", "0", "--dispatch", "0",
                 "--schedule", "0", "--clustermgr", "0")  # fmt: skip
    g.start()
    olds: list[OldComponent] = []
    try:
        ctl = ["--controller", g.controller, "--insecure"]
        for kind, extra in (
            ("clustermgr", ()),
            ("schedule", ()),
            ("dispatch", ()),
            ("nodeagent", ("--nodes", "1", "--sandbox", "emulated")),
        ):
            olds.append(OldComponent(tree, kind, *ctl, *extra))
        r = g.cli("deploy", "-f", str(REPO / "examples" / "echo.yaml"))
        assert r.returncode == 0, r.stderr
        r = g.cli("invoke", "echo", "--data", "mixed")
        assert r.returncode == 0 and "HTTP 200" in r.stdout, r.stdout + r.stderr
        status = json.loads(g.cli("status", "-o", "json").stdout)
        ids = {i["id"] for i in status["membership"]["instances"]}
        assert {"clustermgr-old", "schedule-old", "dispatch-old"} <= ids
    finally:
        for o in olds:
            o.stop()
        g.stop()
