"""The real model disaggregated against aggregated through Galaxy: Gemma 3
270M on llama.cpp (``llama-cpp-galaxy``, the ``llm`` extra), one `galaxy
up` (the default sandbox unless ``--sandbox``), equal instance counts:

* **aggregated**: ``gm-agg``, two instances, each prefilling and decoding;
* **disaggregated**: ``gm-pf`` (one instance) and ``gm-dc`` (one instance,
  ``pd: {prefill: gm-pf}``): the prompt runs on the prefill instance,
  llama.cpp's state of it moves to the decode instance (through the node's
  KV relay under bubblewrap), which evaluates one prompt token and decodes.

Two mixes, sent with the `openai` client through the gateway as
completions (this runtime does not stream, so the latency is the whole
request's: E2E; per output token is E2E over completion tokens):
**prefill-heavy** (a long prompt, few tokens out) and **decode-heavy** (a
short prompt, many out). Interleaved rounds: each round sends
``--concurrency`` requests to one deployment, waits, then the same to the
other, the order alternating, so the machine's other load falls on both
alike; ratios from one such run are what it reports.

    python -m controlplane.bench.pdreal --out results/pd-real --rounds 8
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import sys
import time
from pathlib import Path
from typing import Any

import openai
import yaml

from controlplane.bench.llmclient import text_prompt
from controlplane.bench.llmup import Up
from controlplane.bench.pdbench import parse, parser, pd_outcomes, run_and_write

#: mix -> (prompt words, output tokens)
MIXES = {"prefill-heavy": (700, 4), "decode-heavy": (20, 48)}


def spec(out: Path, name: str, n: int, **extra: object) -> Path:
    """A spec file of the real model at n instances."""
    from controlplane.llm import realmodel

    model = realmodel.assemble(realmodel.DEFAULT_DEST)
    m = realmodel.GEMMA3_270M
    doc = {"name": name, "public": True, "runtime": "llama-cpp-galaxy",
           "args": ["--n_ctx=1536"], "min_scale": n, "max_scale": n,
           # Four instances within the default namespace quota (half the
           # node's CPU): half a core each, alike in both deployments.
           "resources": {"cpu_millis": 500, "memory_mib": 768},
           "model": {"uri": str(model), "format": "gguf", "sha256": m.sha256,
                     "size_bytes": m.size_bytes}, **extra}  # fmt: skip
    path = out / "specs" / f"{name}.yaml"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(yaml.safe_dump(doc))
    return path


async def one(c: openai.AsyncOpenAI, model: str, prompt: str, out: int) -> dict[str, Any]:
    """One completion: its latency and usage."""
    t0 = time.perf_counter()
    got = await c.completions.create(model=model, prompt=prompt, max_tokens=out,
                                     temperature=0, extra_body={"seed": 7})  # fmt: skip
    e2e = time.perf_counter() - t0
    assert got.usage is not None
    extra = got.usage.model_extra or {}
    return {"e2e_s": e2e, "completion_tokens": got.usage.completion_tokens,
            "prefilled_elsewhere": "galaxy_prefill_instance" in extra}  # fmt: skip


def summary(rows: list[dict[str, Any]]) -> dict[str, Any]:
    """Medians and p90 of a deployment's requests on one mix."""
    e2e = sorted(r["e2e_s"] for r in rows)
    per = sorted(r["e2e_s"] / max(1, r["completion_tokens"]) for r in rows)
    return {"n": len(rows), "e2e_p50_s": statistics.median(e2e),
            "e2e_p90_s": e2e[min(len(e2e) - 1, int(0.9 * len(e2e)))],
            "per_token_p50_s": statistics.median(per),
            "disaggregated": sum(r["prefilled_elsewhere"] for r in rows)}  # fmt: skip


async def run(a: argparse.Namespace, out: Path) -> list[dict[str, Any]]:
    """Both deployments on one control plane, each mix in interleaved rounds."""
    py = str(Path(sys.executable).parent)
    args = ("--sandbox", a.sandbox) if a.sandbox else ()
    up = Up(out / "run", 1, {"PATH": f"{py}:/usr/bin:/bin"}, args)
    await up.start()
    results: list[dict[str, Any]] = []
    try:
        agg = await up.deploy(spec(out, "gm-agg", 2), 2, out)
        pf = await up.deploy(spec(out, "gm-pf", 1), 1, out)
        dc = await up.deploy(spec(out, "gm-dc", 1, pd={"prefill": pf}), 1, out)
        c = openai.AsyncOpenAI(base_url=f"http://{up.gateway}/v1", api_key=up.token, timeout=600)
        for mix in a.mixes.split(","):
            words, n_out = MIXES[mix]
            got: dict[str, list[dict[str, Any]]] = {"aggregated": [], "disaggregated": []}
            for k in range(a.rounds):
                order = [("aggregated", agg), ("disaggregated", dc)]
                for mode, fn in order if k % 2 == 0 else order[::-1]:
                    # Distinct prompts: llama.cpp keeps no cache across requests
                    # here, but the text should not repeat either.
                    batch = [one(c, fn, f"{k} {i} " + text_prompt(words), n_out)
                             for i in range(a.concurrency)]  # fmt: skip
                    got[mode] += await asyncio.gather(*batch)
            for mode, rows in got.items():
                s = summary(rows) | {"mix": mix, "mode": mode, "words": words, "out": n_out}
                results.append(s)
                print(row(s), flush=True)
        await c.close()
        results.append({"pd_outcomes": await pd_outcomes(up.gateway_metrics)})
    finally:
        await up.stop()
    return results


def row(s: dict[str, Any]) -> str:
    """One Markdown table row."""
    return (
        f"| {s['mix']} ({s['words']} words in / {s['out']} out) | {s['mode']} | {s['n']} | "
        f"{s['disaggregated']} | {1000 * s['e2e_p50_s']:.0f} / {1000 * s['e2e_p90_s']:.0f} | "
        f"{1000 * s['per_token_p50_s']:.0f} |"
    )


HEADER = (
    "| mix | serving | requests | disaggregated | E2E p50 / p90 ms | per output token p50 ms |"
    "\n|---|---|---|---|---|---|"
)


def main(argv: list[str] | None = None) -> int:
    """Command line."""
    ap = parser(__doc__, MIXES)
    ap.add_argument("--rounds", type=int, default=8, help="rounds per deployment and mix")
    ap.add_argument("--concurrency", type=int, default=2, help="requests per round")
    ap.add_argument("--sandbox", default="", help="galaxy up --sandbox (default: its default)")
    a = parse(ap, argv, MIXES)
    if not 1 <= a.rounds <= 200 or not 1 <= a.concurrency <= 8:
        ap.error("--rounds 1..200, --concurrency 1..8")
    return run_and_write(a, run, HEADER, row)


if __name__ == "__main__":
    sys.exit(main())
