"""Logs: one JSON schema (component, instance, context fields), size-based
rotation with stderr following the current file, and `galaxy logs` (order
across rotated files, --since, -f across a rotation, clear errors)."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

import pytest

from controlplane.tools.cli import main
from controlplane.tools.logs_cmd import render
from tests.integration.upctl import REPO

CHILD = """
import logging, sys
from controlplane.runtime import logs
logs.configure(level="INFO", fmt="auto", component="dispatch", instance="dispatch-7",
               file=sys.argv[1], max_bytes=2048, backups=2)
log = logging.getLogger("galaxy.test")
for i in range(60):
    log.info("line %d", i, extra={"function": "echo", "request_id": f"r{i}"})
print("after-rotation on stderr", file=sys.stderr, flush=True)
raise SystemExit("fatal: exits through stderr")
"""


def test_json_schema_rotation_and_stderr_follow(tmp_path: Path) -> None:
    log = tmp_path / "dispatch-7.log"
    r = subprocess.run([sys.executable, "-c", CHILD, str(log)], cwd=REPO,
                       capture_output=True, text=True, timeout=60)  # fmt: skip
    assert r.returncode == 1
    rotated = sorted(tmp_path.glob("dispatch-7.log.*"))
    assert [p.name for p in rotated] == ["dispatch-7.log.1", "dispatch-7.log.2"]  # 2 backups
    for p in [*rotated, log]:
        assert p.stat().st_size <= 2048 + 400  # one line past the bound at most
    current = log.read_text().splitlines()
    records = [json.loads(line) for line in current if line.startswith("{")]
    last = records[-1]
    assert last["message"] == "line 59" and last["level"] == "INFO"
    assert (last["component"], last["instance"]) == ("dispatch", "dispatch-7")
    assert (last["function"], last["request_id"]) == ("echo", "r59")
    assert last["time"].endswith("Z") and last["logger"] == "galaxy.test"
    # What bypasses logging lands in the current file, not a rotated one.
    assert "after-rotation on stderr" in current
    assert "fatal: exits through stderr" in current


def test_bad_logging_options_are_refused_naming_them(capsys) -> None:
    assert main(["--log-max-bytes", "10", "status"]) == 2
    assert "--log-max-bytes" in capsys.readouterr().err


def _write(path: Path, stamps: list[float]) -> None:
    path.write_text(
        "".join(
            json.dumps({"time": time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(t)) + ".000Z",
                        "level": "INFO", "logger": "x", "message": f"at {int(t)}",
                        "component": "dispatch", "instance": "dispatch-0"}) + "\n"
            for t in stamps
        )
    )  # fmt: skip


def test_galaxy_logs_orders_rotated_files_and_honours_since(tmp_path: Path, capsys) -> None:
    logs = tmp_path / "logs"
    logs.mkdir()
    now = time.time()
    _write(logs / "dispatch-0.log.2", [now - 7200])
    _write(logs / "dispatch-0.log.1", [now - 3000])
    _write(logs / "dispatch-0.log", [now - 60, now - 5])
    assert main(["--run-dir", str(tmp_path), "logs", "dispatch-0"]) == 0
    out = capsys.readouterr().out.splitlines()
    assert [line.split()[-1] for line in out] == [
        str(int(t)) for t in (now - 7200, now - 3000, now - 60, now - 5)
    ]
    assert main(["--run-dir", str(tmp_path), "logs", "dispatch-0", "--since", "2m"]) == 0
    assert len(capsys.readouterr().out.splitlines()) == 2
    assert main(["--run-dir", str(tmp_path), "logs", "dispatch-0", "--since", "2x"]) == 1
    assert "--since" in capsys.readouterr().err
    assert main(["--run-dir", str(tmp_path), "logs", "nosuch"]) == 1
    err = capsys.readouterr().err
    assert "dispatch-0" in err and "Traceback" not in err
    assert main(["--run-dir", str(tmp_path), "logs"]) == 0
    assert capsys.readouterr().out.split() == ["dispatch-0"]


def test_render_keeps_non_json_lines() -> None:
    assert render("Traceback (most recent call last):") == "Traceback (most recent call last):"
    line = json.dumps({"time": "t", "level": "WARNING", "logger": "l", "message": "m",
                       "function": "echo"})  # fmt: skip
    assert render(line) == "t WARNING l: m [function=echo]"


@pytest.mark.slow
def test_follow_continues_across_a_rotation(tmp_path: Path) -> None:
    logs = tmp_path / "logs"
    logs.mkdir()
    current = logs / "gateway-0.log"
    current.write_text("old line\n")
    p = subprocess.Popen(
        [sys.executable, "-m", "controlplane.tools.cli", "--run-dir", str(tmp_path),
         "logs", "gateway-0", "-f", "--raw"],
        cwd=REPO, stdout=subprocess.PIPE, text=True,
    )  # fmt: skip
    try:
        assert p.stdout is not None
        assert p.stdout.readline().strip() == "old line"  # the history first
        with current.open("a") as f:
            f.write("appended\n")
        assert p.stdout.readline().strip() == "appended"
        current.rename(logs / "gateway-0.log.1")  # what the rotating handler does
        current.write_text("after rotation\n")
        assert p.stdout.readline().strip() == "after rotation"
    finally:
        p.kill()
        p.wait(timeout=10)
