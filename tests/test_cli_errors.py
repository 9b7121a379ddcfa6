"""Every `galaxy` command, driven into an expected failure, ends with a clear
message naming the problem and a non-zero status, never a traceback.

In-process (``cli.main``): the subprocess is not the point here, and an
exception escaping ``main`` is exactly the traceback a user would see, so it
fails the test. (Real-subprocess checks of the same kind, e.g. the CLI with no
control plane running, are in tests/integration/test_up.py.)
"""

from __future__ import annotations

import socket
from pathlib import Path

import pytest

from controlplane.tools import cli


def _closed_port() -> int:
    """A loopback port nothing listens on (bound, then released)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _run(argv: list[str], capsys: pytest.CaptureFixture[str]) -> tuple[int, str]:
    try:
        rc = cli.main(argv)
    except SystemExit as e:  # argparse and the subcommands exit with a status
        rc = e.code if isinstance(e.code, int) else 1
    return rc, capsys.readouterr().err


@pytest.fixture
def bad_spec(tmp_path: Path) -> Path:
    p = tmp_path / "bad.yaml"
    p.write_text("name: x\nconcurrency: -3\n")
    return p


CASES = {
    "deploy-missing-file": (["deploy", "-f", "{missing}"], "cannot read spec file"),
    "deploy-bad-spec": (["deploy", "-f", "{bad}"], "runtime: required"),
    "invoke-unreachable": (["invoke", "echo", "--data", "x", "--timeout", "5"], "UNAVAILABLE"),
    "delete-unreachable": (["delete", "echo"], "UNAVAILABLE"),
    "simulate-unknown-workload": (
        ["simulate", "--workload", "{missing}", "--out", "{out}"],
        "unknown workload",
    ),
    "simulate-bad-option": (
        ["simulate", "--workload", "azure2019:minutes=bogus", "--out", "{out}"],
        "minutes: must be a number",
    ),
    "simulate-bad-nodes": (
        ["simulate", "--nodes", "0", "--out", "{out}"],
        "--nodes",
    ),
    "bench-missing-file": (["bench", "-f", "{missing}", "--out", "{out}"], "cannot read"),
    "bench-bad-plan": (["bench", "-f", "{bad}", "--out", "{out}"], "scenarios: required"),
    "bench-quick-bad-plan": (
        ["bench", "-f", "{bad}", "--quick", "--out", "{out}"],
        "scenarios: required",
    ),
    "chaos-unknown-fault": (["chaos", "--fault", "nosuch"], "--fault"),
    "up-unknown-flag": (["up", "--no-such-flag"], "unrecognized arguments"),
}


# Over a second here: the SDK's retries until its deadline against a closed
# port, and the simulator's workload import.
# (`status` against no control plane is checked by a real subprocess in
# tests/integration/test_up.py; its retries here would take ~20 s.)
SLOW = {"invoke-unreachable", "delete-unreachable", "simulate-bad-option"}


@pytest.mark.parametrize(
    "case", [pytest.param(c, marks=[pytest.mark.slow] if c in SLOW else []) for c in sorted(CASES)]
)
def test_expected_failure_is_a_clear_message(
    case: str, tmp_path: Path, bad_spec: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    template, expected = CASES[case]
    subs = {
        "missing": str(tmp_path / "missing.yaml"),
        "bad": str(bad_spec),
        "out": str(tmp_path / "out"),
    }
    argv = [a.format(**subs) for a in template]
    if argv[0] in ("deploy", "invoke", "delete"):
        argv += ["--controller", f"127.0.0.1:{_closed_port()}"]
    rc, err = _run(argv, capsys)
    assert rc != 0, f"{case}: exit status 0\n{err}"
    assert expected in err, f"{case}: {expected!r} not in\n{err}"
    assert "Traceback" not in err, err
