"""Prefill/decode disaggregation under the default sandbox (bubblewrap): a
real `galaxy up`, emulated LLM instances in their own network namespaces
with no egress, the official `openai` client through the gateway.

The prefill instance hands its cache to its node agent's KV relay (a
filesystem socket in its sandbox) and the relay passes the memfd on to the
decode instance: every request is disaggregated, none falls back. An
instance of another tenant holding a valid lease token for the decode
instance still cannot send it a cache, nor can an instance of the same
tenant whose function is not the decode's prefill pool, nor one without
the lease.
"""

from __future__ import annotations

import json
import os
import sys
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import aiohttp
import openai
import pytest
import yaml

from controlplane.bench.llmup import Up
from controlplane.bench.pdbench import pd_outcomes
from controlplane.runtime import kvaddr, leasetoken, tlsfiles
from controlplane.sdk.client import GalaxyClient
from galaxy.v1 import dispatch_pb2

pytestmark = [pytest.mark.integration, pytest.mark.slow]

REPO = Path(__file__).resolve().parents[2]
ARTIFACT = str(REPO / "examples" / "llm_emulated.py")
PROMPT = " ".join(f"b{i}" for i in range(50))


def spec(path: Path, name: str, **extra: object) -> Path:
    doc = {"name": name, "public": True, "runtime": "llm-emulated", "artifact": ARTIFACT,
           "args": ["--profile=smollm2-135m-cpu"], **extra}  # fmt: skip
    path.write_text(yaml.safe_dump(doc))
    return path


@pytest.fixture
async def up(tmp_path: Path) -> AsyncIterator[Up]:
    if os.geteuid() != 0:
        pytest.skip("the same-node relay passes descriptors into namespaces it enters (root)")
    # The default sandbox; instances run this interpreter's python3.
    path = f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}"
    async with Up(tmp_path / "run", 1, {"PATH": path}) as g:
        yield g


async def instances(g: Up, function: str) -> list[str]:
    st = json.loads(await g.cli("status", "-o", "json"))
    return [
        i["instance"]["instance_id"]
        for i in st["instances"]
        if i["instance"]["function"].startswith(function)
    ]


@pytest.mark.timeout(300)  # a control plane and four sandboxed instances on shared cores
async def test_requests_are_disaggregated_through_the_relay_and_other_tenants_are_refused(
    up: Up, tmp_path: Path
) -> None:
    prefill = await up.deploy(spec(tmp_path / "p.yaml", "bw-prefill"), 1, tmp_path)
    decode = await up.deploy(
        spec(tmp_path / "d.yaml", "bw-decode", pd={"prefill": prefill}), 1, tmp_path
    )
    c = openai.AsyncOpenAI(base_url=f"http://{up.gateway}/v1", api_key=up.token, timeout=60)
    (prefilled_on,) = await instances(up, prefill)
    for k in range(3):
        raw = await c.chat.completions.with_raw_response.create(
            model=decode, max_tokens=3, messages=[{"role": "user", "content": f"{PROMPT} {k}"}]
        )
        usage = raw.parse().usage
        assert usage is not None and usage.prompt_tokens_details is not None
        # Decoded from the moved cache: no prompt token prefilled there.
        assert usage.prompt_tokens_details.cached_tokens == usage.prompt_tokens > 50
        assert (usage.model_extra or {}).get("galaxy_prefill_instance") == prefilled_on
    await c.close()
    outcomes = await pd_outcomes(up.gateway_metrics)
    assert outcomes.get("disaggregated") == 3, outcomes
    assert outcomes.get("fallback_transfer") == 0, outcomes

    # Another tenant's prefill-capable instance, and one of this tenant
    # whose function is not the decode's prefill pool.
    other = await up.deploy(spec(tmp_path / "o.yaml", "bw-other", namespace="rival"), 1, tmp_path)
    stray = await up.deploy(spec(tmp_path / "s.yaml", "bw-stray"), 1, tmp_path)
    ep = json.loads((up.run_dir / "endpoints.json").read_text())
    tls = tlsfiles.client_tls(up.run_dir / "certs")
    async with (
        GalaxyClient(ep["controller"], timeout=30, tls=tls, token=up.token) as client,
        aiohttp.ClientSession() as http,
    ):
        # A valid lease on the decode instance, as a stolen one would be.
        victim = await client.dispatch(decode, deadline_s=30)
        try:
            for sender in (other, stray):
                status, said = await prefill_into(client, http, sender, victim, victim.lease_token)
                assert status == 502 and "galaxy_decode" in said, said
                assert "403" in said and "does not take caches from yours" in said, said
            # The paired prefill function itself, without the lease.
            status, said = await prefill_into(client, http, prefill, victim, "")
            assert status == 502 and "401" in said and "lease" in said, said
            forged = f"{victim.lease_token.split('.')[0]}.{'A' * 22}"
            status, said = await prefill_into(client, http, prefill, victim, forged)
            assert status == 502 and "403" in said, said
        finally:
            await client.release(victim)


async def prefill_into(
    client: GalaxyClient,
    http: aiohttp.ClientSession,
    sender: str,
    decode: dispatch_pb2.InstanceAddr,
    lease: str,
) -> tuple[int, str]:
    """Ask an instance of sender to prefill a prompt and send its cache to
    the decode instance (through its door, with its own lease)."""
    addr = await client.dispatch(sender, deadline_s=30)
    body: dict[str, Any] = {
        "model": sender, "prompt": PROMPT, "max_tokens": 1,
        "galaxy_decode": kvaddr.shm_target(decode.instance_id),
        "galaxy_decode_lease": lease, "galaxy_decode_instance": decode.instance_id,
    }  # fmt: skip
    try:
        async with http.post(
            f"http://{addr.address}/v1/pd/prefill",
            json=body,
            headers={leasetoken.HEADER: addr.lease_token},
            timeout=aiohttp.ClientTimeout(total=30),
        ) as r:
            return r.status, await r.text()
    finally:
        await client.release(addr)
