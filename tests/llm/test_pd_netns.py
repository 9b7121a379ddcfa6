"""A disaggregated request across two hosts: node agents in two network
namespaces on a bridge (tests/netns.py), the control plane and the gateway
in the root namespace, every instance in a bubblewrap sandbox (its own
network namespace, no egress). The prefill pool has one instance per host
and the decode function one instance: its requests are prefilled on the
decode's own host (the KV cache in shared memory, its descriptor passed by
the host's KV relay to the decode instance's socket), and once that prefill
instance has a queue, on the other host (the relay streams the cache over
TCP across the bridge to the decode instance's entry). The `openai` client
reads it all through the gateway, and the gateway counts no fallback.
"""

from __future__ import annotations

import asyncio
import os
import sys
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import aiohttp
import openai
import pytest
import yaml

from controlplane.bench.pdbench import pd_outcomes
from controlplane.launch.up import Supervisor
from controlplane.runtime import leasetoken
from controlplane.runtime import spec as specs
from controlplane.sdk.client import GalaxyClient
from tests.netns import cluster as netns_cluster

pytestmark = [pytest.mark.integration, pytest.mark.slow]

REPO = Path(__file__).resolve().parents[2]
ARTIFACT = str(REPO / "examples" / "llm_emulated.py")
HOSTS = 2
PROMPT = " ".join(f"v{i}" for i in range(60))


@pytest.fixture
async def cluster(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> AsyncIterator[Supervisor]:
    # Instances run `python3`: this interpreter's (aiohttp, prometheus_client).
    monkeypatch.setenv("PATH", f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}")
    # The default sandbox (bubblewrap): instances have no egress, caches go
    # through each host's node agent (its KV relay).
    async with netns_cluster(tmp_path, HOSTS) as (sup, _):
        yield sup


def deploy_doc(tmp_path: Path, name: str, n: int, **extra: object) -> Any:
    args = ["--profile=smollm2-135m-cpu"]
    doc = {"name": name, "public": True, "runtime": "llm-emulated", "artifact": ARTIFACT,
           "args": args, "min_scale": n, "max_scale": n, **extra}  # fmt: skip
    path = tmp_path / f"{name}.yaml"
    path.write_text(yaml.safe_dump(doc))
    return specs.load_file(path)


async def placed(client: GalaxyClient, function: str, n: int) -> dict[str, tuple[str, str]]:
    """instance id -> (node, address) of ``function``'s instances, once n are up."""
    for _ in range(240):
        st = await client.status()
        got = {
            s.instance.instance_id: (s.instance.node_id, s.instance.address)
            for s in st.instances
            if s.instance.function.startswith(function)
        }
        if len(got) >= n:
            return got
        await asyncio.sleep(0.5)  # polling a status nothing can wait on
    raise AssertionError(f"{function}: fewer than {n} instances up")


async def chat(c: openai.AsyncOpenAI, model: str, user: str) -> tuple[str, dict[str, Any]]:
    raw = await c.chat.completions.with_raw_response.create(
        model=model, max_tokens=3, messages=[{"role": "user", "content": f"{PROMPT} {user}"}]
    )
    done = raw.parse()
    assert done.usage is not None and done.usage.prompt_tokens_details is not None
    # Decoded from the moved cache: no prompt token was prefilled there.
    assert done.usage.prompt_tokens_details.cached_tokens == done.usage.prompt_tokens
    return raw.headers["X-Galaxy-Instance"], done.usage.model_extra or {}


async def busy(
    session: aiohttp.ClientSession, address: str, lease: str, n: int
) -> list[asyncio.Task[Any]]:
    """n long completions sent straight to an instance's entry with a lease
    token signed here (past Dispatch, so only its scraped /metrics show
    them), within its batch (16): a request Dispatch sends there before its
    scrape shows them is not held up."""
    body = {"model": "x", "prompt": "hold", "max_tokens": 4000}
    headers = {leasetoken.HEADER: lease}

    async def one() -> None:
        url = f"http://{address}/v1/completions"
        async with session.post(url, json=body, headers=headers) as r:
            assert r.status == 200, await r.text()
            await r.read()

    return [asyncio.create_task(one()) for _ in range(n)]


@pytest.mark.timeout(300)  # a control plane, two hosts and three instances to start
async def test_a_request_is_prefilled_on_its_host_or_across_the_bridge_when_that_is_busy(
    cluster: Supervisor, tmp_path: Path
) -> None:
    endpoints = cluster.endpoints()
    token = cluster.client_token()
    async with GalaxyClient(
        endpoints["controller"], timeout=30, tls=cluster.client_tls(), token=token
    ) as client:
        await client.deploy(deploy_doc(tmp_path, "xpf", HOSTS))
        prefills = await placed(client, "xpf", HOSTS)
        await client.deploy(deploy_doc(tmp_path, "xdc", 1, pd={"prefill": "xpf"}))
        ((decode, (decode_node, _)),) = (await placed(client, "xdc", 1)).items()
        near = [p for p, (n, _) in prefills.items() if n == decode_node]
        far = [p for p, (n, _) in prefills.items() if n != decode_node]
        if not near or not far:
            pytest.skip(f"placement put both prefill instances on one host: {prefills}")
        c = openai.AsyncOpenAI(base_url=f"http://{endpoints['gateway']}/v1", api_key=token)
        for k in range(3):  # on the decode's host: through shared memory
            decoded_on, usage = await chat(c, "xdc", f"near {k}")
            assert decoded_on == decode
            assert usage.get("galaxy_prefill_instance") == near[0], (usage, prefills)
        # Load on the near prefill instance (8 streams running): once
        # Dispatch has scraped it, the other host's is cheaper, and the cache
        # crosses the bridge over TCP.
        key = leasetoken.load(cluster.tls_dir)
        assert key is not None
        lease = key.sign(near[0], time.time_ns() // 1_000_000 + 120_000)
        session = aiohttp.ClientSession()
        load = await busy(session, prefills[near[0]][1], lease, 8)
        try:
            origins = []
            for k in range(40):
                _, usage = await chat(c, "xdc", f"far {k}")
                origins.append(usage.get("galaxy_prefill_instance"))
                if origins[-1] == far[0]:
                    break
                await asyncio.sleep(0.25)  # Dispatch scrapes every 0.5 s
            assert origins[-1] == far[0], f"never prefilled across the bridge: {origins}"
            metrics = next(
                c["metrics"] for c in endpoints["components"] if c.get("kind") == "gateway"
            )
            outcomes = {k: v for k, v in (await pd_outcomes(metrics)).items() if v}
            assert outcomes == {"disaggregated": len(origins) + 3}, outcomes
        finally:
            for t in load:
                t.cancel()
            await asyncio.gather(*load, return_exceptions=True)
            await session.close()
            await c.close()
