"""Style gates run as tests so the one test command checks everything:
ruff (lint + format) and mypy on our code (generated code excluded)."""

import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
OURS = ["controlplane", "functions", "statestore", "simulator", "scripts", "tests"]


def run(*cmd: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(cmd, cwd=REPO, capture_output=True, text=True, timeout=300)


def test_ruff_lint_and_format():
    r = run(sys.executable, "-m", "ruff", "check", *OURS)
    assert r.returncode == 0, r.stdout + r.stderr
    r = run(sys.executable, "-m", "ruff", "format", "--check", *OURS)
    assert r.returncode == 0, r.stdout + r.stderr


# A cold run (fresh clone) takes tens of seconds; the cache (.mypy_cache,
# pyproject) makes a re-run quick, but a cold run is what CI pays.
@pytest.mark.slow
def test_mypy():
    r = run(sys.executable, "-m", "mypy")
    assert r.returncode == 0, r.stdout + r.stderr
