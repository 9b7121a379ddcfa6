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
from collections.abc import Iterable, Iterator
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


def _lines(sources: list[Iterable[str]], since: float | None) -> Iterator[str]:
    """The lines of each source in turn (without newlines), from --since on."""
    keep = since is None
    for source in sources:
        for line in source:
            line = line.rstrip("\n")
            if not keep:
                when = _when(line)
                # Lines without a time (traceback lines) follow the
                # decision of the line before them.
                if when is not None and since is not None:
                    keep = when >= since
            if keep:
                yield line


def _read(path: Path) -> Iterator[str]:
    with path.open(errors="replace") as f:
        yield from f


class _Tail:
    """The current log file, read from its start and then followed across
    rotations. History and follow read one open file, so a line written
    between them is neither lost nor shown twice."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.f = path.open(errors="replace")
        self.ident = self._ident(os.fstat(self.f.fileno()))
        self.partial = ""  # a line still being written: shown once complete

    @staticmethod
    def _ident(st: os.stat_result) -> tuple[int, int]:
        return (st.st_dev, st.st_ino)

    def __iter__(self) -> Iterator[str]:
        """The complete lines available now (the history, on the first call)."""
        while True:
            chunk = self.f.readline()
            if not chunk:
                return
            self.partial += chunk
            if self.partial.endswith("\n"):
                line, self.partial = self.partial, ""
                yield line

    def new_lines(self) -> list[str]:
        """Lines appended since the last call; after a rotation, the rest of
        the old file, then the new file from its start."""
        lines = list(self)
        try:
            rotated = self._ident(os.stat(self.path)) != self.ident
        except FileNotFoundError:  # between the rename and the new file
            return lines
        if rotated:
            # The old file may have grown after the read above and before
            # the rename: drain it (a last line without a newline included).
            lines += list(self)
            if self.partial:
                lines.append(self.partial)
            self.close()
            self.f = self.path.open(errors="replace")
            self.ident = self._ident(os.fstat(self.f.fileno()))
            self.partial = ""
            lines += list(self)
        return lines

    def close(self) -> None:
        self.f.close()


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
    current = log_dir / f"{args.component}.log"
    tail: _Tail | None = None
    if args.follow:
        if not current.exists():
            raise CliError(f"{current} does not exist: nothing to follow (only rotated files)")
        tail = _Tail(current)
    try:
        sources: list[Iterable[str]] = [_read(p) for p in files if tail is None or p != current]
        if tail is not None:
            sources.append(tail)
        for line in _lines(sources, since):
            print(show(line))
        if tail is not None:
            await _follow(tail, show)
    finally:
        if tail is not None:
            tail.close()
    return 0


async def _follow(tail: _Tail, show: Any) -> None:
    """Print lines appended to the tail's file. A local file has no change
    event portable enough to await: poll it."""
    while True:
        for line in tail.new_lines():
            print(show(line.rstrip("\n")))
        sys.stdout.flush()
        await asyncio.sleep(FOLLOW_POLL_S)
