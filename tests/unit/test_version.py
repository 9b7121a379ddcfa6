"""`galaxy --version` and `galaxy_build_info`: the installed version and the
commit, the same in both; no traceback and exit 0."""

from __future__ import annotations

import subprocess
import sys

import pytest
from prometheus_client import REGISTRY, generate_latest

from controlplane.runtime import metrics  # noqa: F401 (registers the collector)
from controlplane.runtime.version import commit, version
from tests.integration.upctl import REPO


@pytest.mark.slow  # a real `galaxy` subprocess
def test_version_flag_prints_version_and_commit() -> None:
    r = subprocess.run([sys.executable, "-m", "controlplane.tools.cli", "--version"],
                       cwd=REPO, capture_output=True, text=True, timeout=60)  # fmt: skip
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip() == f"galaxy {version()} (commit {commit()})"
    # In a checkout the commit is git's (CI runs in a clone).
    head = subprocess.run(["git", "rev-parse", "--short=12", "HEAD"], cwd=REPO,
                          capture_output=True, text=True, timeout=30)  # fmt: skip
    if head.returncode == 0:
        assert commit() == head.stdout.strip()


def test_build_info_metric() -> None:
    text = generate_latest(REGISTRY).decode()
    line = f'galaxy_build_info{{commit="{commit()}",version="{version()}"}} 1.0'
    assert line in text, [x for x in text.splitlines() if "build_info" in x]


def test_help_says_what_the_tls_default_does() -> None:
    """The top-level help's TLS line matches UpConfig's default (mutual TLS
    on; `--insecure` turns it off), so help and behaviour cannot drift."""
    from controlplane.launch.upconfig import UpConfig
    from controlplane.tools import cli

    assert UpConfig().tls is True
    lines = [line for line in (cli.__doc__ or "").splitlines() if "TLS" in line]
    assert lines and all("not used by default" not in line for line in lines), lines
    assert any("`galaxy up` makes its own" in line for line in lines), lines
    field = UpConfig.model_fields["tls"]
    assert "--insecure" in str(field.json_schema_extra) or "no TLS" in (field.description or "")
