"""End to end through real processes: `galaxy up`, deploy, invoke, status.

Everything runs for real: one process per component on loopback gRPC, node
agents with process sandboxes, and the example echo function as a real
subprocess.
"""

from __future__ import annotations

import asyncio
import json
import os
import re
import subprocess
import urllib.request
from pathlib import Path

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha.proto_reflection_descriptor_database import (
    ProtoReflectionDescriptorDatabase,
)

from galaxy.v1 import (
    common_pb2,
    controller_pb2,
    controller_pb2_grpc,
    dispatch_pb2,
    dispatch_pb2_grpc,
)
from tests.instances import instance_pid
from tests.integration.upctl import READY_LINE, REPO, GalaxyUp, pid_alive

# Real `galaxy` processes: the full suite, not the fast tier.
pytestmark = [pytest.mark.integration, pytest.mark.slow]


@pytest.fixture(scope="module")
def up(tmp_path_factory):
    g = GalaxyUp(tmp_path_factory.mktemp("run"), "--nodes", "2", "--node-cpu-millis", "1000")
    g.start()
    instance_pids: list[int] = []
    g.instance_pids = instance_pids  # type: ignore[attr-defined]
    yield g
    pids = g.pids()
    g.stop()
    leaked = g.kill_leftovers(pids + instance_pids)
    assert not leaked, f"processes left after shutdown: {leaked}"
    assert not (g.run_dir / "endpoints.json").exists()


def invoke(up, name, data):
    return up.cli("invoke", name, "--data", data)


def test_up_prints_every_endpoint(up):
    text = "".join(up.output)
    for name in ("controller", "dispatch-0", "schedule-0", "clustermgr-0", "agent-0", "agent-1"):
        assert re.search(rf"{name}\s+grpc 127\.0\.0\.1:\d+", text), text
    assert "nodes alive: 2" in text
    assert re.search(r"gateway-0\s+http 127\.0\.0\.1:\d+", text), text
    assert f"Gateway: http://{up.endpoints['gateway']}" in text


def test_deploy_then_cold_then_warm_invoke(up):
    # Real `galaxy` processes, as a user types them (most other calls run in-process).
    r = up.cli_process("deploy", "-f", str(REPO / "examples" / "echo.yaml"))
    assert r.returncode == 0, r.stderr
    assert "deployed echo" in r.stdout
    first = up.cli_process("invoke", "echo", "--data", "hello")
    assert first.returncode == 0, first.stderr
    assert "(cold" in first.stdout and "HTTP 200" in first.stdout
    body = json.loads(first.stdout.split("HTTP 200: ", 1)[1])
    assert body["echo"] == "hello"
    pid = instance_pid(body["instance"], under=up.proc.pid)  # body["pid"]: its sandbox's
    up.instance_pids.append(pid)
    assert pid_alive(pid)
    second = up.cli_process("invoke", "echo", "--data", "again")
    assert second.returncode == 0, second.stderr
    assert "(warm" in second.stdout
    body2 = json.loads(second.stdout.split("HTTP 200: ", 1)[1])
    assert body2 == {**body, "echo": "again"}  # same instance, same process


def test_quick_tour_curl_through_the_gateway(up):
    # echo is deployed and warm (the test above)
    out = subprocess.run(
        ["curl", "-sS", "--max-time", "60", f"http://{up.endpoints['gateway']}/functions/echo",
         "-d", "hi"],
        capture_output=True, text=True, timeout=70,
    )  # fmt: skip
    assert out.returncode == 0, out.stderr
    body = json.loads(out.stdout)
    assert body["echo"] == "hi"
    up.instance_pids.append(instance_pid(body["instance"], under=up.proc.pid))


def test_status_lists_everything(up):
    invoke(up, "echo", "x") if up.cli("functions").stdout == "" else None
    r = up.cli("status")
    assert r.returncode == 0, r.stderr
    out = r.stdout
    for kind in ("dispatch", "schedule", "clustermgr"):
        assert re.search(rf"^\s+{kind}\s+{kind}-0\s+127\.0\.0\.1:\d+", out, re.M), out
    assert "nodes: 2 (2 alive)" in out
    assert re.search(r"node-\d+\s+alive\s+schedule=schedule-0\s+cpu \d+/1000m", out), out
    assert re.search(r"^\s+echo\s+v\d+ concurrency=4", out, re.M), out
    st = json.loads(up.cli("status", "--json").stdout)
    assert len(st["nodes"]) == 2


def test_bad_spec_is_rejected_naming_the_field(up, tmp_path):
    bad = tmp_path / "bad.yaml"
    bad.write_text("name: bad\nruntime: python\nconcurrency: 0\n")
    r = up.cli_process("deploy", "-f", str(bad))  # the exit status of a real process
    assert r.returncode == 1
    assert "concurrency" in r.stderr and "Traceback" not in r.stderr


def test_runtimes_cli_and_no_command_from_the_api(up, tmp_path):
    assert re.search(
        r"Serving runtimes: .*\bpython\b.* \(`galaxy runtimes list`\)", "".join(up.output)
    )
    r = up.cli("runtimes", "list")
    assert r.returncode == 0 and re.search(r"^python\s+python3 -u \{artifact\}", r.stdout, re.M)
    got = json.loads(up.cli("runtimes", "get", "python").stdout)
    assert got["command"] == ["python3", "-u", "{artifact}", "{args}"]
    rt = tmp_path / "rt.yaml"
    rt.write_text("name: tmp-rt\ncommand: [python3, '{artifact}']\nartifact: {prefixes: [/srv]}\n")
    r = up.cli("runtimes", "apply", "-f", str(rt))
    assert r.returncode == 0 and "runtime tmp-rt stored" in r.stdout, r.stderr
    assert up.cli("runtimes", "delete", "tmp-rt").returncode == 0
    # echo (the quick tour's) uses python: it cannot go.
    assert up.cli("deploy", "-f", str(REPO / "examples" / "echo.yaml")).returncode == 0
    r = up.cli("runtimes", "delete", "python")
    assert r.returncode == 1 and "FAILED_PRECONDITION" in r.stderr and "function echo" in r.stderr
    # A spec with a command is refused by the CLI, naming the field.
    bad = tmp_path / "cmd.yaml"
    bad.write_text("name: cmd\ncommand: [sh, -c, id]\n")
    r = up.cli("deploy", "-f", str(bad))
    assert r.returncode == 1 and "command: set by the runtime" in r.stderr, r.stderr


def test_server_validates_specs_too(up):
    async def go():
        async with up.channel(up.controller) as ch:
            stub = controller_pb2_grpc.ControllerStub(ch)
            with pytest.raises(grpc.aio.AioRpcError) as e:
                await stub.DeployFunction(
                    controller_pb2.DeployFunctionRequest(
                        function=common_pb2.FunctionSpec(name="Has Space", runtime="python")
                    ),
                    timeout=5,
                    metadata=up.md,
                )
            return e.value

    err = asyncio.run(go())
    assert err.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert err.details().startswith("name:")


def test_unknown_function_is_not_found(up):
    r = invoke(up, "nope", "x")
    assert r.returncode == 1
    assert "NOT_FOUND" in r.stderr and "Traceback" not in r.stderr

    async def go():
        addr = up.component("dispatch-0")["address"]
        async with up.channel(addr) as ch:
            with pytest.raises(grpc.aio.AioRpcError) as e:
                await dispatch_pb2_grpc.DispatchStub(ch).Dispatch(
                    dispatch_pb2.DispatchRequest(function="nope"), timeout=5, metadata=up.md
                )
            return e.value.code()

    assert asyncio.run(go()) == grpc.StatusCode.NOT_FOUND


def test_a_spec_larger_than_any_node_is_failed_precondition(up, tmp_path):
    big = tmp_path / "big.yaml"
    big.write_text(
        f"name: big\nruntime: python\nartifact: {REPO / 'examples' / 'echo_server.py'}\n"
        "resources: {cpu_millis: 64000}\n"
    )
    # Refused at deploy: `galaxy up` returns once its nodes registered.
    r = up.cli("deploy", "-f", str(big))
    assert r.returncode == 1
    # Retrying cannot help (README): not RESOURCE_EXHAUSTED, which means "full now".
    assert "FAILED_PRECONDITION" in r.stderr, r.stderr
    assert "resources.cpu_millis: 64000 per instance" in r.stderr and "has 1000" in r.stderr


def test_concurrent_cold_requests_share_one_scale_up(up, tmp_path):
    spec = tmp_path / "co.yaml"
    spec.write_text(
        f"name: coalesce\nruntime: python\nartifact: {REPO / 'examples' / 'echo_server.py'}\n"
        "concurrency: 8\nmax_scale: 4\nreadiness_path: /healthz\nresources: {cpu_millis: 100}\n"
    )
    assert up.cli("deploy", "-f", str(spec)).returncode == 0

    async def go():
        addr = up.component("dispatch-0")["address"]
        async with up.channel(addr) as ch:
            stub = dispatch_pb2_grpc.DispatchStub(ch)
            res = await asyncio.gather(
                *(
                    stub.Dispatch(
                        dispatch_pb2.DispatchRequest(function="coalesce"),
                        timeout=30,
                        metadata=up.md,
                    )
                    for _ in range(6)
                )
            )
            listed = await stub.ListInstances(
                dispatch_pb2.ListInstancesRequest(function="coalesce"), timeout=5, metadata=up.md
            )
            for r in res:
                await stub.Release(
                    dispatch_pb2.ReleaseRequest(function="coalesce", lease_id=r.lease_id),
                    timeout=5,
                    metadata=up.md,
                )
            return res, listed

    res, listed = asyncio.run(go())
    assert len({r.instance_id for r in res}) == 1
    assert all(r.cold_start for r in res)
    assert len(listed.instances) == 1 and listed.instances[0].in_flight == 6


def test_reflection_and_health_on_every_server(up):
    expected = {
        "controller": "galaxy.v1.Controller",
        "dispatch-0": "galaxy.v1.Dispatch",
        "schedule-0": "galaxy.v1.Schedule",
        "clustermgr-0": "galaxy.v1.ClusterMgr",
        "agent-0": "galaxy.v1.NodeAgent",
    }
    for name, service in expected.items():
        with up.sync_channel(up.component(name)["address"]) as ch:
            services = set(ProtoReflectionDescriptorDatabase(ch).get_services())
            assert {service, "grpc.health.v1.Health"} <= services, (name, services)
            resp = health_pb2_grpc.HealthStub(ch).Check(
                health_pb2.HealthCheckRequest(service=service), timeout=5
            )
            assert resp.status == health_pb2.HealthCheckResponse.SERVING


def test_metrics_endpoint_exposes_rpc_and_cold_start_metrics(up):
    invoke(up, "echo", "m")
    url = f"http://{up.component('dispatch-0')['metrics']}/metrics"
    text = urllib.request.urlopen(url, timeout=5).read().decode()
    assert 'galaxy_rpc_requests_total{code="OK",method="Dispatch/Dispatch"}' in text
    assert "galaxy_cold_starts_total" in text and "galaxy_rpc_latency_seconds_bucket" in text


def test_cli_without_control_plane_says_what_to_do(tmp_path):
    g = GalaxyUp(Path(tmp_path))
    r = g.cli_process("status")
    assert r.returncode == 1 and "galaxy up" in r.stderr and "Traceback" not in r.stderr


def test_emulated_210_nodes_and_clean_shutdown(tmp_path):
    g = GalaxyUp(tmp_path, "--nodes", "210", "--sandbox", "emulated")
    g.start(timeout=120)
    pids = g.pids()
    try:
        assert "nodes alive: 210" in "".join(g.output)
        spec = tmp_path / "emu.yaml"
        # `galaxy up` registered the examples' runtime; emulated sandboxes run nothing.
        spec.write_text(
            f"name: emu\nruntime: python\nartifact: {REPO / 'examples' / 'echo_server.py'}\n"
            "concurrency: 2\n"
        )
        assert g.cli("deploy", "-f", str(spec)).returncode == 0
        r = g.cli("invoke", "emu", "--data", "x")
        assert r.returncode == 0 and "emulated://" in r.stdout, r.stdout + r.stderr
    finally:
        rest = g.stop()
    assert "stopped." in rest
    assert not g.kill_leftovers(pids), "processes left after shutdown"


def test_killed_supervisor_leaves_no_orphans(tmp_path):
    """SIGKILL of `galaxy up` cannot run its cleanup: the lifeline pipes and
    PR_SET_PDEATHSIG must still take every component and instance down."""
    import os
    import signal
    import time

    g = GalaxyUp(tmp_path, "--nodes", "1")
    g.start()
    pids = g.pids()
    try:
        assert g.cli("deploy", "-f", str(REPO / "examples" / "echo.yaml")).returncode == 0
        r = g.cli("invoke", "echo", "--data", "x")
        assert r.returncode == 0, r.stderr
        body = json.loads(r.stdout.split("HTTP 200: ", 1)[1])
        pids.append(instance_pid(body["instance"], under=g.proc.pid))
        os.kill(g.proc.pid, signal.SIGKILL)
        g.proc.wait(timeout=10)
        # These are not our children, so there is no wait(): poll /proc, bounded.
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline and any(pid_alive(p) for p in pids):
            time.sleep(0.05)
        assert not g.kill_leftovers(pids), "orphans after the supervisor was killed"
        # The stale endpoints file is recognised as stale.
        assert "no running control plane" in g.cli("status").stderr
    finally:
        # Whatever failed above, nothing this test started may outlive it.
        if g.proc is not None and g.proc.poll() is None:
            g.proc.kill()
            g.proc.wait(timeout=10)
        g.kill_leftovers(pids)


def _children(pid: int) -> list[int]:
    try:
        with open(f"/proc/{pid}/task/{pid}/children") as f:
            return [int(x) for x in f.read().split()]
    except OSError:
        return []


def test_sigterm_during_start_up_stops_at_once(tmp_path):
    """A service manager stops with SIGTERM, often while a large control
    plane is still starting: it must stop then, not after start-up."""
    import signal
    import sys
    import time

    proc = subprocess.Popen(
        [sys.executable, "-m", "controlplane.tools.cli", "--run-dir", str(tmp_path),
         "up", "--gateway-port", "0", "--nodes", "210", "--sandbox", "emulated"],
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, cwd=REPO,
    )  # fmt: skip
    seen: set[int] = set()
    try:
        assert proc.stdout is not None
        assert "starting the control plane (210 nodes)" in proc.stdout.readline()
        # Components are starting once the supervisor has children (bounded poll:
        # another process's children announce themselves through /proc only).
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline and len(seen) < 3:
            seen.update(_children(proc.pid))
            time.sleep(0.02)
        assert len(seen) >= 3, "no components started"
        proc.send_signal(signal.SIGTERM)
        rest, _ = proc.communicate(timeout=30)
        assert "stopped." in rest, rest
        assert READY_LINE not in rest, "start-up completed before the stop"
        assert proc.returncode == 0
        seen.update(_children(proc.pid))
        left = [p for p in seen if pid_alive(p)]
        assert not left, f"components left after the stop: {left}"
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(timeout=10)
        for p in seen:
            if pid_alive(p):
                os.kill(p, signal.SIGKILL)
