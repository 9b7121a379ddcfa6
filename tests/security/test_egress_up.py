"""Egress under a real `galaxy up` (bwrap sandboxes, the default): a spec
with `egress: true`, deployed by the CLI and called through the gateway with
curl, reaches a server on another host (a network namespace on a bridge) but
not the controller on the node's loopback, a cloud's metadata address (the
agents' default deny list) nor a third host the agents were told to deny
(`--agent-arg=--instance-egress-deny=...`); the same function deployed
without it reaches none."""

from __future__ import annotations

import json
import subprocess

import pytest

from tests.integration.upctl import GalaxyUp
from tests.netns import Hosts, require_netns
from tests.nodeagent.egress_probe import PROBE, greeter, require_slirp

pytestmark = pytest.mark.slow  # a whole `galaxy up`


METADATA = "169.254.169.254:80"


@pytest.fixture(scope="module")
def hosts():
    """Greeters on two other hosts: their host:port (the second is denied)."""
    require_netns()
    require_slirp()
    made = Hosts().create(2)
    procs = []
    try:
        at = []
        for i in range(2):
            proc, where = greeter(made.exec_prefix(i), made.ip(i))
            procs.append(proc)
            at.append(where)
        yield at
    finally:
        for proc in procs:
            proc.kill()
            proc.wait()
        made.close()


@pytest.fixture(scope="module")
def far(hosts):
    return hosts[0]


@pytest.fixture(scope="module")
def denied(hosts):
    return hosts[1]


@pytest.fixture(scope="module")
def up(tmp_path_factory, far, denied):
    run = tmp_path_factory.mktemp("run")
    specs = tmp_path_factory.mktemp("specs")
    deny = f"169.254.0.0/16,{denied.rsplit(':', 1)[0]}/32"
    g = GalaxyUp(run, "--nodes", "1", f"--agent-arg=--instance-egress-deny={deny}")
    g.start()
    try:
        artifact = specs / "probe.py"
        artifact.write_text(PROBE)
        (specs / "rt.yaml").write_text(
            "name: egress-probe\ncommand: [python3, -u, '{artifact}']\n"
            f"artifact: {{required: true, prefixes: ['{specs}'], suffixes: [.py]}}\n"
            "allowed_env: [PROBE_TARGETS]\n"
        )
        assert g.cli("runtimes", "apply", "-f", str(specs / "rt.yaml")).returncode == 0
        # The controller listens on the node's loopback: 10.0.2.2 is that
        # loopback as slirp4netns names it.
        port = g.endpoints["controller"].rsplit(":", 1)[1]
        targets = f"{far},10.0.2.2:{port},{denied},{METADATA}"
        for name, egress in (("reach-out", "true"), ("stay-in", "false")):
            (specs / f"{name}.yaml").write_text(
                f"name: {name}\nruntime: egress-probe\nartifact: {artifact}\npublic: true\n"
                f"egress: {egress}\nenv: {{PROBE_TARGETS: '{targets}'}}\nreadiness_path: ''\n"
            )
            r = g.cli("deploy", "-f", str(specs / f"{name}.yaml"))
            assert r.returncode == 0, r.stderr
        yield g
    finally:
        pids = g.pids()
        g.stop()
        assert not g.kill_leftovers(pids)


def curl(up: GalaxyUp, name: str) -> dict[str, str]:
    url = f"{up.endpoints['gateway'].rstrip('/')}/functions/{name}/"
    r = subprocess.run(["curl", "-sS", "--max-time", "60", url], capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    return json.loads(r.stdout)


def test_a_function_with_egress_reaches_another_host_and_not_the_control_plane(
    up, far, denied
) -> None:
    got = curl(up, "reach-out")
    assert got[far] == f"ok:hello from {far.rsplit(':', 1)[0]}", got
    loopback = next(t for t in got if t.startswith("10.0.2.2:"))
    assert not got[loopback].startswith("ok:"), got
    # Denied (EHOSTUNREACH at once): by default, and by the agents' flag.
    assert got[METADATA] == "OSError", got
    assert got[denied] == "OSError", got


def test_a_function_without_egress_reaches_nothing(up, far) -> None:
    got = curl(up, "stay-in")
    assert far in got and len(got) == 4, got  # every target was tried
    assert all(not v.startswith("ok:") for v in got.values()), got
