"""Cold start of the real model through Galaxy against the model's own load.

    python -m controlplane.bench.llmcold --out results/llm-cold

1. The model server alone: ``llama_cpp.server`` started on the GGUF, time
   from exec to its first answer on /v1/models (what the server needs to
   import and load the model: its own load time), then one request's TTFT.
2. Through a real ``galaxy up``: the function deployed at min scale 0; the
   first request cold-starts an instance and fills the node's model cache;
   the function is deleted and deployed again (same model: the node cache is
   now warm) and the next request's TTFT is the cold start from a warm cache;
   one more request gives the warm TTFT.

The goal: a cold start from a warm node cache adds at most 2x the server's
own load time to TTFT, i.e. ``(cold TTFT - warm TTFT) / own load <= 2``.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import aiohttp

from controlplane.bench import llmclient
from controlplane.bench.llm import REPO, _env
from controlplane.bench.llmmetrics import Record
from controlplane.bench.llmtrace import LlmRequest
from controlplane.bench.llmup import Up, write_text
from controlplane.runtime import procs

SPEC = REPO / "examples" / "gemma.yaml"
ASK = LlmRequest(0.0, 16, 8)


async def ttft(target: llmclient.Target) -> float:
    """One streamed request's time to first token (s)."""
    rec = Record(sent=time.monotonic())
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=600)) as s:
        await llmclient.one(s, target, ASK, rec)
    if not rec.ok:
        raise RuntimeError(f"request failed: {rec.error}")
    return rec.ttft()


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


async def standalone(model: Path) -> dict[str, float]:
    """The server alone on the model: exec to ready, then one TTFT."""
    port = _free_port()
    env = {**os.environ, "HOST": "127.0.0.1", "PORT": str(port)}
    t0 = time.monotonic()
    p = await procs.spawn(
        sys.executable, "-m", "llama_cpp.server", "--model", str(model),
        "--n_threads=1", "--n_threads_batch=1", "--chat_format=gemma",
        env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )  # fmt: skip
    try:
        async with aiohttp.ClientSession() as s, asyncio.timeout(300):
            while True:
                try:
                    async with s.get(f"http://127.0.0.1:{port}/v1/models") as r:
                        if r.status == 200:
                            break
                except aiohttp.ClientError:
                    pass
                await asyncio.sleep(0.05)  # polling readiness, as the node agent does
        ready = time.monotonic() - t0
        first = await ttft(llmclient.Target(f"http://127.0.0.1:{port}/v1", "gemma", "", "text"))
    finally:
        p.terminate()
        await p.wait()
    return {"own_load_s": ready, "standalone_ttft_s": first}


async def through_galaxy(run_dir: Path) -> dict[str, float]:
    """Cold (node cache empty), cold (node cache warm) and warm TTFTs."""
    up = Up(run_dir, 1, _env())
    await up.start()
    try:
        out: dict[str, float] = {}
        for key in ("cold_empty_cache_ttft_s", "cold_warm_cache_ttft_s"):
            await up.deploy(SPEC, 1, run_dir / "specs", cold=True)
            target = llmclient.Target(f"http://{up.gateway}/v1", "gemma", up.token, "text")
            out[key] = await ttft(target)
            if key.startswith("cold_warm"):
                out["warm_ttft_s"] = await ttft(target)
            else:
                await up.cli("delete", "gemma")
        return out
    finally:
        await up.stop()


async def main_async(out: Path) -> dict[str, Any]:
    """Both measurements; writes cold.json."""
    from controlplane.llm import realmodel

    model = realmodel.assemble(realmodel.DEFAULT_DEST)
    res: dict[str, Any] = await standalone(model)
    res.update(await through_galaxy(out / "run"))
    res["added_over_own_load"] = (res["cold_warm_cache_ttft_s"] - res["warm_ttft_s"]) / res[
        "own_load_s"
    ]
    res["date"] = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
    res["loadavg"] = list(os.getloadavg())
    write_text(out / "cold.json", json.dumps(res, indent=2) + "\n")
    return res


def main(argv: list[str] | None = None) -> int:
    """Run and print the figures."""
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--out", required=True)
    args = p.parse_args(argv)
    print(json.dumps(asyncio.run(main_async(Path(args.out))), indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
