"""Egress for an instance in a network namespace of its own.

A sandboxed instance's namespace has only its loopback: it reaches nothing
but itself. A function whose spec asks for ``egress`` gets an outbound path
through slirp4netns (the user-mode network stack rootless Podman uses, from
Debian's ``slirp4netns``): it makes a tap device in the instance's namespace
and turns the instance's connections into ordinary sockets of the node, made
by the slirp4netns process itself. So the instance reaches what any process
of the node reaches, except the node's own loopback (``--disable-host-
loopback``: the control plane, etcd and the agents' local ports stay out of
reach), and it is never reachable from outside through it: slirp4netns
forwards no port in, so the door stays the only way in.

slirp4netns runs as the agent's user (an agent that is not root has it
enter the user namespace that owns the sandbox's network namespace first,
``--userns-path``), in the instance's cgroup
(its CPU and memory are the instance's), and dies with the agent
(parent-death signal) or when the instance ends (``stop``). The sandbox
waits for it: bubblewrap holds the function back (``--block-fd``) until the
tap is configured, so the function's first connection finds the network up.
Its /etc/resolv.conf names slirp4netns's DNS forwarder (``resolv_conf``).
"""

from __future__ import annotations

import asyncio
import contextlib
import fcntl
import os
import shutil
import signal
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

from prometheus_client import Counter

from controlplane.nodeagent.sandbox import egressdeny
from controlplane.nodeagent.sandbox.process import log_tail
from controlplane.runtime.errors import Unavailable
from controlplane.runtime.procs import wait_exit

#: The tap device's name in the instance's namespace.
TAP = "tap0"
#: slirp4netns's own default; the instance's loopback-sized segments pass whole.
MTU = 65520
#: How long the stack may take to come up (it takes ~5 ms).
READY_TIMEOUT_S = 10.0
#: How long bubblewrap may take to set up the sandbox's loopback (~1 ms).
LOOPBACK_WITHIN_S = 10.0


#: slirp4netns's DNS forwarder: it sends a query on to the node's own
#: resolver, one on the node's loopback included (systemd-resolved's
#: 127.0.0.53), which the instance could not reach itself.
DNS = "10.0.2.3"
#: The device slirp4netns opens (as the agent's user) to make the tap.
TUN = "/dev/net/tun"


#: Starts of instances that asked for egress, by outcome: started, refused
#: (the node cannot or may not give it), failed (the stack or its deny list).
STARTS = Counter(
    "galaxy_instance_egress_starts_total",
    "Starts of function instances whose spec sets egress, by outcome",
    ["outcome"],
)


def find() -> str | None:
    """slirp4netns's path on this node (None: not installed)."""
    return shutil.which("slirp4netns")


def unusable(slirp: str | None) -> str | None:
    """Why this node cannot give an instance egress (None: it can)."""
    if slirp is None:
        return "slirp4netns is not installed (Debian: apt-get install slirp4netns)"
    if not os.access(TUN, os.R_OK | os.W_OK):
        return (
            f"{TUN} is not usable by the node agent's user (uid {os.geteuid()}): grant it "
            "(mode 0666, as distributions ship it; on Kubernetes a device plugin gives it "
            "to the agent's pod)"
        )
    return None


def resolv_conf(node: str = "/etc/resolv.conf") -> str:
    """An instance's /etc/resolv.conf: slirp4netns's forwarder, and the
    node's ``search``, ``domain`` and ``options`` lines (short names resolve
    as on the node)."""
    try:
        lines = Path(node).read_text().splitlines()
    except OSError:
        lines = []
    keep = [x for x in lines if x.split()[:1] in (["search"], ["domain"], ["options"])]
    return "\n".join([f"nameserver {DNS}", *keep]) + "\n"


@dataclass(frozen=True)
class Stack:
    """What starting one instance's slirp4netns takes."""

    #: slirp4netns's path
    slirp: str
    #: a process in the sandbox's network namespace (bubblewrap's child)
    pid: int
    instance_id: str
    #: the command prefix: cgroup join, parent-death signal
    prefix: list[str]
    #: enter the namespace's owning user namespace first (an agent that is not root)
    userns: bool
    #: slirp4netns's output, quoted when it fails
    log: Path
    #: networks the instance may not reach (``egressdeny.parse``)
    deny: tuple[str, ...] = ()


async def start_then_release(stack: Stack, block: int, sandbox: int) -> Egress:
    """Start the stack, then let the function run: bubblewrap holds it until
    a byte comes on block (closed here). On failure the function never runs:
    the sandbox's process group is killed before its wait ends."""
    try:
        started = await Egress.start(stack)
        os.write(block, b"1")
    except BaseException as e:
        if isinstance(e, Exception):  # (not a cancelled start)
            STARTS.labels("failed").inc()
        with contextlib.suppress(ProcessLookupError):
            os.killpg(sandbox, signal.SIGKILL)
        raise
    finally:
        os.close(block)
    STARTS.labels("started").inc()
    return started


class Egress:
    """The outbound network of one instance: its slirp4netns process."""

    def __init__(self, proc: subprocess.Popen[bytes]) -> None:
        self.proc = proc
        self._exited = asyncio.ensure_future(wait_exit(proc))

    @classmethod
    async def start(cls, stack: Stack) -> Egress:
        """Give the sandbox's network namespace a tap device and an outbound
        path; returns once it is configured."""
        pid, instance_id, log = stack.pid, stack.instance_id, stack.log
        owner = _netns_owner(pid, instance_id) if stack.userns else None
        try:
            # The deny list is in place before the tap exists. An agent that
            # must use a helper process (~15 ms) starts it beside the stack
            # (~5 ms); the function runs once both are done.
            deny = _deny(stack, owner) if stack.deny else None
        except BaseException:
            if owner is not None:
                os.close(owner)
            raise
        try:
            await _loopback_set(pid, instance_id)
        except BaseException:
            if owner is not None:
                os.close(owner)
            if deny is not None:
                await asyncio.shield(_ended(deny))
            raise
        r, w = os.pipe2(os.O_CLOEXEC)
        os.set_inheritable(w, True)
        argv = [
            *stack.prefix, stack.slirp, "--configure", f"--mtu={MTU}", "--disable-host-loopback",
            "--ready-fd", str(w),
            *(["--userns-path", f"/proc/self/fd/{owner}"] if owner is not None else []),
            str(pid), TAP,
        ]  # fmt: skip
        try:
            # A local file: microseconds, less than a hop to a worker thread.
            with open(log, "ab") as out:  # noqa: ASYNC230
                # CPython's Popen (fork+exec in C), as for the instance itself.
                proc = subprocess.Popen(  # noqa: ASYNC220 (~1 ms)
                    argv, stdin=subprocess.DEVNULL, stdout=out, stderr=out,
                    close_fds=True, start_new_session=True,
                    pass_fds=(w,) if owner is None else (w, owner),
                )  # fmt: skip
        except OSError as e:
            os.close(r)
            if deny is not None:
                await _ended(deny)
            raise Unavailable(f"instance {instance_id}: cannot start slirp4netns: {e}") from None
        finally:
            os.close(w)
            if owner is not None:
                os.close(owner)
        egress = cls(proc)
        ready, denied = b"", deny is None
        try:
            try:
                async with asyncio.timeout(READY_TIMEOUT_S):
                    ready = await _read_byte(r)
                    if deny is not None:
                        denied = await wait_exit(deny) == 0
            except TimeoutError:
                pass
        except BaseException:
            # A cancelled start: the stack is not the sandbox's (a session
            # of its own), so nothing else would end it.
            await asyncio.shield(egress.stop())
            raise
        finally:
            os.close(r)
            if deny is not None:
                await asyncio.shield(_ended(deny))
        if ready != b"1" or not denied:
            await egress.stop()
            tail = " ".join(log_tail(log, max_lines=5, max_bytes=300).split())
            what = "did not come up" if ready != b"1" else "could not deny its networks"
            raise Unavailable(
                f"instance {instance_id}: its outbound network (egress) {what}"
                f"{': ' + tail if tail else ''} (log: {log})"
            )
        return egress

    async def stop(self) -> None:
        """End the stack (the instance's connections out end with it)."""
        if self.proc.returncode is None:
            with contextlib.suppress(ProcessLookupError):
                self.proc.kill()
        await asyncio.shield(self._exited)


async def _loopback_set(pid: int, instance_id: str) -> None:
    """Return once the sandbox's loopback has its address.

    bubblewrap reports its child's pid before the child sets up the
    namespace's loopback (adds 127.0.0.1 with "must not exist", then brings
    lo up). slirp4netns --configure brings lo up first thing, and the kernel
    then gives lo 127.0.0.1 itself: were it first, bubblewrap's add would
    fail ("loopback: Failed RTM_NEWADDR") and the sandbox die. The address
    shows in the namespace's FIB, read from outside; nothing announces it,
    so it is polled, from 0.5 ms up (it is there within a few ms)."""
    loop = asyncio.get_running_loop()
    end = loop.time() + LOOPBACK_WITHIN_S
    pause = 0.0005
    while True:
        try:
            # A few hundred bytes of procfs: microseconds.
            with open(f"/proc/{pid}/net/fib_trie") as f:  # noqa: ASYNC230
                if "127.0.0.1" in f.read():
                    return
        except OSError as e:
            raise Unavailable(
                f"instance {instance_id}: its network namespace is gone: {e}"
            ) from None
        if loop.time() >= end:
            raise Unavailable(
                f"instance {instance_id}: its sandbox did not set up its loopback within "
                f"{LOOPBACK_WITHIN_S:g} s"
            )
        await asyncio.sleep(pause)
        pause = min(2 * pause, 0.01)


def _deny(stack: Stack, owner: int | None) -> subprocess.Popen[bytes] | None:
    """Load the deny list into the sandbox's network namespace
    (``egressdeny``): at once from this thread (a root agent, owner None), or
    by a helper process entering owner first, returned running (its errors
    go to the stack's log)."""
    try:
        net = os.open(f"/proc/{stack.pid}/ns/net", os.O_RDONLY | os.O_CLOEXEC)
    except OSError as e:
        raise Unavailable(
            f"instance {stack.instance_id}: its network namespace is gone: {e}"
        ) from None
    script = egressdeny.ruleset(stack.deny, egressdeny.has_ipv6())
    try:
        if owner is None:
            error = egressdeny.load(net, script)
            if error is not None:
                raise Unavailable(
                    f"instance {stack.instance_id}: its outbound network (egress) could not "
                    f"deny its networks: {' '.join(error.split())[:300]}"
                )
            return None
        fds = (net, owner)
        argv = [sys.executable, "-I", "-S", egressdeny.__file__, *map(str, fds)]
        try:
            with open(stack.log, "ab") as out:
                proc = subprocess.Popen(
                    argv, stdin=subprocess.PIPE, stdout=out, stderr=out, close_fds=True,
                    pass_fds=fds,
                )  # fmt: skip
        except OSError as e:
            raise Unavailable(
                f"instance {stack.instance_id}: cannot deny its networks: {e}"
            ) from None
    finally:
        os.close(net)
    assert proc.stdin is not None
    # At most MAX_ENTRIES short lines: within a pipe's buffer, so no wait.
    with proc.stdin:
        proc.stdin.write(script.encode())
    return proc


async def _ended(proc: subprocess.Popen[bytes]) -> None:
    """Kill proc if it still runs, and reap it."""
    if proc.returncode is None:
        with contextlib.suppress(ProcessLookupError):
            proc.kill()
        await wait_exit(proc)


#: ioctl(2) on a namespace's fd: the user namespace that owns it (linux/nsfs.h).
_NS_GET_USERNS = 0xB701


def _netns_owner(pid: int, instance_id: str) -> int:
    """An fd of the user namespace that owns pid's network namespace: the
    one slirp4netns must enter to configure it. Not pid's own user
    namespace: bubblewrap's ``--disable-userns`` runs the sandbox in a
    second one nested in it, which holds no right over the network."""
    try:
        net = os.open(f"/proc/{pid}/ns/net", os.O_RDONLY | os.O_CLOEXEC)
    except OSError as e:
        raise Unavailable(f"instance {instance_id}: its network namespace is gone: {e}") from None
    try:
        owner = fcntl.ioctl(net, _NS_GET_USERNS)
    except OSError as e:
        raise Unavailable(
            f"instance {instance_id}: cannot find the owner of its network namespace: {e}"
        ) from None
    finally:
        os.close(net)
    os.set_inheritable(owner, True)
    return owner


async def _read_byte(fd: int) -> bytes:
    """One byte from fd once readable (b"" at end of file)."""
    loop = asyncio.get_running_loop()
    got: asyncio.Future[bytes] = loop.create_future()

    def on_readable() -> None:
        if not got.done():
            try:
                got.set_result(os.read(fd, 1))
            except OSError:
                got.set_result(b"")

    loop.add_reader(fd, on_readable)
    try:
        return await got
    finally:
        loop.remove_reader(fd)
