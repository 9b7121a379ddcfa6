"""The bubblewrap sandbox backend (the default): each instance is a process
sandbox run through ``bwrap`` (bubblewrap, Flatpak's sandbox; docs/security.md
says why this tool and what it costs).

Each instance gets its own mount, PID, IPC, UTS and cgroup namespaces,
``no_new_privs``, no capabilities, the seccomp filter of
``sandbox.seccomp``, and a filesystem of its own: the interpreter it runs and
its libraries read-only, its artifact (and any other existing absolute path
of its command line) read-only, its private directory read-write, a private
``/tmp``, a minimal ``/dev`` and a ``/proc`` of its own PID namespace.

Network: each instance gets a network namespace of its own (loopback only;
it listens there) and the node's entry (``controlplane.nodeagent.entry``)
listens for it on the node's address, admitting only requests with a lease
Dispatch signed for it. The entry's connections into the namespace are made
by ``setns(2)`` when the agent is root (``entry="setns"``), and otherwise by
a socket factory started in the sandbox next to the function
(``entry="factory"``; ``entry.sockfactory``), which needs no privilege.
With setns, admitted connections may also be routed (``entry.routing``).

Users: a root agent gives each instance its own uid from a ``UidPool``. The
namespaces are then set up by bwrap as root (a source path such as an
interpreter under ``/root`` must be reachable, which an unprivileged bwrap
could not do) and util-linux ``setpriv`` inside switches to the instance's
uid, clears every capability set and sets ``no_new_privs`` before the
command runs. An agent that is not root (the Kubernetes-shaped configuration)
runs bwrap unprivileged, which adds a user namespace with the agent's uid and
no capabilities; every instance then shares that uid.
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import shlex
import shutil
import sys
import time
from pathlib import Path
from typing import Any

from controlplane.nodeagent.entry import kvrelay, netns, sockfactory
from controlplane.nodeagent.entry.door import Door
from controlplane.nodeagent.entry.kvroute import KvRoutes, Member
from controlplane.nodeagent.entry.limits import EntryLimits
from controlplane.nodeagent.entry.routing import Routes
from controlplane.nodeagent.entry.sockclient import FactoryDialer
from controlplane.nodeagent.sandbox import egress, egressdeny, seccomp
from controlplane.nodeagent.sandbox.base import ExitCallback
from controlplane.nodeagent.sandbox.launch import instance_user, pdeathsig_prefix, resolve
from controlplane.nodeagent.sandbox.ports import instance_ports
from controlplane.nodeagent.sandbox.process import ProcessBackend, ProcessSandbox
from controlplane.nodeagent.sandbox.uidpool import UidPool, UidPoolExhausted
from controlplane.runtime import models, revisions
from controlplane.runtime.errors import Unavailable
from controlplane.runtime.leasetoken import LeaseKey
from controlplane.runtime.netaddr import join_host_port
from galaxy.v1 import common_pb2

log = logging.getLogger(__name__)
_INFO_TIMEOUT_S = 10.0

# Top-level paths of the system's programs and libraries; on a merged-/usr
# system all but /usr are symlinks, recreated as such.
_SYSTEM = ("/usr", "/bin", "/sbin", "/lib", "/lib32", "/lib64", "/libx32")
# What programs read from /etc: the loader's cache, time zone, name service,
# TLS roots, and Debian's alternatives (/usr/bin/python3 may point there).
# Not passwd or shadow, not the host's other configuration.
_ETC = (
    "/etc/ld.so.cache", "/etc/localtime", "/etc/hosts", "/etc/resolv.conf",
    "/etc/nsswitch.conf", "/etc/host.conf", "/etc/ssl", "/etc/ca-certificates",
    "/etc/alternatives", "/etc/mime.types",
)  # fmt: skip


def _bind(path: str, how: str = "--ro-bind") -> list[str]:
    """bwrap arguments that show path at the same place. Its parents are made
    first with ``--dir`` (mode 0755): the ones a bind would make itself are
    mode 0700, closed to an instance that is not root."""
    return ["--dir", os.path.dirname(path), how, path, path]


def _system_args() -> list[str]:
    args: list[str] = []
    for path in _SYSTEM:
        if os.path.islink(path):
            args += ["--symlink", os.readlink(path), path]
        elif os.path.isdir(path):
            args += _bind(path)
    for path in _ETC:
        if os.path.exists(path):
            args += _bind(path)
    return args


#: /sys's CPU and NUMA topology, shown read-only in every sandbox, and the
#: transparent huge page settings: glibc's ``malloc.hugetlb=1`` tunable reads
#: them and does nothing without (the real LLM runtime builds a woken
#: instance's KV cache in huge pages: 2.2-2.8x less CPU per wake, docs/llm.md)
_CPUS, _NODES = "/sys/devices/system/cpu", "/sys/devices/system/node"
_THP = "/sys/kernel/mm/transparent_hugepage"
_SYS_DIRS = ("/sys", "/sys/devices", "/sys/devices/system", "/sys/kernel", "/sys/kernel/mm")


def _shown(path: str) -> bool:
    """Already visible through the system paths."""
    return any(path == s or path.startswith(s + "/") for s in _SYSTEM)


def runtime_roots(executable: str) -> list[str]:
    """The directories the sandbox must show for executable to run: the
    prefix it lives in (``PREFIX/bin/x`` -> ``PREFIX``) for its own path and
    for where its symlinks lead (a virtualenv's python leads to the base
    interpreter's prefix, where the standard library is)."""
    roots: list[str] = []
    for path in (os.path.abspath(executable), os.path.realpath(executable)):
        parent = os.path.dirname(path)
        root = os.path.dirname(parent) if os.path.basename(parent) == "bin" else parent
        if root != "/" and not _shown(root) and root not in roots:
            roots.append(root)
    return roots


class BwrapBackend(ProcessBackend):
    """The process backend with every instance in a bubblewrap sandbox.

    uid_pool: where a root agent takes each instance's uid (default: a new
    ``UidPool``; ignored when ``user`` names a fixed user or the agent is not
    root). lease_key: what the entry checks callers' leases with (None: it
    admits every request); entry_limits: the bounds its doors share. entry:
    how it reaches into an instance's network namespace, ``setns`` (root
    only) or ``factory`` (default: setns for a root agent); routes: routed
    entries (setns only). allow_egress: whether an instance whose spec asks
    for an outbound network gets one (``sandbox/egress.py``; False refuses
    such starts); egress_deny: the networks it may not reach
    (``egressdeny.parse``; default ``egressdeny.DEFAULT``). Others: ProcessBackend's.
    """

    kind = "bwrap"

    def __init__(
        self,
        uid_pool: UidPool | None = None,
        lease_key: LeaseKey | None = None,
        entry: str | None = None,
        allow_egress: bool = True,
        egress_deny: tuple[str, ...] | None = None,
        entry_limits: EntryLimits | None = None,
        routes: Routes | None = None,
        **opts: Any,
    ) -> None:
        bwrap = shutil.which("bwrap")
        if bwrap is None:
            raise ValueError(
                "--sandbox bwrap: bubblewrap (`bwrap`) is not installed on this node "
                "(Debian: apt-get install bubblewrap); --sandbox process runs instances "
                "without any isolation"
            )
        super().__init__(**opts)
        # The user switch happens inside the sandbox, not before bwrap.
        self._prefix = pdeathsig_prefix()
        self._root = os.geteuid() == 0
        if entry is None:
            entry = "setns" if netns.can_enter() else "factory"
        if entry not in ("setns", "factory") or (entry == "setns" and not netns.can_enter()):
            raise ValueError(f"entry: setns (a root agent) or factory, got {entry!r}")
        #: How the entry's connections reach an instance's namespace.
        self.entry = entry
        #: Instances get a network namespace of their own (and the entry).
        self.own_netns = True
        self.lease_key = lease_key
        if self.own_netns and lease_key is None:
            log.warning(
                "no lease key (lease.key in the TLS directory): the node's entry lets "
                "every request into an instance"
            )
        #: Carries KV caches between instances (disaggregated LLM serving).
        self.kv_relay = kvrelay.KvRelay(
            KvRoutes(lease_key, instance_ports(), lambda: time.time_ns() // 1_000_000)
        )
        self._kv_members: dict[str, Member] = {}  # started, not yet attached
        self._info: int | None = None  # read end of the last --info-fd pipe
        # Egress (spec.egress): slirp4netns, the write end of the last start's
        # --block-fd pipe (the function waits on it), the stacks by instance.
        self._slirp = egress.find()
        self._egress_on = allow_egress
        self._deny = egressdeny.parse(egressdeny.DEFAULT) if egress_deny is None else egress_deny
        self.limits = EntryLimits() if entry_limits is None else entry_limits
        self.routes = routes if entry == "setns" else None  # (needs setns: a root agent)
        # (a dlopen: checked once, where the list is not empty)
        self._no_deny = egressdeny.unusable() if self._deny else None
        why = (egress.unusable(self._slirp) or self._no_deny) if allow_egress else None
        if why is not None:  # said at start, not first at a tenant's cold start
            log.warning("egress: instances whose spec sets it will be refused here: %s", why)
        self._block: int | None = None
        self._egress: dict[str, egress.Egress] = {}
        self._resolv = self.log_dir / "egress-resolv.conf"
        self._fixed_uid: int | None = None
        if self.user is not None:
            self._fixed_uid = instance_user(self.user).pw_uid
        self.uid_pool: UidPool | None = None
        if self._root and self._fixed_uid is None:
            self.uid_pool = uid_pool or UidPool()
        self._setpriv = shutil.which("setpriv")
        if (self._root or entry == "factory") and self._setpriv is None:
            raise ValueError(
                "--sandbox bwrap: util-linux `setpriv` is needed (a root agent's user switch, "
                "the socket factory's parent-death signal)"
            )
        self._system = _system_args()
        env = shutil.which("env") or "/usr/bin/env"
        # SIGTERM (stop's polite request, sent to the process group) is for
        # the function: bwrap ignores it, so the function may drain and exit
        # (bwrap then exits with its status), and the function gets the
        # default disposition back. SIGKILL still ends bwrap, and with it the
        # sandbox (--die-with-parent). Ignored signals survive exec, hence
        # coreutils env on both sides.
        self._outer = [*self._prefix, env, "--ignore-signal=TERM", bwrap]
        self._inner = [env, "--default-signal=TERM", "--"]
        self.log_dir.mkdir(parents=True, exist_ok=True)
        self._bpf = seccomp.write_bpf(self.log_dir)
        self._resolv.write_text(egress.resolv_conf())
        # The socket factory runs on the agent's own interpreter, shown
        # read-only in the sandbox like a function's.
        self._factory_binds: list[str] = []
        if entry == "factory":
            for root in runtime_roots(sys.executable):
                self._factory_binds += _bind(root)
            self._factory_binds += _bind(sockfactory.__file__)

    def _acquire_uid(self) -> int | None:
        if self.uid_pool is None:
            return None  # a fixed --instance-user, or the agent's own user
        try:
            return self.uid_pool.acquire()
        except UidPoolExhausted as e:
            raise Unavailable(f"no user id for a new instance: {e}") from None

    def _release_uid(self, uid: int) -> None:
        if self.uid_pool is not None:
            self.uid_pool.release(uid)

    def _argv(
        self, spec: common_pb2.FunctionSpec, private_dir: Path, cwd: str, uid: int | None
    ) -> tuple[list[str], tuple[int, ...]]:
        why = (egress.unusable(self._slirp) or self._no_deny) if spec.egress else None
        if spec.egress and not self._egress_on:
            why = "the node's operator turned it off (--no-instance-egress)"
        if why is not None:
            egress.STARTS.labels("refused").inc()
            raise Unavailable(f"egress: this node cannot give an instance a way out: {why}")
        command = list(spec.command)
        command[0] = resolve(command[0], os.environ.get("PATH", os.defpath))
        binds: list[str] = []
        seen: set[str] = set()
        for root in runtime_roots(command[0]):
            binds += _bind(root)
        # The artifact (and model) are absolute paths on the command line;
        # each existing one is shown read-only, nothing around it. The model
        # is also named by $GALAXY_MODEL_PATH (the node's model cache).
        model = spec.env.get(models.ENV_PATH, "")
        for arg in [*command[1:], *([model] if model else [])]:
            if os.path.isabs(arg) and os.path.exists(arg) and not _shown(arg) and arg not in seen:
                seen.add(arg)
                binds += _bind(arg)
        if spec.workdir:
            if os.path.realpath(spec.workdir) == "/":
                raise Unavailable("workdir: / cannot be shown in a sandbox; name a directory")
            binds += _bind(os.path.abspath(spec.workdir))
        fd = os.open(self._bpf, os.O_RDONLY | os.O_CLOEXEC)
        os.set_inheritable(fd, True)
        mem = ["--size", str(spec.resources.memory_mib << 20)] if spec.resources.memory_mib else []
        argv = [
            *self._outer,
            "--die-with-parent",  # the agent's parent-death signal reaches the instance
            "--unshare-pid", "--unshare-ipc", "--unshare-uts", "--unshare-cgroup-try",
            "--hostname", "galaxy",
            *self._system,
            # Memory: the tmpfs's own size bounds it where no cgroup counts it.
            "--proc", "/proc", "--dev", "/dev", *mem, "--tmpfs", "/tmp",
            # POSIX shared memory (shm_open) for the instance's processes, any uid's
            # (vLLM's engine and worker talk through it; bwrap's is root's, 0755).
            "--perms", "1777", *mem, "--tmpfs", "/dev/shm",
            # The CPU and NUMA topology, read-only (what lscpu reads; vLLM's
            # CPU backend binds its threads by it): the same facts as
            # /proc/cpuinfo; the huge page settings (_THP); nothing else of /sys.
            # bwrap makes the directories above a bind 0700: the instance's
            # uid must be able to walk down to them.
            *[a for d in _SYS_DIRS for a in ("--perms", "0755", "--dir", d)],
            "--ro-bind-try", _CPUS, _CPUS, "--ro-bind-try", _NODES, _NODES,
            "--ro-bind-try", _THP, _THP,
            # After /dev, /dev/shm and /tmp: a model in the memory tier lies
            # under /dev/shm, a default instance root under /tmp.
            *binds,
            *_bind(str(private_dir), "--bind"),
            *kvrelay.bwrap_args(self._kv_dir(private_dir, uid)),
            "--chdir", cwd,
            "--seccomp", str(fd),
        ]  # fmt: skip
        fds: tuple[int, ...] = (fd,)
        argv.append("--unshare-net")
        inner = self._inner
        if self.entry == "setns" or spec.egress:
            # bwrap reports the sandbox's pid (whose namespace the entry
            # enters, and egress configures) on this pipe; read in _attach.
            r, w = os.pipe2(os.O_CLOEXEC)
            os.set_inheritable(w, True)
            if self._info is not None:  # a start that failed before its process ran
                os.close(self._info)
            self._info = r
            fds = (*fds, w)
            argv += ["--info-fd", str(w)]
        if spec.egress:
            # The function waits until its network is up (_attach writes).
            r, w = os.pipe2(os.O_CLOEXEC)
            os.set_inheritable(r, True)
            if self._block is not None:
                os.close(self._block)
            self._block = w
            fds = (*fds, r)
            argv += ["--block-fd", str(r)]
            # Names through slirp4netns's forwarder (over the node's file).
            argv += ["--dir", "/etc", "--ro-bind", str(self._resolv), "/etc/resolv.conf"]
        if self.entry != "setns":
            argv += self._factory_binds
            inner = [*self._factory_prefix(private_dir), *inner]
        if not self._root:
            argv += ["--unshare-user", "--disable-userns", "--cap-drop", "ALL", "--"]
            return [*argv, *inner, *command], fds
        assert self._setpriv is not None
        gid = uid
        if uid is None:  # a fixed --instance-user
            pw = instance_user(str(self.user))
            uid, gid = pw.pw_uid, pw.pw_gid
        argv += [
            "--", self._setpriv, f"--reuid={uid}", f"--regid={gid}", "--clear-groups",
            "--inh-caps=-all", "--bounding-set=-all", "--no-new-privs", "--",
        ]  # fmt: skip
        return [*argv, *inner, *command], fds

    def _env(
        self,
        node_id: str,
        instance_id: str,
        spec: common_pb2.FunctionSpec,
        port: int,
        private_dir: Path | None = None,
    ) -> dict[str, str]:
        env = super()._env(node_id, instance_id, spec, port, private_dir)
        env[kvrelay.ENV] = kvrelay.SOCKET
        function, _ = revisions.split(spec.name)
        address = join_host_port(self.host, port)
        self._kv_members[instance_id] = Member(
            instance_id, spec.namespace, function, spec.pd.prefill, address
        )
        return env

    @staticmethod
    def _kv_path(private_dir: Path) -> Path:
        # "+" is never in an instance directory's name (workdirs' _SAFE).
        return private_dir.with_name(private_dir.name + "+kv")

    def _kv_dir(self, private_dir: Path, uid: int | None) -> Path:
        """The instance's KV relay directory, made now, the instance's own."""
        owner = None
        if uid is not None:
            owner = (uid, uid)
        elif self._fixed_uid is not None and self._root:
            pw = instance_user(str(self.user))
            owner = (pw.pw_uid, pw.pw_gid)
        path = self._kv_path(private_dir)
        self.kv_relay.prepare(path, owner)
        return path

    async def _start(
        self,
        node_id: str,
        instance_id: str,
        spec: common_pb2.FunctionSpec,
        on_exit: ExitCallback | None,
        port: int,
        uid: int | None,
    ) -> ProcessSandbox:
        try:
            return await super()._start(node_id, instance_id, spec, on_exit, port, uid)
        except BaseException:
            self._kv_members.pop(instance_id, None)
            self.kv_relay.close(instance_id)
            raise

    def _factory_prefix(self, private_dir: Path) -> list[str]:
        """A shell that starts the socket factory in the background, bound
        to die with the function (bubblewrap's init waits for every process
        of the sandbox, so a factory left behind would keep it alive), then
        execs the function."""
        assert self._setpriv is not None  # checked at start
        script = (
            f"{shlex.quote(self._setpriv)} --pdeathsig KILL {shlex.quote(sys.executable)} -I -S "
            f"{shlex.quote(sockfactory.__file__)} {shlex.quote(str(private_dir))} "
            '</dev/null >/dev/null 2>&1 & exec "$@"'
        )
        return ["/bin/sh", "-c", script, "sh"]

    @property
    def inner_host(self) -> str:
        return "127.0.0.1"

    async def _attach(self, sb: ProcessSandbox) -> None:
        info, self._info = self._info, None
        block, self._block = self._block, None
        try:
            pid = None if info is None else await _child_pid(info, sb.instance_id)
        except BaseException:
            if block is not None:
                os.close(block)  # (the sandbox is killed: nothing waits on it)
            raise
        if block is not None:
            await self._start_egress(sb, pid, block)
        dialer: netns.NetnsDialer | FactoryDialer
        if self.entry == "factory":
            assert sb.private_dir is not None  # every bwrap instance has one
            dialer = FactoryDialer(str(sb.private_dir))
        else:
            if pid is None:
                return
            dialer = netns.NetnsDialer(pid)
        sb.dial = dialer.socket if isinstance(dialer, FactoryDialer) else dialer.dial
        sb.entry = Door(sb.instance_id, sb.port, self.lease_key, sb.dial, dialer.close, self.limits)
        if self.routes is not None and pid is not None:
            self.routes.begin(sb.entry, pid)
        member = self._kv_members.pop(sb.instance_id, None)
        if member is not None and sb.private_dir is not None:
            unix = dialer.unix_socket if isinstance(dialer, netns.NetnsDialer) else None
            try:
                self.kv_relay.open(member, self._kv_path(sb.private_dir), unix)
            except OSError as e:
                raise Unavailable(f"instance {sb.instance_id}: no KV relay socket: {e}") from None

    async def _start_egress(self, sb: ProcessSandbox, pid: int | None, block: int) -> None:
        assert pid is not None and self._slirp is not None  # (_argv saw to both)
        prefix = [*(sb.group.launcher() if sb.group is not None else []), *self._prefix]
        log = sb.stderr_path.with_name(sb.stderr_path.stem + ".egress")
        self._egress[sb.instance_id] = await egress.start_then_release(
            egress.Stack(self._slirp, pid, sb.instance_id, prefix, not self._root, log, self._deny),
            block,
            sb.pid or 0,
        )

    async def _admit(self, sb: ProcessSandbox) -> None:
        if self.routes is not None:
            await self.routes.ready(sb.instance_id)
        if sb.entry is not None:
            try:
                await sb.entry.open(self.host, sb.port)
            except OSError as e:
                why = f"the entry cannot listen on port {sb.port}: {e}"
                raise Unavailable(f"instance {sb.instance_id}: {why}") from None

    async def _detach(self, sb: ProcessSandbox) -> None:
        self.kv_relay.close(sb.instance_id)
        if self.routes is not None:
            self.routes.close(sb.instance_id)
        stack = self._egress.pop(sb.instance_id, None)
        if stack is not None:
            await stack.stop()
        if sb.entry is not None:
            await sb.entry.close()

    async def close(self) -> None:
        await self.kv_relay.close_all()
        await super().close()
        if self.uid_pool is not None:
            self.uid_pool.close()
        self._bpf.unlink(missing_ok=True)
        self._resolv.unlink(missing_ok=True)


async def _child_pid(info: int, instance_id: str) -> int:
    """The sandbox's pid from bwrap's --info-fd JSON (read to its end, which
    comes once bwrap has set the sandbox up, or when it fails)."""
    loop = asyncio.get_running_loop()
    reader = asyncio.StreamReader()
    transport, _ = await loop.connect_read_pipe(
        lambda: asyncio.StreamReaderProtocol(reader), os.fdopen(info, "rb", buffering=0)
    )
    try:
        async with asyncio.timeout(_INFO_TIMEOUT_S):
            data = await reader.read()
    except TimeoutError:
        data = b""
    finally:
        transport.close()
    try:
        return int(json.loads(data)["child-pid"])
    except (ValueError, KeyError, TypeError):
        raise Unavailable(
            f"instance {instance_id}: bubblewrap did not set up its sandbox"
        ) from None
