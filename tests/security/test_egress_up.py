"""Egress under a real `galaxy up` with default settings (bwrap sandboxes):
a spec with `egress: true`, deployed by the CLI and called through the
gateway with curl, reaches a server on another host (a network namespace on
a bridge) but not the controller on the node's loopback; the same function
deployed without it reaches neither."""

from __future__ import annotations

import json
import subprocess

import pytest

from tests.integration.upctl import GalaxyUp
from tests.netns import Hosts, require_netns
from tests.nodeagent.egress_probe import PROBE, greeter, require_slirp

pytestmark = pytest.mark.slow  # a whole `galaxy up`


@pytest.fixture(scope="module")
def far():
    """A greeter on another host: its host:port."""
    require_netns()
    require_slirp()
    hosts = Hosts().create(1)
    try:
        proc, at = greeter(hosts.exec_prefix(0), hosts.ip(0))
        try:
            yield at
        finally:
            proc.kill()
            proc.wait()
    finally:
        hosts.close()


@pytest.fixture(scope="module")
def up(tmp_path_factory, far):
    run = tmp_path_factory.mktemp("run")
    specs = tmp_path_factory.mktemp("specs")
    g = GalaxyUp(run, "--nodes", "1")
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
        targets = f"{far},10.0.2.2:{port}"
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


def test_a_function_with_egress_reaches_another_host_and_not_the_control_plane(up, far) -> None:
    got = curl(up, "reach-out")
    assert got[far] == f"ok:hello from {far.rsplit(':', 1)[0]}", got
    loopback = next(t for t in got if t.startswith("10.0.2.2:"))
    assert not got[loopback].startswith("ok:"), got


def test_a_function_without_egress_reaches_nothing(up, far) -> None:
    got = curl(up, "stay-in")
    assert far in got and len(got) == 2, got  # both targets were tried
    assert all(not v.startswith("ok:") for v in got.values()), got
