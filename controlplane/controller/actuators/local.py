"""Local process actuator: control function instances as child processes.

The embedded default (``galaxy up --autoscale-control``). Each instance is
``python -m controlplane.tools.cli serve KIND --id KIND-aN --controller SELF
--lifeline ...``. Its stdin is a pipe whose write end only this process
holds: when the controller exits, even by SIGKILL, the pipe closes and the
instance stops (see ``controlplane.runtime.host``), so no instance outlives it.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import logging
import os
import signal
import subprocess
import sys
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from controlplane.controller.actuators import cpulimit
from controlplane.controller.actuators.base import Actuator, ActuatorError
from controlplane.runtime import tlsfiles
from controlplane.runtime.host import serve_command
from controlplane.runtime.procs import wait_exit

log = logging.getLogger(__name__)

KINDS = ("dispatch", "schedule", "clustermgr")
DEFAULT_STOP_GRACE_S = 5.0


@dataclass
class _Child:
    kind: str
    instance_id: str
    proc: subprocess.Popen[bytes]
    log_path: Path | None
    exited: asyncio.Task[int] = field(repr=False)
    cgroup: Path | None = None
    #: Stopped on purpose (scale-in, shutdown): not a loss.
    stopping: bool = False


class LocalProcessActuator(Actuator):
    """Starts ``galaxy serve KIND`` processes on this machine.

    host: listen/advertise host of the instances. extra_args: per-kind flags
    appended to the command (e.g. ``{"dispatch": ["--state", "etcd://..."]}``).
    log_dir: where each instance's output goes (``KIND-aN.log``); None
    discards it. cpu_limits: CPUs each instance of a kind may use (its own
    cgroup, as a pod's limits.cpu; see ``cpulimit``); a kind not named is
    unlimited. standby: warm standby instances kept per kind (started with
    ``--standby``, promoted by a scale-out, replaced when promoted).
    """

    name = "local"

    def __init__(
        self,
        *,
        host: str = "127.0.0.1",
        extra_args: Mapping[str, Sequence[str]] | None = None,
        log_dir: Path | None = None,
        python: str = sys.executable,
        stop_grace_s: float = DEFAULT_STOP_GRACE_S,
        cpu_limits: Mapping[str, float] | None = None,
        tls_dir: str | None = None,
        standby: Mapping[str, int] | None = None,
    ) -> None:
        self.host = host
        self.standby = {k: max(0, int(n)) for k, n in (standby or {}).items()}
        for k in self.standby:
            if k not in KINDS:
                raise ActuatorError(f"standby: unknown kind {k!r}; one of {', '.join(KINDS)}")
        #: Instances serve mutual TLS with their kind's files here (None: plaintext).
        self.tls_dir = tls_dir
        self.extra_args = {k: list(v) for k, v in (extra_args or {}).items()}
        self.log_dir = log_dir
        self.python = python
        self.stop_grace_s = stop_grace_s
        self.cpu_limits = dict(cpu_limits or {})
        self.controller = ""
        self.children: dict[str, _Child] = {}
        self._ids = itertools.count(1)

    async def start(self, controller_address: str) -> None:
        """Remember where new instances register; start the standbys."""
        self.controller = controller_address
        for kind, n in self.standby.items():
            await self.add_standby(kind, n)

    def command(self, kind: str, instance_id: str, *, standby: bool = False) -> list[str]:
        """The command line of a new instance."""
        if kind not in KINDS:
            raise ActuatorError(f"unknown kind {kind!r}; one of {', '.join(KINDS)}")
        return serve_command(
            kind, instance_id, self.host, "--controller", self.controller,
            *(["--standby"] if standby else []),
            *tlsfiles.flags(self.tls_dir), *self.extra_args.get(kind, []),
            python=self.python,
        )  # fmt: skip

    async def scale_out(self, kind: str, current: int, desired: int) -> list[str]:
        """Spawn desired - current instances; returns their ids."""
        return self._spawn_many(kind, desired - current, standby=False)

    async def add_standby(self, kind: str, n: int) -> list[str]:
        """Spawn n warm standby instances of kind; returns their ids."""
        return self._spawn_many(kind, n, standby=True)

    def _spawn_many(self, kind: str, n: int, *, standby: bool) -> list[str]:
        if not self.controller:
            raise ActuatorError("actuator not started: controller address unknown")
        ids = []
        for _ in range(max(0, n)):
            iid = f"{kind}-a{next(self._ids)}"
            while iid in self.children:
                iid = f"{kind}-a{next(self._ids)}"
            self._spawn(kind, iid, standby=standby)
            ids.append(iid)
        return ids

    def _spawn(self, kind: str, instance_id: str, *, standby: bool = False) -> None:
        log_path = self.log_dir / f"{instance_id}.log" if self.log_dir else None
        if self.log_dir:
            self.log_dir.mkdir(parents=True, exist_ok=True)
        out = open(log_path, "ab") if log_path else subprocess.DEVNULL
        try:
            # CPython's Popen forks and execs without running Python in the
            # child (asyncio's subprocess under uvloop would), which is safe
            # in a process with gRPC threads. It blocks for a few ms only.
            proc = subprocess.Popen(
                self.command(kind, instance_id, standby=standby),
                stdin=subprocess.PIPE,  # the lifeline
                stdout=out,
                stderr=out,
                cwd=os.getcwd(),
            )
        except OSError as e:
            raise ActuatorError(f"cannot start {kind} {instance_id}: {e}") from e
        finally:
            if log_path is not None and not isinstance(out, int):
                out.close()
        cgroup = None
        cpus = self.cpu_limits.get(kind)
        if cpus:
            try:
                cgroup = cpulimit.limit_process(proc.pid, cpus, instance_id)
            except cpulimit.CpuLimitError as e:
                proc.kill()
                raise ActuatorError(str(e)) from e
        task = asyncio.ensure_future(wait_exit(proc))
        child = _Child(kind, instance_id, proc, log_path, task, cgroup)
        self.children[instance_id] = child
        task.add_done_callback(lambda t: self._exited(child, t))
        log.info("started %s %s (pid %d)", kind, instance_id, proc.pid)

    def _exited(self, child: _Child, task: asyncio.Task[int]) -> None:
        if self.children.get(child.instance_id) is child:
            del self.children[child.instance_id]
        code = None if task.cancelled() or task.exception() else task.result()
        log.info("%s %s exited with code %s", child.kind, child.instance_id, code)
        if not child.stopping and self.on_lost is not None:
            self.on_lost(child.kind, child.instance_id)
        if child.proc.stdin is not None:
            child.proc.stdin.close()
        if child.cgroup is not None:
            cpulimit.release(child.cgroup)

    def removable(self, kind: str, registered: Sequence[str]) -> list[str]:
        """Registered instances this actuator started, newest first."""
        mine = [c.instance_id for c in self.children.values() if c.kind == kind]
        return [i for i in reversed(mine) if i in set(registered)]

    async def scale_in(self, kind: str, instance_id: str, desired: int) -> None:
        """Stop one instance: SIGTERM, then SIGKILL after the grace period."""
        child = self.children.get(instance_id)
        if child is None:
            raise ActuatorError(f"{kind} {instance_id} was not started by this controller")
        await self._stop(child)

    async def _stop(self, child: _Child) -> None:
        child.stopping = True
        if child.proc.returncode is None:
            with contextlib.suppress(ProcessLookupError):
                child.proc.send_signal(signal.SIGTERM)
        try:
            await asyncio.wait_for(asyncio.shield(child.exited), self.stop_grace_s)
        except TimeoutError:
            log.warning(
                "%s did not stop in %.0fs: killing it", child.instance_id, self.stop_grace_s
            )
            with contextlib.suppress(ProcessLookupError):
                child.proc.kill()
            await asyncio.shield(child.exited)

    async def close(self) -> None:
        """Stop every instance this actuator started."""
        await asyncio.gather(*(self._stop(c) for c in list(self.children.values())))

    def pids(self) -> dict[str, int]:
        """Running instances and their process ids."""
        return {i: c.proc.pid for i, c in self.children.items()}
