"""Sandbox backends: how a node agent runs one function instance.

All backends share one interface: ``SandboxBackend.start(...)`` returns a
ready ``Sandbox`` (or raises ``Unavailable``), ``Sandbox.stop()`` ends it, and
an ``on_exit(instance_id, returncode)`` callback reports an instance that ended
on its own. Backends:

- ``bwrap`` (the default): a real subprocess in a bubblewrap sandbox of its
  own (namespaces, its own uid, no capabilities, seccomp, a filesystem with
  only what it needs; ``sandbox/bwrap.py``).
- ``process``: a real subprocess listening on the node's address, isolating
  nothing (development only; loopback only when the agent listens there).
- ``emulated``: no process, a modelled cold-start delay (the 210-node
  emulation and benchmarks).

Container runtimes can be added behind the same interface.
"""

from __future__ import annotations

from typing import Any

from controlplane.nodeagent.sandbox.base import ExitCallback, Sandbox, SandboxBackend, describe_exit
from controlplane.nodeagent.sandbox.bwrap import BwrapBackend
from controlplane.nodeagent.sandbox.emulated import EmulatedBackend, EmulatedSandbox
from controlplane.nodeagent.sandbox.process import (
    DEFAULT_STARTUP_TIMEOUT_MS,
    DEFAULT_STOP_GRACE_S,
    ProcessBackend,
    ProcessSandbox,
)

__all__ = [
    "BACKENDS",
    "DEFAULT_STARTUP_TIMEOUT_MS",
    "DEFAULT_STOP_GRACE_S",
    "BwrapBackend",
    "EmulatedBackend",
    "EmulatedSandbox",
    "ExitCallback",
    "ProcessBackend",
    "ProcessSandbox",
    "Sandbox",
    "SandboxBackend",
    "describe_exit",
    "make_sandbox_backend",
]

BACKENDS: dict[str, type[SandboxBackend]] = {
    BwrapBackend.kind: BwrapBackend,
    ProcessBackend.kind: ProcessBackend,
    EmulatedBackend.kind: EmulatedBackend,
}


def make_sandbox_backend(kind: str, **opts: Any) -> SandboxBackend:
    """A backend by name ("bwrap", "process" or "emulated"); opts go to its
    constructor (bwrap and process: log_dir, startup_timeout_ms, stop_grace_s, cgroups, user,
    instance_dir; emulated:
    start_delay_ms)."""
    try:
        cls = BACKENDS[kind]
    except KeyError:
        raise ValueError(
            f"unknown sandbox kind {kind!r}; choose one of {', '.join(sorted(BACKENDS))}"
        ) from None
    return cls(**opts)
