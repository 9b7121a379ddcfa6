"""The emulated sandbox backend: no process, a modelled cold-start delay
(for the 210-node emulation and benchmarks)."""

from __future__ import annotations

import asyncio

from controlplane.nodeagent.sandbox.base import ExitCallback, Sandbox, SandboxBackend
from galaxy.v1 import common_pb2


class EmulatedSandbox(Sandbox):
    """An instance that exists only in the agent's bookkeeping."""

    def __init__(
        self,
        backend: EmulatedBackend,
        node_id: str,
        instance_id: str,
        on_exit: ExitCallback | None,
    ) -> None:
        super().__init__(node_id, instance_id, f"emulated://{node_id}/{instance_id}")
        self._backend = backend
        self._on_exit = on_exit
        self._running = True

    @property
    def running(self) -> bool:
        return self._running

    async def stop(self) -> None:
        self._running = False
        self._backend._live.discard(self)

    def crash(self, returncode: int = 1) -> None:
        """Model the instance dying on its own (fault injection): the exit
        callback runs soon after, as it would for a real process."""
        if not self._running:
            return
        self._running = False
        self._backend._live.discard(self)
        if self._on_exit is not None:
            asyncio.get_running_loop().call_soon(self._on_exit, self.instance_id, returncode)


class EmulatedBackend(SandboxBackend):
    """No process; an instance is ready start_delay_ms after it is asked for."""

    kind = "emulated"
    needs_command = False

    def __init__(self, start_delay_ms: float = 0.0) -> None:
        if start_delay_ms < 0:
            raise ValueError("start_delay_ms must be >= 0")
        self.start_delay_s = start_delay_ms / 1000
        self._live: set[EmulatedSandbox] = set()

    async def start(
        self,
        node_id: str,
        instance_id: str,
        spec: common_pb2.FunctionSpec,
        on_exit: ExitCallback | None = None,
    ) -> EmulatedSandbox:
        if self.start_delay_s > 0:
            await asyncio.sleep(self.start_delay_s)  # the modelled cold start
        sb = EmulatedSandbox(self, node_id, instance_id, on_exit)
        self._live.add(sb)
        return sb

    async def close(self) -> None:
        for sb in list(self._live):
            await sb.stop()
