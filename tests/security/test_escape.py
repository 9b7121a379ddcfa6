"""The escape suite: a hostile function (tenant A's) under a real `galaxy up`
with default settings reports from inside its instance what it can reach;
every escape must fail, and its neighbour (tenant B's echo server, on the
same node) must keep answering.

What the probe reports is decided on the inside (tests/security/
hostile_server.py); the paths and pids it is asked about are the real ones of
this control plane, found from the outside.
"""

from __future__ import annotations

import ipaddress
import json
import os
import socket
import subprocess
import time
from pathlib import Path

import pytest

from controlplane.nodeagent.sandbox.bwrap import runtime_roots
from controlplane.nodeagent.sandbox.cgroups import CgroupError, open_cgroups
from controlplane.nodeagent.sandbox.launch import resolve
from tests.instances import descends_from
from tests.integration.upctl import REPO, GalaxyUp, pid_alive

pytestmark = pytest.mark.slow

HERE = Path(__file__).resolve().parent
HOSTILE = HERE / "hostile_server.py"
SECRET = "tenant-b-secret-7f3a"


def _environ(pid: int) -> dict[str, str]:
    try:
        with open(f"/proc/{pid}/environ", "rb") as f:
            raw = f.read()
    except OSError:
        return {}
    return dict(kv.decode(errors="replace").split("=", 1) for kv in raw.split(b"\0") if b"=" in kv)


def _uid(pid: int) -> int:
    with open(f"/proc/{pid}/status") as f:
        return int(next(line for line in f if line.startswith("Uid:")).split()[1])


def function_pid(name: str, artifact: str, under: list[int]) -> int:
    """The host pid of the function's own process (not bwrap's, whose
    environment is the same): the one running the artifact, below one of
    ``under`` (this control plane's processes: another test's cluster on
    the same host runs a function of the same name)."""
    for d in os.listdir("/proc"):
        if not d.isdigit():
            continue
        env = _environ(int(d))
        try:
            cmdline = Path(f"/proc/{d}/cmdline").read_bytes().split(b"\0")
        except OSError:
            continue
        if (
            env.get("GALAXY_FUNCTION") == name
            and cmdline[0].endswith(b"python3")
            and any(arg.endswith(artifact.encode()) for arg in cmdline)
            and any(descends_from(int(d), a) for a in under)
        ):
            return int(d)
    raise AssertionError(f"no process of {name} found")


def deploy_probe_and_victim(g: GalaxyUp, specs: Path) -> None:
    """Register the hostile runtime; deploy the probe (tenant A) and the
    victim (tenant B's echo server, with a secret in its env)."""
    rt = specs / "hostile-rt.yaml"
    rt.write_text(
        "name: hostile\ncommand: [python3, -u, '{artifact}']\n"
        f"artifact: {{required: true, prefixes: ['{HERE}'], suffixes: [.py]}}\n"
    )
    assert g.cli("runtimes", "apply", "-f", str(rt)).returncode == 0
    (specs / "probe.yaml").write_text(
        f"name: probe\nruntime: hostile\nartifact: {HOSTILE}\nreadiness_path: /healthz\n"
        # A fork loop at 250 millicores would take longer than a request
        # may; 1,024 processes (the default pids limit) need ~200 MiB of
        # kernel memory, charged to the instance.
        "resources: {cpu_millis: 2000, memory_mib: 512, disk_mib: 64}\nmax_scale: 1\n"
    )
    (specs / "victim.yaml").write_text(
        f"name: victim\nruntime: python\nartifact: {REPO / 'examples' / 'echo_server.py'}\n"
        f"env: {{APP_SECRET: {SECRET}}}\nreadiness_path: /healthz\nmax_scale: 1\n"
    )
    for name in ("probe", "victim"):
        r = g.cli("deploy", "-f", str(specs / f"{name}.yaml"))
        assert r.returncode == 0, r.stderr


@pytest.fixture(scope="module")
def up(tmp_path_factory):
    run = tmp_path_factory.mktemp("run")
    g = GalaxyUp(run, "--nodes", "1")
    g.start()
    deploy_probe_and_victim(g, tmp_path_factory.mktemp("specs"))
    yield g
    pids = g.pids()
    g.stop()
    assert not g.kill_leftovers(pids)


def invoke(up: GalaxyUp, name: str, path: str = "/", data: object = None):
    return up.cli("invoke", name, "--path", path, "--data", json.dumps(data or {}))


def _log_with(path: Path, text: str, timeout: float) -> str:
    """The log at path once it holds text, or as it is after timeout seconds."""
    deadline = time.monotonic() + timeout
    log = path.read_text()
    while text not in log and time.monotonic() < deadline:
        time.sleep(0.1)  # a file has no change event to await here
        log = path.read_text()
    return log


def body(r) -> dict:
    """The JSON reply of a `galaxy invoke` (after its "HTTP 200: ")."""
    assert r.returncode == 0, r.stderr
    line = next(x for x in r.stdout.splitlines() if x.startswith("HTTP "))
    status, _, text = line.partition(": ")
    assert status == "HTTP 200", line
    return json.loads(text)


@pytest.fixture(scope="module")
def victim(up):
    """Tenant B's instance: its host pid, uid and private directory (with a
    secret file in it)."""
    assert invoke(up, "victim").returncode == 0
    pid = function_pid("victim", "echo_server.py", up.pids())
    private = Path(_environ(pid)["GALAXY_INSTANCE_DIR"])
    secret = private / "secret.txt"
    secret.write_text(SECRET)
    os.chown(secret, _uid(pid), _uid(pid))
    return {"pid": pid, "uid": _uid(pid), "dir": private, "secret": secret}


@pytest.fixture(scope="module")
def report(up, victim):
    secrets = [str(p) for p in up.run_dir.rglob("*")] + [str(up.run_dir)]
    paths = [
        *secrets,
        str(victim["dir"]),
        str(victim["secret"]),
        *(f"/proc/{pid}/environ" for pid in [*up.pids(), victim["pid"]]),
        "/etc/shadow",
        "/root",
    ]
    port = int(_environ(victim["pid"])["PORT"])
    http = [f"http://{host}:{port}/" for host in {door_host(port), "127.0.0.1"}]
    # Past the veths of routed entries (a root agent's): the node's end of
    # the probe's own (a listener of the node on every address waits
    # there) and the neighbour's end, at its function's port.
    assert invoke(up, "probe", "/probe").returncode == 0  # started: its veth is there
    own = veth_address(function_pid("probe", "hostile_server.py", up.pids()))
    theirs = veth_address(victim["pid"])
    # And the node's loopback by way of the veth: a socket bound to it may
    # send to 127.0.0.1 there (route_localnet is on at both ends for the
    # entry's NAT); but for the guard the node takes it.
    with (
        socket.create_server(("0.0.0.0", 0)) as listener,
        socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as loopback,
    ):
        loopback.bind(("127.0.0.1", 0))
        veths, bound = [], []
        if own is not None and theirs is not None:
            node_end = str(ipaddress.IPv4Address(own) - 1)
            veths = [f"http://{node_end}:{listener.getsockname()[1]}/", f"http://{theirs}:{port}/"]
            bound = [
                f"|{node_end}:{listener.getsockname()[1]}",
                f"udp:eth0|127.0.0.1:{loopback.getsockname()[1]}",
            ]
        req = {"paths": paths, "http": [*http, *veths], "bound": bound}
        doc = body(invoke(up, "probe", "/probe", req))
        # Sent before the probe answered; a datagram the node took would be
        # in the socket's queue at once (a veth delivers in the sender's
        # softirq), so the bound only covers a loaded machine.
        loopback.settimeout(2 if bound else 0)
        try:
            doc["loopback_got"] = loopback.recv(64).decode(errors="replace")
        except (TimeoutError, BlockingIOError):
            doc["loopback_got"] = None
    doc["veth_urls"] = veths
    doc["bound_targets"] = bound
    return doc


def veth_address(pid: int) -> str | None:
    """The address of the routed entry's veth in pid's network namespace
    (None: the instance has none, its agent does not route)."""
    out = subprocess.run(
        ["nsenter", "-t", str(pid), "-n", "ip", "-4", "-o", "addr", "show", "dev", "eth0"],
        capture_output=True, text=True,
    ).stdout  # fmt: skip
    return out.split()[3].split("/")[0] if out.strip() else None


def door_host(port: int) -> str:
    """The address the node's entry listens on for the instance at port (the
    node's advertised address), read from the host's socket table."""
    for line in Path("/proc/net/tcp").read_text().splitlines()[1:]:
        local, state = line.split()[1], line.split()[3]
        ip, _, hexport = local.partition(":")
        if state == "0A" and int(hexport, 16) == port:
            return socket.inet_ntoa(bytes.fromhex(ip)[::-1])
    raise AssertionError(f"nothing listens on port {port}")


def test_no_direct_http_call_reaches_another_tenants_instance(report, victim):
    """From inside the hostile instance: the neighbour's port, without a
    lease, answers nothing but a refusal."""
    assert report["http"], report
    for url, outcome in report["http"].items():
        if url not in report["veth_urls"]:
            assert outcome in ("401", "403", "ConnectionRefusedError"), (url, outcome)


def test_the_veth_of_a_routed_entry_leads_nowhere(report):
    """From inside the hostile instance, over the veth its routed entry
    gave it: the node's end takes no connection, not even the kernel's
    handshake (the guard drops all but answers), and the neighbour's veth
    address is not reachable at all."""
    assert report["veth_urls"], "a root agent's instances have a veth (routed entries)"
    node_end, neighbour = report["veth_urls"]
    assert report["http"][node_end] in ("timeout", "TimeoutError"), report["http"]
    assert report["bound"][report["bound_targets"][0]] == "timeout", report["bound"]
    assert not report["http"][neighbour].isdigit(), report["http"]


def test_the_nodes_loopback_is_not_reachable_over_the_veth(report):
    """From inside the hostile instance, a socket bound to its veth sends to
    127.0.0.1: it leaves (the instance may), and the node's loopback never
    takes it."""
    assert report["veth_urls"], "a root agent's instances have a veth (routed entries)"
    assert report["bound"][report["bound_targets"][1]] == "sent", report["bound"]
    assert report["loopback_got"] is None, report["loopback_got"]


def test_from_the_node_an_instance_is_not_reachable_past_its_door(up, victim):
    """From the host (curl): the instance's own address on its veth takes no
    connection the entry did not route there."""
    port = int(_environ(victim["pid"])["PORT"])
    address = veth_address(victim["pid"])
    assert address is not None, "a root agent's instances have a veth (routed entries)"
    url = f"http://{address}:{port}/"
    out = subprocess.run(
        ["curl", "-sS", "-m", "3", "-o", "/dev/null", "-w", "%{http_code}", url],
        capture_output=True, text=True,
    )  # fmt: skip
    assert out.stdout == "000" and out.returncode == 28, (url, out.stdout, out.stderr)


def test_from_the_node_an_instance_without_a_lease_is_refused(up, victim):
    """From the host (curl, outside every sandbox): the instance's address
    is its door, and the door wants a lease."""
    port = int(_environ(victim["pid"])["PORT"])
    url = f"http://{door_host(port)}:{port}/"
    out = subprocess.run(
        ["curl", "-sS", "-m", "5", "-o", "/dev/null", "-w", "%{http_code}", url],
        capture_output=True, text=True,
    )  # fmt: skip
    assert out.stdout == "401", (url, out.stdout, out.stderr)


def test_holds_no_socket_it_did_not_make(report):
    """A socket of the node's network namespace let into a sandbox could be
    disconnected (`connect` with AF_UNSPEC) and connected anywhere the node
    reaches: no descriptor of one comes in with the instance, and the
    entry forwards bytes rather than handing its callers' connections over
    (docs/security.md, "What stands in the way")."""
    assert report["foreign_sockets"] == [], report["foreign_sockets"]


def test_runs_as_its_own_unprivileged_user(report, victim):
    assert report["uid"] != 0 and report["euid"] != 0
    assert report["uid"] != victim["uid"] and victim["uid"] != 0
    assert int(report["cap_eff"], 16) == 0 and int(report["cap_bnd"], 16) == 0
    assert report["no_new_privs"] == "1"
    assert report["seccomp"] == "2"  # a filter is installed


def _agent_path(up: GalaxyUp) -> str:
    """The node agent's PATH, where it finds the runtime's interpreter
    (this process's may differ: tests before this one may have changed it)."""
    for pid in up.pids():
        try:
            cmdline = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
        except OSError:
            continue
        if b"nodeagent" in cmdline:
            return _environ(pid)["PATH"]
    raise AssertionError("no node agent among the control plane's processes")


def _interpreter_ways(up: GalaxyUp) -> dict[str, set[str]]:
    """The directories the sandbox shows on the way to the runtime's
    interpreter when its prefix lies under /root or /home (a version
    manager's Python, or a virtualenv of one, first on the agent's PATH),
    and the one entry each may hold: {"/root": {".pyenv"}}. Empty for a
    system interpreter, as on a node."""
    ways: dict[str, set[str]] = {}
    for r in runtime_roots(resolve("python3", _agent_path(up))):
        parts = Path(r).parts
        if len(parts) > 2 and parts[1] in ("root", "home"):
            ways.setdefault(f"/{parts[1]}", set()).add(parts[2])
    return ways


def test_control_plane_secrets_and_neighbours_files_are_not_there(report, up, victim):
    # Sanity of the question: the run dir holds the keys and the token.
    names = {Path(p).name for p in report["paths"]}
    assert {"ca-key.pem", "admin-key.pem"} <= names, names
    ways = _interpreter_ways(up)
    reached = {
        p: how
        for p, how in report["paths"].items()
        if how in ("read", "listed") and not (p in ways and how == "listed")
    }
    assert not reached, reached
    # A home shown on the way to the interpreter holds that way alone.
    assert {d: set(names) for d, names in report["homes"].items()} == ways


def test_proc_shows_only_its_own_processes(report, up, victim):
    assert len(report["proc_pids"]) <= 3, report["proc_pids"]
    # The host has far more: the control plane's, the neighbour's, this test's.
    assert len(os.listdir("/proc")) > 10


def test_no_signal_reaches_another_process(report, up, victim):
    # Its own probe, after the one that reads: a SIGKILL that got through
    # would end the control plane the other checks need.
    kills = body(invoke(up, "probe", "/probe", {"kill": [*up.pids(), victim["pid"]]}))["kills"]
    assert len(kills) == len(up.pids()) + 1
    assert all(how == "ProcessLookupError" for how in kills.values()), kills
    assert all(pid_alive(p) for p in up.pids())
    assert pid_alive(victim["pid"])
    assert invoke(up, "victim").returncode == 0


def test_the_filesystem_shows_only_what_it_needs(report, up):
    ways = {d.lstrip("/") for d in _interpreter_ways(up)}
    shown = {"root", "home", "var", "run", "srv", "opt"} & set(report["root"])
    assert shown == ways, report["root"]
    assert report["paths"]["/root"] == ("listed" if "root" in ways else "FileNotFoundError")
    assert report["paths"]["/etc/shadow"] == "FileNotFoundError"


def _cgroups_here() -> bool:
    """cgroups with the pids and memory controllers can be made here."""
    try:
        cg = open_cgroups("on", 64)
    except CgroupError:
        return False
    cg.close()
    return True


needs_cgroups = pytest.mark.skipif(
    not _cgroups_here(), reason="cgroups with pids and memory are not writable here"
)


@needs_cgroups
def test_fork_loop_is_stopped_and_the_neighbour_answers(up, victim, report):
    doc = body(invoke(up, "probe", "/forkbomb"))
    assert doc["error"] == "BlockingIOError" and doc["forked"] < 1024, doc
    assert invoke(up, "victim").returncode == 0


@needs_cgroups
@pytest.mark.parametrize("hog", ["/diskhog", "/loghog"])
def test_disk_hog_is_stopped_and_the_neighbour_answers(up, victim, report, hog):
    """Filling the node's disk through its private directory, or through
    its stdout (its log file): the agent kills it past its
    resources.disk_mib, and its exit says so."""
    agent_log = up.run_dir / "logs" / "agent-0.log"
    words = "past its limit of 64 MiB (resources.disk_mib); the node agent killed it"

    def ended() -> int:  # the agent's line when it has reaped the instance
        return sum("ended: " in line and words in line for line in agent_log.open())

    before = ended()
    r = invoke(up, "probe", hog)
    assert r.returncode != 0
    deadline = time.monotonic() + 15.0
    while ended() <= before and time.monotonic() < deadline:
        time.sleep(0.1)  # a file has no change event to await here
    assert ended() > before
    assert invoke(up, "victim").returncode == 0
    assert pid_alive(victim["pid"])
    # The next test's probe is a new instance, not this one (each call is
    # bounded; Dispatch hears of the end from the agent just after its line).
    deadline = time.monotonic() + 30.0
    while invoke(up, "probe", "/probe").returncode != 0:
        assert time.monotonic() < deadline, "the probe did not come back"


def test_memory_hog_is_stopped_and_the_neighbour_answers(up, victim, report):
    r = invoke(up, "probe", "/memhog")
    assert r.returncode != 0
    oom = "out of memory: the kernel killed it at its limit of 512 MiB"
    # The agent logs the kill when it reaps the instance, which may come just
    # after the failed request's answer: wait for the line (bounded).
    log = _log_with(up.run_dir / "logs" / "agent-0.log", oom, timeout=15.0)
    assert oom in log
    assert invoke(up, "victim").returncode == 0
    assert pid_alive(victim["pid"])
