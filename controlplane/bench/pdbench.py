"""Disaggregated against aggregated LLM serving on the real request path.

One `galaxy up --sandbox process` with two nodes runs both deployments of
the same emulated model side by side, at the same instance count:

* **aggregated**: ``agg``, two instances, each prefilling and decoding;
* **disaggregated**: ``pd-prefill`` (one instance) and ``pd-decode`` (one
  instance, ``pd: {prefill: pd-prefill}``): every prompt runs on the prefill
  instance, its KV cache (real bytes, ``--kv-scale`` smaller than the
  model's) moves to the decode instance, which only decodes.

Two mixes, each sent open loop (Poisson) through the gateway's OpenAI route
as streaming chat completions, one deployment at a time: **prefill-heavy**
(long prompts, few output tokens) and **decode-heavy** (short prompts, many
output tokens). TTFT and TPOT as the LLM bench defines them
(``llmmetrics``: TPOT excludes the first token); the gateway's
``galaxy_gateway_pd_total`` shows how many were really disaggregated.

    python -m controlplane.bench.pdbench --out results/pd
"""

from __future__ import annotations

import argparse
import asyncio
import json
import random
import sys
from collections.abc import Callable, Coroutine
from pathlib import Path
from typing import Any

import aiohttp
import yaml

from controlplane.bench import llmclient
from controlplane.bench import llmmetrics as mt
from controlplane.bench.llmtrace import LlmRequest
from controlplane.bench.llmup import Up, write_results

REPO = Path(__file__).resolve().parents[2]
ARTIFACT = str(REPO / "examples" / "llm_emulated.py")
#: (name, prompt tokens, output tokens, default rate per second)
MIXES = {
    "prefill-heavy": (4000, 32, 1.5),
    "decode-heavy": (200, 256, 4.0),
}


def spec(name: str, profile: str, kv_scale: float, n: int, **extra: object) -> dict[str, Any]:
    """An emulated LLM function's spec at n instances."""
    return {
        "name": name,
        "public": True,
        "runtime": "llm-emulated",
        "artifact": ARTIFACT,
        "args": [f"--profile={profile}", f"--kv-scale={kv_scale:g}", "--kv-inbox-mb=256"],
        # Room for the inbox's 256 MiB of caches besides the server itself.
        "resources": {"cpu_millis": 100, "memory_mib": 512},
        "min_scale": n,
        "max_scale": n,
        **extra,
    }


def poisson(n: int, rate: float, prompt: int, output: int, seed: int) -> list[LlmRequest]:
    """n requests at Poisson ``rate``/s; each prompt distinct (no prefix hits)."""
    rnd = random.Random(seed)
    t, out = 0.0, []
    for j in range(n):
        t += rnd.expovariate(rate)
        blocks = tuple(f"r{seed}.{j}.{b}" for b in range(prompt // 16))
        out.append(LlmRequest(t, prompt, output, prefix_blocks=blocks))
    return out


async def pd_outcomes(metrics: str) -> dict[str, float]:
    """The gateway's disaggregation outcomes so far (metrics: the address of
    its /metrics)."""
    async with (
        aiohttp.ClientSession() as s,
        s.get(f"http://{metrics}/metrics") as r,
    ):
        text = await r.text()
    out = {}
    for line in text.splitlines():
        if line.startswith("galaxy_gateway_pd_total{"):
            label, value = line.rsplit(" ", 1)
            out[label.split('"')[1]] = float(value)
    return out


async def deploy(up: Up, doc: dict[str, Any], out: Path) -> str:
    """Deploy a spec document (its instance count: min_scale)."""
    path = out / "specs" / f"{doc['name']}.yaml"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(yaml.safe_dump(doc))
    return await up.deploy(path, int(doc["min_scale"]), out / "specs")


async def run(a: argparse.Namespace, out: Path) -> list[dict[str, Any]]:
    """Both deployments on one control plane; each mix against each."""
    up = Up.processes(out / "run", 2)
    await up.start()
    results = []
    try:
        agg = await deploy(up, spec("agg", a.profile, a.kv_scale, 2), out)
        pre = await deploy(up, spec("pd-prefill", a.profile, a.kv_scale, 1), out)
        dec = spec("pd-decode", a.profile, a.kv_scale, 1, pd={"prefill": pre})
        pd = await deploy(up, dec, out)
        placed = json.loads(await up.cli("status", "-o", "json"))
        nodes = {
            i["instance"]["instance_id"]: i["instance"]["node_id"] for i in placed["instances"]
        }
        for k, mix in enumerate(a.mixes.split(",")):
            prompt, output, rate = MIXES[mix]
            schedule = poisson(a.requests, a.rate or rate, prompt, output, seed=k + 1)
            for mode, fn in (("aggregated", agg), ("disaggregated", pd)):
                before = await pd_outcomes(up.gateway_metrics)
                target = llmclient.Target(f"http://{up.gateway}/v1", fn, up.token, "tokens")
                records, wall = await llmclient.run(target, schedule)
                after = await pd_outcomes(up.gateway_metrics)
                s = mt.summarize(records, wall, mt.Limits(None, None))
                s |= {"mix": mix, "mode": mode, "rate": a.rate or rate,
                      "prompt_tokens": prompt, "output_tokens": output,
                      "pd": {o: after.get(o, 0) - before.get(o, 0) for o in after}}  # fmt: skip
                results.append(s)
                print(row(s), flush=True)
        results.append({"placement": nodes})
    finally:
        await up.stop()
    return results


def row(r: dict[str, Any]) -> str:
    """One Markdown table row."""
    t, p, e = (r["latency_ms"][k] for k in ("ttft", "tpot", "e2e"))
    moved = int(r["pd"].get("disaggregated", 0))
    return (
        f"| {r['mix']} ({r['prompt_tokens']} in / {r['output_tokens']} out, {r['rate']:g}/s) | "
        f"{r['mode']} | {r['requests']['ok']} / {r['requests']['sent']} | {moved} | "
        f"{t['p50']:.0f} / {t['p99']:.0f} | {p['p50']:.1f} / {p['p99']:.1f} | "
        f"{e['p50']:.0f} / {e['p99']:.0f} |"
    )


HEADER = (
    "| mix | serving | ok / sent | disaggregated | TTFT p50 / p99 ms | TPOT p50 / p99 ms | "
    "E2E p50 / p99 ms |\n|---|---|---|---|---|---|---|"
)


def parser(doc: str, mixes: dict[str, Any]) -> argparse.ArgumentParser:
    """The command line both P/D benches share (``--out``, ``--mixes`` of
    mixes' names, checked by ``parse``); doc: the module's docstring."""
    ap = argparse.ArgumentParser(description=doc.split("\n\n")[0])
    ap.add_argument("--out", required=True)
    ap.add_argument("--mixes", default=",".join(mixes))
    return ap


def parse(ap: argparse.ArgumentParser, argv: list[str] | None, mixes: dict[str, Any]) -> Any:
    """The parsed arguments; an error naming ``--mixes`` for an unknown mix."""
    a = ap.parse_args(argv)
    bad = set(a.mixes.split(",")) - set(mixes)
    if bad:
        ap.error(f"--mixes: unknown {sorted(bad)} (known: {', '.join(mixes)})")
    return a


def main(argv: list[str] | None = None) -> int:
    """Command line."""
    ap = parser(__doc__, MIXES)
    ap.add_argument("--requests", type=int, default=60)
    ap.add_argument("--rate", type=float, default=0.0, help="requests/s (0: the mix's)")
    ap.add_argument("--profile", default="llama2-13b-a100")
    ap.add_argument("--kv-scale", type=float, default=256.0,
                    help="the emulated caches' bytes divided by this")  # fmt: skip
    a = parse(ap, argv, MIXES)
    if not 1 <= a.requests <= 10_000 or a.rate < 0 or a.kv_scale < 1:
        ap.error("--requests 1..10000, --rate >= 0, --kv-scale >= 1")
    return run_and_write(a, run, HEADER, row)


def run_and_write(
    a: Any,
    run: Callable[[Any, Path], Coroutine[Any, Any, list[dict[str, Any]]]],
    header: str,
    row: Callable[[dict[str, Any]], str],
) -> int:
    """Run a P/D bench, printing its table as it goes, and write its
    results and report to ``--out``; the exit status."""
    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    print(header, flush=True)
    results = asyncio.run(run(a, out))
    rows = [row(r) for r in results if "mode" in r]
    write_results(out, a, results, "\n".join([header, *rows]))
    return 0


if __name__ == "__main__":
    sys.exit(main())
