"""Instances are reachable from other hosts: node agents run in their own
network namespaces (separate hosts with their own addresses and their own
loopback), the control plane and the gateway in the root namespace; calls go
through the SDK and through the gateway with curl.

Host 0's agent listens on its address; host 1's listens on every interface
(as on Kubernetes without --advertise-host) and must advertise its outward
address. A loopback address anywhere on the path would fail the calls: the
root namespace cannot reach a namespace's loopback.
"""

from __future__ import annotations

import asyncio
import json
import shutil
import urllib.request
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
from prometheus_client.parser import text_string_to_metric_families

from controlplane.launch.up import Supervisor
from controlplane.runtime import spec as specs
from controlplane.runtime.netaddr import split_host_port
from controlplane.runtime.revisions import routing_key
from controlplane.sdk.client import GalaxyClient
from tests.netns import Hosts
from tests.netns import cluster as netns_cluster

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"
HOSTS = 2


@pytest.fixture
async def cluster(tmp_path: Path) -> AsyncIterator[tuple[Supervisor, Hosts]]:
    # Host 1 listens on every interface and must advertise its own address.
    def listen(hosts: Hosts, i: int) -> str:
        return hosts.ip(i) if i == 0 else "0.0.0.0"

    # A short head deadline at the doors, so that the test sees it act.
    async with netns_cluster(tmp_path, HOSTS, listen, ("--entry-head-timeout-s", "1")) as got:
        yield got


@pytest.mark.slow
async def test_instances_on_other_hosts_answer_sdk_and_gateway(
    cluster: tuple[Supervisor, Hosts],
) -> None:
    sup, hosts = cluster
    endpoints = sup.endpoints()
    host_ips = {hosts.ip(i) for i in range(HOSTS)}
    async with GalaxyClient(
        endpoints["controller"], timeout=30, tls=sup.client_tls(), token=sup.client_token()
    ) as client:
        st = await client.status()
        agent_ips = {split_host_port(n.status.address)[0] for n in st.nodes}
        # Host 1 listens on 0.0.0.0 and still advertises its own address.
        assert agent_ips == host_ips

        echo = specs.load_file(str(EXAMPLES / "echo.yaml"))
        echo.min_scale = HOSTS
        await client.deploy(echo)

        # Through the SDK: Dispatch hands out the instance's address on its host.
        results = [await client.invoke("echo", f"sdk-{i}".encode()) for i in range(6)]
        assert [r.status for r in results] == [200] * 6
        for r in results:
            assert split_host_port(r.instance.address)[0] in host_ips, r.instance.address
        replies = [json.loads(r.body) for r in results]
        assert [r["echo"] for r in replies] == [f"sdk-{i}" for i in range(6)]
        assert {r["node"] for r in replies} <= {f"host{i}-0" for i in range(HOSTS)}

        st = await client.status()
        addresses = [
            s.instance.address for s in st.instances if routing_key(s.instance.function) == "echo"
        ]
        assert addresses, "no echo instance in status"
        for address in addresses:
            assert split_host_port(address)[0] in host_ips, address

    # Through the gateway, with a client we did not write.
    curl = shutil.which("curl")
    assert curl, "curl is required (.ci/run installs it)"
    # The gateway serves plain HTTP here; its calls into the cluster use mTLS.
    proc = await asyncio.create_subprocess_exec(
        curl, "-sS", "--max-time", "20", "-d", "from-curl",
        "-H", f"Authorization: Bearer {sup.client_token()}",
        f"http://{endpoints['gateway']}/functions/echo",
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE,
    )  # fmt: skip
    out, err = await proc.communicate()
    assert proc.returncode == 0, err.decode()
    body = json.loads(out)
    assert body["echo"] == "from-curl"
    assert body["node"] in {f"host{i}-0" for i in range(HOSTS)}
    # The gateway holds the lease key: its connection to that instance, on
    # another host, went through the host's NAT straight to the instance.
    gateway = next(c for c in endpoints["components"] if c["kind"] == "gateway")
    text = await asyncio.to_thread(
        lambda: urllib.request.urlopen(f"http://{gateway['metrics']}/metrics", timeout=5).read()
    )
    routes = {
        s.labels["outcome"]: s.value
        for f in text_string_to_metric_families(text.decode())
        for s in f.samples
        if s.name == "galaxy_gateway_entry_routes_total"
    }
    # Established through the other host's NAT (it forwards, to the
    # instances only), and none admitted that the host did not take.
    assert routes["routed"] >= 1 and routes["failed"] == 0, routes

    # Straight to an instance on another host, without a lease: the node's
    # entry refuses it (curl), and a connection that shows no request is
    # answered 408 and closed after the agents' --entry-head-timeout-s.
    proc = await asyncio.create_subprocess_exec(
        curl, "-sS", "--max-time", "20", "-o", "/dev/null", "-w", "%{http_code}",
        "-d", "no-lease", f"http://{addresses[0]}/",
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE,
    )  # fmt: skip
    out, err = await proc.communicate()
    assert out == b"401", (out, err.decode())
    host, port = split_host_port(addresses[0])
    reader, writer = await asyncio.open_connection(host, port)
    try:
        answer = await asyncio.wait_for(reader.read(), 15)
    finally:
        writer.close()
    assert answer.startswith(b"HTTP/1.1 408"), answer
