"""CLI habits against a real `galaxy up`: `-o table|json|yaml` on every read
command carries the same data, a closed pipe ends quietly, and shell
completion answers."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from tests.integration.upctl import REPO, GalaxyUp

pytestmark = [pytest.mark.integration, pytest.mark.slow]

READS = [
    ("status",),
    ("functions",),
    ("revisions", "echo"),
    ("runtimes", "list"),
    ("tokens", "list"),
]


@pytest.fixture(scope="module")
def up(tmp_path_factory):
    g = GalaxyUp(tmp_path_factory.mktemp("run"), "--nodes", "1")
    g.start()
    try:
        assert g.cli("deploy", "-f", str(REPO / "examples" / "echo.yaml")).returncode == 0
        yield g
    finally:
        g.stop()


@pytest.mark.parametrize("cmd", READS, ids=lambda c: " ".join(c))
def test_json_and_yaml_carry_the_same_data(up, cmd) -> None:
    j = up.cli(*cmd, "-o", "json")
    y = up.cli(*cmd, "-o", "yaml")
    t = up.cli(*cmd)
    for r in (j, y, t):
        assert r.returncode == 0, r.stderr
    as_json, as_yaml = json.loads(j.stdout), yaml.safe_load(y.stdout)
    if cmd == ("status",):  # live figures (last_seen_ms) move between two calls
        assert as_json.keys() == as_yaml.keys() and as_json["functions"] == as_yaml["functions"]
    else:
        assert as_json == as_yaml
    assert as_json and t.stdout.strip() and not t.stdout.lstrip().startswith(("{", "["))


def test_the_data_is_what_was_deployed(up) -> None:
    (fn,) = json.loads(up.cli("functions", "-o", "json").stdout)
    assert fn["name"] == "echo" and fn["runtime"] == "python"
    names = [r["name"] for r in json.loads(up.cli("runtimes", "list", "-o", "json").stdout)]
    assert "python" in names
    tokens = json.loads(up.cli("tokens", "list", "-o", "json").stdout)
    assert any(t["role"] == "admin" for t in tokens) and all("sha256" not in t for t in tokens)
    assert "membership" in json.loads(up.cli("status", "--json").stdout)  # the old spelling


def test_a_closed_pipe_ends_quietly(up) -> None:
    p = subprocess.Popen(
        [sys.executable, "-m", "controlplane.tools.cli", "--run-dir", str(up.run_dir),
         "status", "--max-nodes", "1"],
        cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
    )  # fmt: skip
    assert p.stdout is not None and p.stderr is not None
    p.stdout.readline()
    p.stdout.close()  # `| head -1`: the reader is gone before the rest is written
    err = p.stderr.read().decode()
    code = p.wait(timeout=60)
    assert "Traceback" not in err and "BrokenPipe" not in err, err
    assert code in (0, 141)


def test_a_closed_pipe_after_much_output(tmp_path: Path) -> None:
    logs = tmp_path / "logs"
    logs.mkdir()
    (logs / "big.log").write_text("x" * 100 + "\n" * 1 + ("line\n" * 200_000))
    p = subprocess.Popen(
        [sys.executable, "-m", "controlplane.tools.cli", "--run-dir", str(tmp_path),
         "logs", "big", "--raw"],
        cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
    )  # fmt: skip
    assert p.stdout is not None and p.stderr is not None
    p.stdout.readline()
    p.stdout.close()
    err = p.stderr.read().decode()
    assert p.wait(timeout=60) == 141
    assert "Traceback" not in err, err


def test_completion(tmp_path: Path) -> None:
    out = tmp_path / "completions"
    env = {**os.environ, "_ARGCOMPLETE": "1", "COMP_LINE": "galaxy logs --si",
           "COMP_POINT": "16", "_ARGCOMPLETE_STDOUT_FILENAME": str(out)}  # fmt: skip
    r = subprocess.run([sys.executable, "-m", "controlplane.tools.cli"], cwd=REPO, env=env,
                       capture_output=True, timeout=60)  # fmt: skip
    assert r.returncode == 0
    assert out.read_text().split() == ["--since"]
    for shell in ("bash", "zsh"):
        r = subprocess.run([sys.executable, "-m", "controlplane.tools.cli", "completion", shell],
                           cwd=REPO, capture_output=True, text=True, timeout=60)  # fmt: skip
        assert r.returncode == 0 and "galaxy" in r.stdout and "_ARGCOMPLETE" in r.stdout
