"""The `galaxy` CLI run in the test process: the same parser and command code a
user runs, without an interpreter start and ~1 s of imports per call.

A CLI call from a test reads or changes a control plane; the subprocess is not
what it checks. A test whose point *is* the process (exit status of a real
interpreter, a closed pipe, shell completion, no control plane running) runs
``python -m controlplane.tools.cli`` itself (``GalaxyUp.cli_process``).

The command runs on a thread of its own: ``asyncio.run`` needs a thread without
a running event loop, and an async test may call it from its loop. While it
runs, ``sys.stdin``/``stdout``/``stderr`` are swapped for buffers, and the root
logger (which the CLI reconfigures) is put back afterwards, so the next test
logs as before, and the process's event loop policy (the CLI installs
uvloop's) is put back.
"""

from __future__ import annotations

import asyncio
import io
import logging
import subprocess
import sys
import threading
import traceback
from contextlib import redirect_stderr, redirect_stdout

from controlplane.tools import cli


def _exit_code(e: SystemExit, err: io.StringIO) -> int:
    """The status a process ending in ``SystemExit(e.code)`` returns."""
    if e.code is None or isinstance(e.code, int):
        return e.code or 0
    print(e.code, file=err)  # sys.exit("message"): printed, status 1
    return 1


def run_cli(
    argv: list[str], input: str | None = None, timeout: float = 60
) -> subprocess.CompletedProcess[str]:
    """``galaxy ARGV`` with ``input`` on stdin: its exit status and output, as
    ``subprocess.run(..., capture_output=True, text=True)`` would return them.
    An uncaught exception ends it as in a process: traceback on stderr, 1."""
    out, err = io.StringIO(), io.StringIO()
    stdin = io.TextIOWrapper(io.BytesIO((input or "").encode()))
    status: list[int] = []

    def command() -> None:
        root = logging.getLogger()
        handlers, level, saved_stdin = root.handlers[:], root.level, sys.stdin
        # The CLI installs uvloop's policy for the whole process: put the
        # test's back, or every later test of this worker would run on
        # uvloop, depending on which files ran here before it.
        policy = asyncio.get_event_loop_policy()
        sys.stdin = stdin
        try:
            with redirect_stdout(out), redirect_stderr(err):
                try:
                    status.append(cli.main(argv))
                except SystemExit as e:
                    status.append(_exit_code(e, err))
                except BaseException:  # a process would print it and exit 1
                    err.write(traceback.format_exc())
                    status.append(1)
        finally:
            asyncio.set_event_loop_policy(policy)
            sys.stdin = saved_stdin
            for h in root.handlers[:]:
                root.removeHandler(h)
            for h in handlers:
                root.addHandler(h)
            root.setLevel(level)

    t = threading.Thread(target=command, name=f"galaxy {argv[:3]}", daemon=True)
    t.start()
    t.join(timeout)
    if t.is_alive():
        raise subprocess.TimeoutExpired(["galaxy", *argv], timeout, out.getvalue(), err.getvalue())
    return subprocess.CompletedProcess(["galaxy", *argv], status[0], out.getvalue(), err.getvalue())
