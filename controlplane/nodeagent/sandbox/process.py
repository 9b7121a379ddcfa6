"""The process sandbox backend: each instance is a real subprocess that
listens on the node's address (``SandboxBackend.host``) at a port the agent
picks, given to it as $HOST and $PORT."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import signal
import subprocess
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import BinaryIO

from prometheus_client import Counter

from controlplane.nodeagent.entry.door import Dial, Door
from controlplane.nodeagent.logkeep import log_name
from controlplane.nodeagent.sandbox.base import ExitCallback, Sandbox, SandboxBackend, describe_exit
from controlplane.nodeagent.sandbox.cgroups import CgroupError, Cgroups, InstanceGroup
from controlplane.nodeagent.sandbox.launch import (
    cannot_run,
    instance_user,
    pdeathsig_prefix,
    resolve,
    run_as_prefix,
)
from controlplane.nodeagent.sandbox.ports import free_port
from controlplane.nodeagent.sandbox.workdirs import InstanceDirs
from controlplane.runtime import revisions
from controlplane.runtime.errors import Unavailable
from controlplane.runtime.netaddr import join_host_port
from controlplane.runtime.procs import wait_exit
from controlplane.runtime.validation import short
from galaxy.v1 import common_pb2

log = logging.getLogger(__name__)

DEFAULT_STARTUP_TIMEOUT_MS = 10_000
DEFAULT_STOP_GRACE_S = 2.0
# Readiness polling: start fast (a Python server is ready in ~80 ms, so every
# millisecond of poll interval is cold-start latency) and cap low.
_POLL_FIRST_S = 0.005
_POLL_CAP_S = 0.010


def _killpg(pgid: int, sig: int) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pgid, sig)


def log_tail(path: Path, max_lines: int = 10, max_bytes: int = 4096) -> str:
    """The last lines of a log (at most max_lines, from its last max_bytes);
    "" when it cannot be read."""
    try:
        with open(path, "rb") as f:
            f.seek(0, os.SEEK_END)
            f.seek(max(0, f.tell() - max_bytes))
            data = f.read()
    except OSError:
        return ""
    return "\n".join(data.decode(errors="replace").splitlines()[-max_lines:])


async def _connect(
    host: str, port: int, dial: Dial | None
) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
    """A connection to host:port, from a socket of dial when given (one in
    the instance's network namespace)."""
    if dial is None:
        return await asyncio.open_connection(host, port)
    sock = await dial()
    try:
        await asyncio.get_running_loop().sock_connect(sock, (host, port))
    except BaseException:
        sock.close()
        raise
    return await asyncio.open_connection(sock=sock)


async def _ready_probe(
    host: str, port: int, path: str, timeout_s: float, dial: Dial | None
) -> bool:
    """One readiness check: TCP connect, or HTTP GET path answering 2xx."""
    try:
        async with asyncio.timeout(timeout_s):
            reader, writer = await _connect(host, port, dial)
            try:
                if not path:
                    return True
                hostport = join_host_port(host, port)
                writer.write(f"GET {path} HTTP/1.0\r\nHost: {hostport}\r\n\r\n".encode())
                status = (await reader.readline()).split()
                return len(status) >= 2 and status[1].startswith(b"2")
            finally:
                writer.close()
                with contextlib.suppress(OSError):
                    await writer.wait_closed()
    except (OSError, TimeoutError):
        return False


@contextlib.contextmanager
def _closing(fds: tuple[int, ...]) -> Iterator[None]:
    """Close fds on leaving (the child has its copies by then)."""
    try:
        yield
    finally:
        for fd in fds:
            os.close(fd)


OOM_KILLS = Counter(
    "galaxy_instance_oom_kills_total", "Function instances ended by the OOM killer at their limit"
)
PIDS_LIMIT_HITS = Counter(
    "galaxy_instance_pids_limit_hits_total",
    "Function instances that tried to fork or start a thread past --instance-max-pids",
)


class ProcessSandbox(Sandbox):
    """An instance running as a subprocess in its own process group."""

    def __init__(
        self,
        backend: ProcessBackend,
        node_id: str,
        instance_id: str,
        proc: subprocess.Popen[bytes],
        port: int,
        stderr_path: Path,
        on_exit: ExitCallback | None,
        group: InstanceGroup | None = None,
        memory_mib: int = 0,
        private_dir: Path | None = None,
        uid: int | None = None,
    ) -> None:
        super().__init__(node_id, instance_id, join_host_port(backend.host, port))
        #: The uid it runs as when its backend gave it one of its own.
        self.uid = uid
        self.group = group
        #: Its private directory ($HOME, $TMPDIR; removed when it ends).
        self.private_dir = private_dir
        self.memory_mib = memory_mib
        #: True when the kernel's OOM killer ended it (read from its cgroup).
        self.oom_killed = False
        self.pid = proc.pid
        self.host = backend.host
        self.port = port
        #: Where the instance itself listens, and how to reach it there: the
        #: node's address, or the loopback of its own network namespace
        #: through ``dial`` (the bwrap backend sets both, and ``entry``, the
        #: door that alone admits callers, closed when it ends).
        self.inner_host = backend.inner_host
        self.dial: Dial | None = None
        self.entry: Door | None = None
        self.stderr_path = stderr_path
        self.returncode: int | None = None
        self._backend = backend
        self._proc = proc
        self._on_exit = on_exit
        self._ready = False
        self._stopping = False
        self._exited: asyncio.Task[int] = asyncio.create_task(self._watch())

    @property
    def running(self) -> bool:
        return not self._exited.done()

    async def _watch(self) -> int:
        rc = await wait_exit(self._proc)
        self.returncode = rc
        self._backend._live.discard(self)
        await self._backend._detach(self)
        # The leader is gone; anything it left in its group goes too.
        _killpg(self.pid or 0, signal.SIGKILL)
        if self.group is not None:
            self.oom_killed = self.group.oom_kills() > 0
            if self.oom_killed:
                OOM_KILLS.inc()
            hits = self.group.pids_limit_hits()
            if hits:
                PIDS_LIMIT_HITS.inc()
                log.warning(
                    "instance %s hit its limit of %d processes and threads "
                    "(--instance-max-pids) %d times",
                    self.instance_id, self._backend.max_pids, hits,
                )  # fmt: skip
            await self.group.empty()
            self.group.remove()
        if self.private_dir is not None:
            await asyncio.to_thread(self._backend.dirs.remove, self.private_dir)
        if self.uid is not None:
            # Last: its processes and files are gone, the uid can serve another.
            self._backend._release_uid(self.uid)
        if self._ready and not self._stopping and self._on_exit is not None:
            try:
                self._on_exit(self.instance_id, rc)
            except Exception:
                log.exception("exit callback failed for instance %s", self.instance_id)
        return rc

    def exit_reason(self, returncode: int) -> str:
        """How it ended, naming the memory limit when the OOM killer ended it."""
        text = describe_exit(returncode)
        if self.oom_killed:
            text += (
                f"; out of memory: the kernel killed it at its limit of {self.memory_mib} MiB "
                "(resources.memory_mib)"
            )
        return text

    async def _failure(self, what: str) -> Unavailable:
        tail = await asyncio.to_thread(log_tail, self.stderr_path)
        detail = f"; last stderr lines:\n{tail}" if tail else "; stderr was empty"
        return Unavailable(
            f"instance {self.instance_id} on node {self.node_id} {what}{detail}"
            f" (full log: {self.stderr_path})"
        )

    async def wait_ready(self, timeout_s: float, path: str) -> None:
        """Poll until ready; raise Unavailable if it exits or times out first."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout_s
        interval = _POLL_FIRST_S
        while True:
            if self._exited.done():
                rc = self._exited.result()
                raise await self._failure(f"{self.exit_reason(rc)} before it became ready")
            remaining = deadline - loop.time()
            if remaining <= 0:
                check = f"GET {path} answering 2xx" if path else "a TCP connection"
                raise await self._failure(
                    f"did not become ready within {timeout_s * 1000:.0f} ms "
                    f"(waited for {check} on {self.address})"
                )
            if await _ready_probe(self.inner_host, self.port, path, min(remaining, 1.0), self.dial):
                self._ready = True
                return
            # Waiting on the exit task (not a plain sleep) notices a crash at once.
            await asyncio.wait({self._exited}, timeout=min(interval, remaining))
            interval = min(interval * 2, _POLL_CAP_S)

    async def stop(self, grace_s: float | None = None) -> None:
        """SIGTERM to the group, SIGKILL after grace_s, and reap."""
        self._stopping = True
        if grace_s is None:
            grace_s = self._backend.stop_grace_s
        if not self._exited.done():
            pgid = self.pid or 0
            if grace_s > 0:
                _killpg(pgid, signal.SIGTERM)
                await asyncio.wait({self._exited}, timeout=grace_s)
            if not self._exited.done():
                _killpg(pgid, signal.SIGKILL)
        # Shielded: a cancelled stop must not cancel reaping.
        await asyncio.shield(self._exited)


class ProcessBackend(SandboxBackend):
    """Runs FunctionSpec.command as a subprocess with HOST and PORT set.

    log_dir: stdout and stderr go to <log_dir>/<node_id>/<instance_id>.{out,err}
    (default: a new temporary directory).
    """

    kind = "process"
    needs_command = True

    def __init__(
        self,
        log_dir: str | os.PathLike[str] | None = None,
        startup_timeout_ms: int = DEFAULT_STARTUP_TIMEOUT_MS,
        stop_grace_s: float = DEFAULT_STOP_GRACE_S,
        cgroups: Cgroups | None = None,
        user: str | None = None,
        instance_dir: str | os.PathLike[str] | None = None,
    ) -> None:
        self.log_dir = Path(log_dir) if log_dir else Path(tempfile.mkdtemp(prefix="galaxy-agent-"))
        if self.kind == ProcessBackend.kind:
            log.warning(
                "--sandbox process ISOLATES NOTHING: instances run as %s, see the agent's "
                "files, keys and processes and each other's (development only; the "
                "default --sandbox bwrap isolates them)",
                f"user {user}" if user else "the node agent's user",
            )
        #: Per-instance CPU and memory limits (None: the limits are bookkeeping only).
        self.cgroups = cgroups
        self.startup_timeout_ms = startup_timeout_ms
        self.stop_grace_s = stop_grace_s
        self._live: set[ProcessSandbox] = set()
        self._prefix = pdeathsig_prefix() if user is None else run_as_prefix(user)
        #: The user instances run as (None: the agent's own).
        self.user = user
        owner = None
        if user is not None:
            pw = instance_user(user)
            owner = (pw.pw_uid, pw.pw_gid)
        #: Private directories (--instance-dir).
        try:
            self.dirs = InstanceDirs(Path(instance_dir) if instance_dir else None, owner)
        except OSError as e:
            raise ValueError(f"--instance-dir: {e}") from None

    @property
    def max_pids(self) -> int:
        """Each instance's process and thread limit (0: none)."""
        return self.cgroups.max_pids if self.cgroups is not None else 0

    def _env(
        self,
        node_id: str,
        instance_id: str,
        spec: common_pb2.FunctionSpec,
        port: int,
        private_dir: Path | None = None,
    ) -> dict[str, str]:
        # Not the agent's whole environment: an instance sees PATH, its spec's
        # env and what the agent tells it (set last, so a spec cannot fake them).
        env = {"PATH": os.environ.get("PATH", os.defpath)}
        if private_dir is not None:
            # Before the spec's env: a function may point them elsewhere.
            env["HOME"] = env["TMPDIR"] = str(private_dir)
        env.update(spec.env)
        if private_dir is not None:
            env["GALAXY_INSTANCE_DIR"] = str(private_dir)
        env["GALAXY_INSTANCE_ID"] = instance_id
        function, revision = revisions.split(spec.name)
        env["GALAXY_FUNCTION"] = function
        env["GALAXY_REVISION"] = str(revision)  # 0: a function without revisions
        env["GALAXY_NODE_ID"] = node_id
        env["HOST"] = self.inner_host
        env["PORT"] = str(port)
        return env

    @property
    def inner_host(self) -> str:
        """The address an instance listens on (a backend that gives it a
        network namespace of its own: that namespace's loopback)."""
        return self.host

    async def _attach(self, sb: ProcessSandbox) -> None:
        """Called once sb's process runs, before its readiness is checked."""

    async def _admit(self, sb: ProcessSandbox) -> None:
        """Called once sb is ready, before its start returns."""

    async def _detach(self, sb: ProcessSandbox) -> None:
        """Called once sb's process has ended."""

    def _acquire_uid(self) -> int | None:
        """A uid of the instance's own (None: the backend's user)."""
        return None

    def _release_uid(self, uid: int) -> None:
        """Give back a uid of ``_acquire_uid``."""

    def _argv(
        self, spec: common_pb2.FunctionSpec, private_dir: Path, cwd: str, uid: int | None
    ) -> tuple[list[str], tuple[int, ...]]:
        """The command line that runs spec's command, and the fds it needs
        (closed by the caller once the child has them); a sandboxing backend
        wraps the command here."""
        command = resolve(spec.command[0], os.environ.get("PATH", os.defpath))
        return [*self._prefix, command, *spec.command[1:]], ()

    def _open_logs(self, node_id: str, instance_id: str) -> tuple[BinaryIO, BinaryIO]:
        # Synchronous on purpose: creating two local files takes microseconds,
        # less than a hop to a worker thread would.
        node_dir = self.log_dir / log_name(node_id)
        node_dir.mkdir(parents=True, exist_ok=True)
        stem = log_name(instance_id)
        out = open(node_dir / f"{stem}.out", "wb")
        try:
            return out, open(node_dir / f"{stem}.err", "wb")
        except BaseException:
            out.close()
            raise

    async def start(
        self,
        node_id: str,
        instance_id: str,
        spec: common_pb2.FunctionSpec,
        on_exit: ExitCallback | None = None,
    ) -> ProcessSandbox:
        if not spec.command:
            raise Unavailable(f"function {spec.name} has no command to run")
        port = free_port(self.host, {sb.port for sb in self._live})
        uid = self._acquire_uid()
        try:
            return await self._start(node_id, instance_id, spec, on_exit, port, uid)
        except BaseException:
            if uid is not None:
                self._release_uid(uid)
            raise

    async def _start(
        self,
        node_id: str,
        instance_id: str,
        spec: common_pb2.FunctionSpec,
        on_exit: ExitCallback | None,
        port: int,
        uid: int | None,
    ) -> ProcessSandbox:
        owner = None if uid is None else (uid, uid)
        try:
            private_dir = self.dirs.create(instance_id, owner)
        except OSError as e:
            raise Unavailable(f"cannot make the directory of instance {instance_id}: {e}") from None
        env = self._env(node_id, instance_id, spec, port, private_dir)
        cwd = spec.workdir or str(private_dir)
        why = cannot_run(spec.command[0], env, cwd)
        if why is not None:
            self.dirs.remove(private_dir)
            raise Unavailable(f"cannot start instance {instance_id} of {spec.name}: {why}")
        group = None
        if self.cgroups is not None:
            res = spec.resources
            try:
                group = self.cgroups.create(instance_id, res.memory_mib)
            except CgroupError as e:
                self.dirs.remove(private_dir)
                raise Unavailable(f"cannot start instance {instance_id}: {e}") from None
        try:
            argv, fds = self._argv(spec, private_dir, cwd, uid)
        except Unavailable:
            if group is not None:
                group.remove()
            self.dirs.remove(private_dir)
            raise
        if group is not None:
            argv = [*group.launcher(), *argv]
        out, err = self._open_logs(node_id, instance_id)
        stderr_path = Path(err.name)
        with out, err, _closing(fds):
            try:
                # CPython's Popen, not the event loop's subprocess support:
                # uvloop runs Python code (PyOS_AfterFork_Child) in the forked
                # child, which crashes now and then (SIGSEGV before exec) in a
                # multi-threaded process like this gRPC server. Popen forks and
                # execs in C. It blocks for the fork+exec only (~1 ms).
                proc = subprocess.Popen(  # noqa: ASYNC220 (see above)
                    argv,
                    # Nothing of the agent's: stdin is /dev/null (never its
                    # lifeline pipe), and every fd but 0-2 is closed (gRPC
                    # sockets, logs), whatever its inheritable flag says.
                    stdin=subprocess.DEVNULL,
                    stdout=out,
                    stderr=err,
                    close_fds=True,
                    pass_fds=fds,
                    env=env,
                    cwd=cwd,
                    start_new_session=True,  # own process group: stop kills the whole tree
                )
            except (OSError, subprocess.SubprocessError) as e:
                if group is not None:
                    group.remove()
                self.dirs.remove(private_dir)
                raise Unavailable(
                    f"cannot run {short(spec.command[0])} for instance {instance_id}: {e}"
                ) from None
        sb = ProcessSandbox(
            self, node_id, instance_id, proc, port, stderr_path, on_exit,
            group, spec.resources.memory_mib, private_dir, uid,
        )  # fmt: skip
        self._live.add(sb)
        timeout_ms = spec.startup_timeout_ms or self.startup_timeout_ms
        path = spec.readiness_path
        if path and not path.startswith("/"):
            path = "/" + path
        try:
            await self._attach(sb)
            await sb.wait_ready(timeout_ms / 1000, path)
            await self._admit(sb)
            if group is not None:
                group.limit_cpu(spec.resources.cpu_millis)
        except BaseException as e:
            # Failed or cancelled start: nothing may be left running.
            await sb.stop(grace_s=0)
            if isinstance(e, CgroupError):
                raise Unavailable(f"instance {instance_id}: {e}") from None
            raise
        return sb

    async def close(self) -> None:
        await asyncio.gather(*(sb.stop() for sb in list(self._live)))
        if self.cgroups is not None:
            self.cgroups.close()
        await asyncio.to_thread(self.dirs.close)
