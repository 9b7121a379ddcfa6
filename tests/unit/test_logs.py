"""Logs: one JSON schema (component, instance, context fields), size-based
rotation with stderr following the current file, and `galaxy logs` (order
across rotated files, --since, -f across a rotation, clear errors)."""

from __future__ import annotations

import asyncio
import contextlib
import json
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from controlplane.tools import logs_cmd
from controlplane.tools.cli import build_parser, main
from controlplane.tools.logs_cmd import cmd_logs, render
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
        with current.open("a") as f:
            f.write("last before rotation\n")
        current.rename(logs / "gateway-0.log.1")  # what the rotating handler does
        current.write_text("after rotation\n")
        assert p.stdout.readline().strip() == "last before rotation"
        assert p.stdout.readline().strip() == "after rotation"
    finally:
        p.kill()
        p.wait(timeout=10)


class _Shown:
    """stdout for an in-process `galaxy logs -f`: records the lines shown and
    sets ``seen`` when ``want`` is one of them."""

    def __init__(self, want: str) -> None:
        self.want, self.text, self.seen = want, "", asyncio.Event()

    def write(self, text: str) -> int:
        self.text += text
        if self.want in self.text.splitlines():
            self.seen.set()
        return len(text)

    def flush(self) -> None:
        pass


async def test_follow_shows_a_line_written_just_after_the_history(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A line a process appends right after the history was read is shown, not
    skipped: the follow continues where the history stopped. (It once reopened
    the file and started at its end, so a line written in between was lost;
    with stdout unbuffered, PYTHONUNBUFFERED=1, the subprocess test below hit
    that gap now and then. Here the line is written exactly in the gap.)"""
    logs = tmp_path / "logs"
    logs.mkdir()
    current = logs / "gateway-0.log"
    current.write_text("old line\n")
    history = logs_cmd._lines

    def history_then_a_write(*args: Any, **kwargs: Any) -> Iterator[str]:
        yield from history(*args, **kwargs)
        with current.open("a") as f:  # the history is read: a process writes
            f.write("written after the history\n")

    monkeypatch.setattr(logs_cmd, "_lines", history_then_a_write)
    out = _Shown("written after the history")
    monkeypatch.setattr(sys, "stdout", out)
    argv = ["--run-dir", str(tmp_path), "logs", "gateway-0", "-f", "--raw"]
    task = asyncio.create_task(cmd_logs(build_parser(argv).parse_args(argv)))
    try:
        # Shown within a poll or two (FOLLOW_POLL_S); the bound only ends a failure.
        await asyncio.wait_for(out.seen.wait(), timeout=5)
    finally:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task
    assert out.text.splitlines() == ["old line", "written after the history"]
