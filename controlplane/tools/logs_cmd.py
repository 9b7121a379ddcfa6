"""`galaxy logs [COMPONENT] [-f] [--since 10m] [--raw]`: the logs of a
`galaxy up`'s processes (RUN_DIR/logs/NAME.log and its rotated files),
oldest first, JSON lines shown as text unless ``--raw``."""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import re
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from controlplane.tools.common import CliError

_DURATION = re.compile(r"(\d+(?:\.\d+)?)([smhd])")
_UNITS = {"s": 1, "m": 60, "h": 3600, "d": 86400}
FOLLOW_POLL_S = 0.25


def add_subparser(sub: Any) -> None:
    """``galaxy logs``."""
    p = sub.add_parser(
        "logs",
        help="show a component's log (of the `galaxy up` in --run-dir)",
        description="Without COMPONENT: list the components that have logs.",
    )
    p.add_argument("component", nargs="?", help="e.g. dispatch-0, agent-1, gateway-0, controller")
    p.add_argument("-f", "--follow", action="store_true", help="keep printing new lines")
    p.add_argument("--since", default=None, help="only lines newer than this (30s, 10m, 2h, 1d)")
    p.add_argument("--raw", action="store_true", help="print lines as stored (JSON)")
    p.set_defaults(func=cmd_logs)


def parse_since(text: str, now: float) -> float:
    """The cutoff (Unix time) for --since; CliError naming the option."""
    m = _DURATION.fullmatch(text.strip())
    if m is None:
        raise CliError(f"--since: expected a number and s, m, h or d (e.g. 10m), got {text!r}")
    return now - float(m.group(1)) * _UNITS[m.group(2)]


def log_files(log_dir: Path, component: str) -> list[Path]:
    """NAME.log.K ... NAME.log.1, NAME.log: oldest first."""
    current = log_dir / f"{component}.log"
    rotated = sorted(
        (p for p in log_dir.glob(f"{component}.log.*") if p.suffix[1:].isdigit()),
        key=lambda p: int(p.suffix[1:]),
        reverse=True,
    )
    return [*rotated, *([current] if current.exists() else [])]


def _when(line: str) -> float | None:
    """Unix time of a log line (JSON "time" or the text format's prefix)."""
    try:
        stamp = str(json.loads(line)["time"])
        return time.mktime(time.strptime(stamp[:19], "%Y-%m-%dT%H:%M:%S")) - time.timezone
    except (ValueError, KeyError, TypeError):
        pass
    try:
        return time.mktime(time.strptime(line[:19], "%Y-%m-%d %H:%M:%S"))
    except ValueError:
        return None


def render(line: str) -> str:
    """A JSON log line as text; anything else (a traceback line) as it is."""
    try:
        d = json.loads(line)
        head = f"{d['time']} {d['level']:<7} {d['logger']}: {d['message']}"
    except (ValueError, KeyError, TypeError):
        return line
    extra = " ".join(f"{k}={d[k]}" for k in ("function", "request_id", "trace_id") if k in d)
    return f"{head} [{extra}]" if extra else head


def _lines(files: list[Path], since: float | None) -> Iterator[str]:
    keep = since is None
    for path in files:
        with path.open(errors="replace") as f:
            for line in f:
                line = line.rstrip("\n")
                if not keep:
                    when = _when(line)
                    # Lines without a time (traceback lines) follow the
                    # decision of the line before them.
                    if when is not None and since is not None:
                        keep = when >= since
                if keep:
                    yield line


async def cmd_logs(args: argparse.Namespace) -> int:
    """Print (and with -f follow) one component's log."""
    log_dir = Path(args.run_dir) / "logs"
    if not log_dir.is_dir():
        raise CliError(f"no logs in {log_dir} (is --run-dir the one `galaxy up` used?)")
    if not args.component:
        names = sorted({p.name.split(".log")[0] for p in log_dir.glob("*.log*")})
        print("\n".join(names))
        return 0
    files = log_files(log_dir, args.component)
    if not files:
        known = sorted({p.name.split(".log")[0] for p in log_dir.glob("*.log")})
        raise CliError(f"no log for {args.component!r}; components: {', '.join(known)}")
    since = parse_since(args.since, time.time()) if args.since else None
    show = (lambda s: s) if args.raw else render
    for line in _lines(files, since):
        print(show(line))
    if args.follow:
        await _follow(log_dir / f"{args.component}.log", show)
    return 0


async def _follow(path: Path, show: Any) -> None:
    """Print lines appended to path, reopening it when it is rotated. A
    local file has no change event portable enough to await: poll it."""
    f = path.open(errors="replace")
    f.seek(0, os.SEEK_END)
    inode = os.fstat(f.fileno()).st_ino
    try:
        while True:
            line = f.readline()
            if line:
                print(show(line.rstrip("\n")), flush=True)
                continue
            try:
                if os.stat(path).st_ino != inode:  # rotated: the new file from its start
                    f.close()
                    f = path.open(errors="replace")
                    inode = os.fstat(f.fileno()).st_ino
                    continue
            except FileNotFoundError:
                pass
            sys.stdout.flush()
            await asyncio.sleep(FOLLOW_POLL_S)
    finally:
        f.close()
