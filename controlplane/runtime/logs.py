"""How every Galaxy process logs: one schema, JSON or text, optionally to a
size-rotated file.

JSON lines (python-json-logger) carry ``time`` (UTC, ISO 8601 with
milliseconds), ``level``, ``logger``, ``message``, ``component`` (the kind:
dispatch, gateway, ...; ``cli`` for commands), ``instance`` (the process's
id), and ``function``, ``request_id``, ``trace_id`` when the code that logs
knows them (``logging.info(..., extra={"function": name})``). ``--log-format
auto`` (the default) is JSON unless stderr is a terminal, so a person at a
terminal reads text and a collector reads JSON.

With ``--log-file`` (what `galaxy up` gives each child) the file rotates at
``--log-max-bytes``, keeping ``--log-backups`` old files (``NAME.log.1`` is
the newest old one). The process's stderr is pointed at the current file
after every rotation, so what does not go through logging (a fatal
traceback) lands beside the log lines instead of in a renamed file.
"""

from __future__ import annotations

import logging
import logging.handlers
import os
import sys
import time
from typing import Any

from pythonjsonlogger.json import JsonFormatter

FORMATS = ("auto", "json", "text")
#: Fields a caller may attach with ``extra=`` (kept in the JSON when set).
CONTEXT_FIELDS = ("function", "request_id", "trace_id")
DEFAULT_MAX_BYTES = 10 * 1024 * 1024
DEFAULT_BACKUPS = 5
TEXT_FORMAT = "%(asctime)s %(levelname)s %(name)s: %(message)s"


class _Json(JsonFormatter):
    """The JSON schema of the module docstring."""

    def __init__(self, component: str, instance: str) -> None:
        super().__init__(
            "%(levelname)s %(name)s %(message)s",
            rename_fields={"levelname": "level", "name": "logger"},
            static_fields={"component": component, "instance": instance},
            timestamp="time",
        )

    def formatTime(self, record: logging.LogRecord, datefmt: str | None = None) -> str:
        t = time.gmtime(record.created)
        return time.strftime("%Y-%m-%dT%H:%M:%S", t) + f".{int(record.msecs):03d}Z"

    def add_fields(
        self, log_data: dict[str, Any], record: logging.LogRecord, message_dict: dict[str, Any]
    ) -> None:
        super().add_fields(log_data, record, message_dict)
        # UTC with milliseconds, the same clock as the text format's.
        log_data["time"] = self.formatTime(record)


class _StderrFollowingHandler(logging.handlers.RotatingFileHandler):
    """A rotating file whose current file is also the process's stderr."""

    def _point_stderr(self) -> None:
        if self.stream is not None:
            sys.stderr.flush()
            os.dup2(self.stream.fileno(), 2)

    def doRollover(self) -> None:
        super().doRollover()
        self._point_stderr()


def configure(
    *,
    level: str,
    fmt: str = "auto",
    component: str = "cli",
    instance: str = "",
    file: str | None = None,
    max_bytes: int = DEFAULT_MAX_BYTES,
    backups: int = DEFAULT_BACKUPS,
) -> None:
    """Set up the root logger; ValueError naming the option when one is wrong."""
    if fmt not in FORMATS:
        raise ValueError(f"--log-format: one of {', '.join(FORMATS)}, got {fmt!r}")
    if max_bytes < 1024:
        raise ValueError("--log-max-bytes: at least 1024")
    if backups < 0:
        raise ValueError("--log-backups: 0 or more")
    handler: logging.Handler
    if file:
        rotating = _StderrFollowingHandler(file, maxBytes=max_bytes, backupCount=backups)
        rotating._point_stderr()
        handler = rotating
        tty = False
    else:
        handler = logging.StreamHandler(sys.stderr)
        tty = sys.stderr.isatty()
    as_json = fmt == "json" or (fmt == "auto" and not tty)
    handler.setFormatter(_Json(component, instance) if as_json else logging.Formatter(TEXT_FORMAT))
    root = logging.getLogger()
    for h in list(root.handlers):
        root.removeHandler(h)
    root.addHandler(handler)
    root.setLevel(level.upper())
