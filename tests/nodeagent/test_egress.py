"""Egress (spec ``egress``) with real sandboxes, a real slirp4netns and a
real other host (a network namespace on a bridge): an instance that asks
for it reaches the other host but not the node's loopback nor a network of
its deny list (the default: clouds' metadata services), even from a socket
bound to its tap device; one that does not reaches nothing; the stack ends
with the instance; a node without slirp4netns refuses the start naming the
field."""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import shutil
import socket
import subprocess
import sys
import tempfile
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import pytest

from controlplane.nodeagent.sandbox import BwrapBackend
from controlplane.nodeagent.sandbox.uidpool import UidPool
from controlplane.runtime.errors import Unavailable
from tests.netns import Hosts, require_netns

from .conftest import cgroups_or_skip, child_pids, http, no_groups_left, py_spec
from .egress_probe import DNS_QUERY, PROBE, greeter, require_slirp

pytestmark = pytest.mark.skipif(shutil.which("bwrap") is None, reason="needs bubblewrap")


@pytest.fixture
def targets() -> Iterator[dict[str, str]]:
    """A greeter on another host, and one on this node's loopback."""
    require_netns()
    require_slirp()
    hosts = Hosts().create(1)
    procs = []
    try:
        far, far_at = greeter(hosts.exec_prefix(0), hosts.ip(0))
        procs.append(far)
        near, near_at = greeter([], "127.0.0.1")
        procs.append(near)
        # The node's own address on the bridge: not its loopback.
        node, node_at = greeter([], hosts.control_ip)
        procs.append(node)
        # slirp4netns's name for the node's loopback (refused by
        # --disable-host-loopback), and the instance's own loopback.
        port = near_at.rsplit(":", 1)[1]
        yield {
            "other_host": far_at,
            "other_host_bound": f"dev:{far_at}",
            "node_address": node_at,
            "metadata": "169.254.169.254:80",
            "node_loopback": f"10.0.2.2:{port}",
            "own": f"127.0.0.1:{port}",
            "resolv": "file:/etc/resolv.conf",
            "dns": "dns:10.0.2.3:53",
        }
    finally:
        for p in procs:
            p.kill()
            p.wait()
        hosts.close()


@pytest.fixture
async def backend(tmp_path) -> AsyncIterator[BwrapBackend]:
    async with _backend(tmp_path) as b:
        yield b


@contextlib.asynccontextmanager
async def _backend(tmp_path: Path, **opts: object) -> AsyncIterator[BwrapBackend]:
    groups = cgroups_or_skip()
    b = BwrapBackend(
        log_dir=tmp_path / "logs",
        instance_dir=tmp_path / "inst",
        uid_pool=UidPool(lock_dir=tmp_path / "uids") if os.geteuid() == 0 else None,
        cgroups=groups,
        **opts,  # type: ignore[arg-type]
    )
    try:
        yield b
    finally:
        await b.close()
    no_groups_left(groups)


def _probe(targets: dict[str, str], egress: bool):  # type: ignore[no-untyped-def]
    spec = py_spec(PROBE, readiness_path="", egress=egress)
    spec.env["PROBE_TARGETS"] = ",".join(targets.values())
    return spec


def _node_resolver_answers() -> bool:
    """Whether the node's first resolver answers a query from the node
    itself (where none does, forwarding to it cannot be checked)."""
    try:
        conf = Path("/etc/resolv.conf").read_text().split()
        server = conf[conf.index("nameserver") + 1]
    except (OSError, ValueError, IndexError):
        return False
    family = socket.AF_INET6 if ":" in server else socket.AF_INET
    with socket.socket(family, socket.SOCK_DGRAM) as s:
        s.settimeout(2)
        try:
            s.sendto(DNS_QUERY, (server, 53))
            return s.recv(512)[:2] == DNS_QUERY[:2]
        except OSError:
            return False


def _starts(outcome: str) -> float:
    """galaxy_instance_egress_starts_total{outcome} so far."""
    from prometheus_client import REGISTRY

    got = REGISTRY.get_sample_value("galaxy_instance_egress_starts_total", {"outcome": outcome})
    return got or 0.0


def _cgroup(pid: int) -> str:
    return Path(f"/proc/{pid}/cgroup").read_text()


def _stacks() -> set[int]:
    """pids of this process's slirp4netns children."""
    out = set()
    for pid in child_pids():
        try:
            with open(f"/proc/{pid}/comm") as f:
                if f.read().strip() == "slirp4netns":
                    out.add(pid)
        except OSError:
            continue  # gone meanwhile
    return out


async def test_an_instance_with_egress_reaches_another_host_but_not_the_nodes_loopback(
    backend, targets
) -> None:
    started = _starts("started")
    sb = await backend.start("n-0", "out-1", _probe(targets, egress=True))
    assert _starts("started") == started + 1  # counted for the operator
    try:
        (stack,) = _stacks()
        # In the instance's cgroup: its CPU and memory are the instance's.
        assert _cgroup(stack) == _cgroup(sb.pid)
        status, body = await http(sb.address, "GET", "/")
        assert status == 200
        got = json.loads(body)
        far = targets["other_host"]
        assert got[far] == f"ok:hello from {far.rsplit(':', 1)[0]}"
        assert got[targets["other_host_bound"]] == got[far]
        assert got[targets["node_address"]].startswith("ok:hello from ")
        assert not got[targets["node_loopback"]].startswith("ok:")
        # The default deny list: refused at once (EHOSTUNREACH), not timed out.
        assert got[targets["metadata"]] == "OSError", got
        assert got[targets["own"]] == "ConnectionRefusedError"  # its own loopback
        # Names go to slirp4netns's forwarder, which asks the node's resolver.
        assert got[targets["resolv"]].startswith("ok:nameserver 10.0.2.3\n")
        if _node_resolver_answers():
            assert got[targets["dns"]] == "ok:answered", got
    finally:
        await sb.stop()
    assert _stacks() == set()  # the stack ended with the instance


async def test_a_denied_network_is_refused_even_from_a_socket_bound_to_the_tap(
    targets, tmp_path
) -> None:
    far_ip = targets["other_host"].rsplit(":", 1)[0]
    async with _backend(tmp_path, egress_deny=(f"{far_ip}/32",)) as backend:
        # (the metadata service is not denied here: not asked, it would time out)
        asked = {k: v for k, v in targets.items() if k != "metadata"}
        sb = await backend.start("n-0", "deny-1", _probe(asked, egress=True))
        try:
            got = json.loads((await http(sb.address, "GET", "/"))[1])
        finally:
            await sb.stop()
    # A prohibit route would let the bound socket by; the namespace's
    # nftables rule does not.
    assert got[targets["other_host"]] == "OSError", got
    assert got[targets["other_host_bound"]] == "OSError", got
    assert got[targets["node_address"]].startswith("ok:hello from "), got  # not denied
    assert _stacks() == set()


async def test_a_start_whose_deny_list_fails_is_counted_and_leaves_nothing(
    backend, monkeypatch
) -> None:
    from controlplane.nodeagent.sandbox import egressdeny

    require_slirp()
    bad = "table inet t { nonsense }\n"
    monkeypatch.setattr(egressdeny, "ruleset", lambda nets, ipv6=True: bad)
    failed = _starts("failed")
    with pytest.raises(Unavailable, match=r"could not deny its networks: .*syntax error"):
        await backend.start("n-0", "bad-1", py_spec("pass", egress=True))
    assert _starts("failed") == failed + 1
    assert _stacks() == set()
    assert backend._egress == {}


async def test_an_instance_without_egress_reaches_nothing(backend, targets) -> None:
    sb = await backend.start("n-0", "in-1", _probe(targets, egress=False))
    try:
        assert _stacks() == set()
        got = json.loads((await http(sb.address, "GET", "/"))[1])
        assert got[targets["other_host"]] == "OSError"  # ENETUNREACH: no route
        assert got[targets["node_loopback"]] == "OSError"
    finally:
        await sb.stop()


async def test_a_node_without_slirp4netns_refuses_egress_naming_the_field(backend) -> None:
    backend._slirp = None  # as on a node where it is not installed
    refused = _starts("refused")
    with pytest.raises(Unavailable, match=r"^egress: .*slirp4netns is not installed \(Debian"):
        await backend.start("n-0", "out-2", py_spec("pass", egress=True))
    assert _starts("refused") == refused + 1
    assert not list((backend.log_dir).glob("*/out-2.*"))  # nothing was started


def _nobody_reason() -> str | None:
    from .delegation import SYSTEM_PYTHON, unprivileged

    if os.geteuid() != 0 or shutil.which("setpriv") is None:
        return "running an agent as another user needs root and setpriv"
    if unprivileged() is None:
        return "no user `nobody`"
    ver = subprocess.run(
        [SYSTEM_PYTHON, "-c", "import sys; print(sys.version_info[:2])"],
        capture_output=True,
        text=True,
    ).stdout.strip()
    if ver != str(tuple(sys.version_info[:2])):
        return f"the system's python3 is not Python {sys.version_info[:2]}"
    return None


@pytest.mark.slow  # an agent process as another user
def test_an_agent_that_is_not_root_gives_egress_through_the_sandboxs_user_namespace(
    targets, request
) -> None:
    from .delegation import SYSTEM_PYTHON, agent_env, as_nobody, unprivileged

    why = _nobody_reason()
    if why is not None:
        pytest.skip(why)
    user = unprivileged()
    assert user is not None
    # Not under tmp_path: its parents are root's, 0700.
    work = Path(tempfile.mkdtemp(prefix="galaxy-egress-agent-"))
    request.addfinalizer(lambda: shutil.rmtree(work, ignore_errors=True))
    tun = "/dev/net/tun"
    mode = os.stat(tun).st_mode & 0o777
    # slirp4netns opens the tun device as the agent's user: distributions
    # ship it 0666; where it is root's alone (0600 here), the test grants it
    # for its run and gives the mode back.
    os.chmod(tun, mode | 0o666)
    request.addfinalizer(lambda: os.chmod(tun, mode))
    os.chown(work, user.pw_uid, user.pw_gid)
    here = os.path.dirname(__file__)
    r = subprocess.run(
        [*as_nobody(user), SYSTEM_PYTHON, os.path.join(here, "egress_agent.py"), str(work),
         ",".join(targets.values())],
        capture_output=True, text=True, env=agent_env(work), cwd=work, timeout=60,
    )  # fmt: skip
    assert r.returncode == 0, r.stderr[-3000:]
    doc = json.loads(r.stdout.splitlines()[-1])
    assert doc["euid"] == user.pw_uid != 0 and doc["entry"] == "factory"
    far = targets["other_host"]
    assert doc["reached"][far] == f"ok:hello from {far.rsplit(':', 1)[0]}", doc
    assert not doc["reached"][targets["node_loopback"]].startswith("ok:"), doc
    # The deny list loaded from the sandbox's user namespace too.
    assert doc["reached"][targets["metadata"]] == "OSError", doc
    assert doc["reached"][targets["other_host_bound"]].startswith("ok:"), doc
    assert (doc["stacks"], doc["stacks_after"]) == (1, 0)


def test_what_a_node_lacks_for_egress_is_named(monkeypatch, tmp_path) -> None:
    from controlplane.nodeagent.sandbox import egress

    assert "slirp4netns is not installed" in (egress.unusable(None) or "")
    monkeypatch.setattr(egress, "TUN", str(tmp_path / "no-tun"))
    why = egress.unusable("/usr/bin/slirp4netns") or ""
    assert "no-tun is not usable by the node agent's user" in why and "0666" in why


def test_a_node_without_nftables_refuses_egress_unless_the_deny_list_is_empty(
    monkeypatch, tmp_path, caplog
) -> None:
    from controlplane.nodeagent.sandbox import egressdeny

    monkeypatch.setattr(egressdeny, "LIBRARY", "libnftables-missing.so.0")
    why = egressdeny.unusable() or ""
    assert "libnftables-missing.so.0) is not installed" in why and "nftables" in why
    assert "--instance-egress-deny ''" in why
    kept = BwrapBackend(log_dir=tmp_path / "a")
    assert kept._no_deny == why  # every egress start is refused with it
    said = [r.getMessage() for r in caplog.records if r.getMessage().startswith("egress:")]
    assert len(said) == 1 and "libnftables-missing" in said[0]  # at start, in the log
    caplog.clear()
    none = BwrapBackend(log_dir=tmp_path / "b", egress_deny=())
    assert none._no_deny is None
    assert not [r for r in caplog.records if r.getMessage().startswith("egress:")]


@pytest.mark.parametrize(
    ("helper", "words"),
    [
        # a root agent loads from its own thread: nft's own words
        (False, "syntax error"),
        # the helper process of an agent that is not root: here the
        # namespace's owner is this process's own user namespace, which
        # cannot be entered again
        (True, "setns: Invalid argument"),
    ],
)
async def test_a_deny_list_that_cannot_load_fails_the_start_in_its_words(
    netns_pid, tmp_path, monkeypatch, helper, words
) -> None:
    from controlplane.nodeagent.sandbox import egress, egressdeny

    slirp = egress.find()
    assert slirp is not None
    monkeypatch.setattr(
        egressdeny, "ruleset", lambda nets, ipv6=True: "table inet t { nonsense }\n"
    )
    log = tmp_path / "x-3.egress"
    stack = egress.Stack(slirp, netns_pid, "x-3", [], helper, log, ("10.0.0.0/8",))
    with pytest.raises(Unavailable) as e:
        await egress.Egress.start(stack)
    msg = e.value.message
    assert msg.startswith("instance x-3: its outbound network (egress) could not deny its networks")
    assert words in msg, msg
    assert _stacks() == set()


async def test_an_operator_can_turn_egress_off_and_the_refusal_names_the_flag(tmp_path) -> None:
    from controlplane.nodeagent.main import build

    from .test_main import parse

    assert parse().instance_egress is True
    comp = build(parse("--no-instance-egress", "--cgroups", "off", "--log-dir", str(tmp_path)))
    try:
        with pytest.raises(Unavailable, match=r"^egress: .*--no-instance-egress"):
            await comp.servicer.backend.start("n-0", "off-1", py_spec("pass", egress=True))
    finally:
        await comp.stop()


def _netns(setup: str) -> Iterator[int]:
    """A process in a network namespace of its own (what a sandbox is to
    slirp4netns), after a shell ran setup there."""
    require_slirp()
    if os.geteuid() != 0:
        pytest.skip("a network namespace of its own needs root here")
    # It says so once in its namespace: until then /proc/PID/ns/net is this
    # process's own, and what the test sets up there would land on the host.
    proc = subprocess.Popen(
        ["unshare", "--net", "sh", "-c", f"{setup}echo in; exec sleep 60"], stdout=subprocess.PIPE
    )
    try:
        assert proc.stdout is not None and proc.stdout.readline() == b"in\n"
        assert os.readlink(f"/proc/{proc.pid}/ns/net") != os.readlink("/proc/self/ns/net")
        yield proc.pid
    finally:
        proc.kill()
        proc.wait()


@pytest.fixture
def netns_pid() -> Iterator[int]:
    """A namespace whose loopback is up, as bubblewrap leaves a sandbox's."""
    yield from _netns("ip link set lo up && ")


@pytest.fixture
def bare_netns_pid() -> Iterator[int]:
    """A namespace as bubblewrap's child finds it: lo down, no address."""
    yield from _netns("")


@pytest.fixture
def gone_pid() -> int:
    """A pid that no longer exists."""
    gone = subprocess.Popen(["true"])
    gone.wait()
    return gone.pid


async def test_a_stack_that_cannot_come_up_is_reported_with_its_words(netns_pid, tmp_path) -> None:
    from controlplane.nodeagent.sandbox import egress

    slirp = egress.find()
    assert slirp is not None
    # The tap's name is taken (by a veth): slirp4netns cannot make it.
    taken = ["nsenter", "-t", str(netns_pid), "-n", "ip", "link", "add", egress.TAP]
    await asyncio.to_thread(
        subprocess.run, [*taken, "type", "veth", "peer", "name", "x0"], check=True
    )
    with pytest.raises(Unavailable) as e:
        await egress.Egress.start(
            egress.Stack(slirp, netns_pid, "x-1", [], False, tmp_path / "x-1.egress")
        )
    msg = e.value.message
    assert msg.startswith("instance x-1: its outbound network (egress) did not come up: ")
    assert "TUNSETIFF" in msg and "x-1.egress" in msg  # slirp4netns's own words, its log
    assert _stacks() == set()


async def test_a_sandbox_gone_before_its_stack_is_named(gone_pid, tmp_path) -> None:
    from controlplane.nodeagent.sandbox import egress

    slirp = egress.find()
    assert slirp is not None
    with pytest.raises(Unavailable) as e:
        await egress.Egress.start(
            egress.Stack(slirp, gone_pid, "x-1", [], False, tmp_path / "x-1.egress")
        )
    assert e.value.message.startswith("instance x-1: its network namespace is gone: ")
    assert _stacks() == set()


async def test_the_stack_waits_for_the_sandboxs_own_loopback(bare_netns_pid, tmp_path) -> None:
    """bubblewrap adds 127.0.0.1 to lo ("must not exist") after it reports
    its child's pid; slirp4netns brings lo up, which makes the kernel add
    that address first. The stack starts only once the address is there."""
    from controlplane.nodeagent.sandbox import egress

    slirp = egress.find()
    assert slirp is not None
    task = asyncio.create_task(
        egress.Egress.start(
            egress.Stack(slirp, bare_netns_pid, "x-4", [], False, tmp_path / "x-4.egress")
        )
    )
    await asyncio.sleep(0)  # one step: it waits, slirp4netns not started
    assert _stacks() == set()
    # What bubblewrap's loopback setup does (NLM_F_EXCL, like ip's add).
    add = ["nsenter", "-t", str(bare_netns_pid), "-n", "ip", "addr", "add", "127.0.0.1/8"]
    r = await asyncio.to_thread(subprocess.run, [*add, "dev", "lo"], capture_output=True, text=True)
    try:
        assert r.returncode == 0, r.stderr
        stack = await asyncio.wait_for(task, 30)
        assert len(_stacks()) == 1
        await stack.stop()
    finally:
        task.cancel()
        with contextlib.suppress(BaseException):
            await task
    assert _stacks() == set()


async def test_a_cancelled_start_leaves_no_stack(netns_pid, tmp_path) -> None:
    from controlplane.nodeagent.sandbox import egress

    slirp = egress.find()
    assert slirp is not None
    task = asyncio.create_task(
        egress.Egress.start(
            egress.Stack(slirp, netns_pid, "x-2", [], False, tmp_path / "x-2.egress")
        )
    )
    await asyncio.sleep(0)  # it has started slirp4netns and waits for it
    assert len(_stacks()) == 1
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert _stacks() == set()


@pytest.mark.parametrize("ipv6", [True, False])
def test_the_deny_list_loads_into_a_real_namespace_with_or_without_ipv6(netns_pid, ipv6) -> None:
    from controlplane.nodeagent.sandbox import egressdeny

    nets = egressdeny.parse(egressdeny.DEFAULT + ",10.9.0.0/16")
    home = os.readlink("/proc/thread-self/ns/net")
    net = os.open(f"/proc/{netns_pid}/ns/net", os.O_RDONLY)
    try:
        assert egressdeny.load(net, egressdeny.ruleset(nets, ipv6)) is None  # nft took it
        listed = subprocess.run(
            ["nsenter", f"--net=/proc/{netns_pid}/ns/net", "nft", "list", "ruleset"],
            capture_output=True, text=True, check=True,
        ).stdout  # fmt: skip
    finally:
        os.close(net)
    assert f"table {'inet' if ipv6 else 'ip'} {egressdeny.TABLE}" in listed
    assert "10.9.0.0/16" in listed and ("fd00:ec2::254" in listed) is ipv6
    # This thread came back to its own namespace, and nothing was loaded there.
    assert os.readlink("/proc/thread-self/ns/net") == home
    here = subprocess.run(["nft", "list", "tables"], capture_output=True, text=True).stdout
    assert egressdeny.TABLE not in here
