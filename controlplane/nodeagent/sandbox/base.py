"""The sandbox interface shared by every backend."""

from __future__ import annotations

import contextlib
import os
import signal
from abc import ABC, abstractmethod
from collections.abc import Callable
from typing import ClassVar

from galaxy.v1 import common_pb2

#: Called with (instance_id, returncode) when a ready instance ends on its own
#: (never for an instance stopped through ``Sandbox.stop``).
ExitCallback = Callable[[str, int], None]


def describe_exit(returncode: int) -> str:
    """'process exited with code N' (plus the signal name when killed)."""
    text = f"process exited with code {returncode}"
    if returncode < 0:
        with contextlib.suppress(ValueError):
            text += f" (killed by {signal.Signals(-returncode).name})"
    return text


class Sandbox(ABC):
    """One running function instance, as returned by ``SandboxBackend.start``."""

    def __init__(self, node_id: str, instance_id: str, address: str) -> None:
        self.node_id = node_id
        self.instance_id = instance_id
        #: Where the instance serves (host:port, or emulated://node/instance).
        self.address = address
        #: OS process id, for backends that have one (its process group's).
        self.pid: int | None = None
        #: Why the node agent killed it itself (a limit it enforces).
        self.killed_for = ""

    def exit_reason(self, returncode: int) -> str:
        """How the instance ended, for logs and Dispatch."""
        return describe_exit(returncode)

    def kill_for(self, why: str) -> None:
        """Kill the instance's processes at once, for why: it then ends as
        an exit does (reported to Dispatch), and its exit reason says why."""
        self.killed_for = why
        if self.pid:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.pid, signal.SIGKILL)

    @property
    @abstractmethod
    def running(self) -> bool:
        """True until the instance has ended (stopped or exited)."""

    @abstractmethod
    async def stop(self) -> None:
        """End the instance and release everything it holds. Idempotent; the
        exit callback is not called for an instance stopped this way."""


class SandboxBackend(ABC):
    """Starts sandboxes for one node agent process (any number of nodes)."""

    #: Name used by ``make_sandbox_backend`` and ``--sandbox``.
    kind: ClassVar[str]
    #: True when FunctionSpec.command must be non-empty.
    needs_command: ClassVar[bool]
    #: The node's address: instances listen on it and are advertised at it,
    #: so clients on other hosts can reach them. The node agent sets it to
    #: its own advertised host (``NodeAgentComponent.start``).
    host: str = "127.0.0.1"

    @abstractmethod
    async def start(
        self,
        node_id: str,
        instance_id: str,
        spec: common_pb2.FunctionSpec,
        on_exit: ExitCallback | None = None,
    ) -> Sandbox:
        """Start an instance of spec and return it once ready.

        Raises Unavailable (with the reason) when it cannot start or does not
        become ready in time; nothing is left running then. Cancelling the
        call also leaves nothing running.
        """

    @abstractmethod
    async def close(self) -> None:
        """Stop every sandbox this backend started and still runs."""
