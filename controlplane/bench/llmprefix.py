"""LLM routing through the real request path: the LLM picker against
least-request (and round-robin) on a shared-prefix mix, each on its own
`galaxy up` with the same emulated fleet.

Several long system prompts, many users each (``shared_prefix``): a request
is one system prompt plus its own user part, Poisson arrivals, sent open
loop as streaming chat completions through the gateway's OpenAI routes; the
emulated server reads the prompt as ``galaxy_prefix_blocks`` and the gateway
hints Dispatch with the leading ones. The only difference between the runs
is Dispatch's ``--llm-picker`` (``$GALAXY_LLM_PICKER``).

    python -m controlplane.bench.llmprefix --out results/llm-prefix
"""

from __future__ import annotations

import argparse
import asyncio
import random
import sys
from pathlib import Path
from typing import Any

from controlplane.bench import llmclient
from controlplane.bench import llmmetrics as mt
from controlplane.bench.llm import _env
from controlplane.bench.llmtrace import LlmRequest
from controlplane.bench.llmup import Up, write_results

REPO = Path(__file__).resolve().parents[2]
SPEC = REPO / "experiments" / "llm" / "llama2-13b-emulated.yaml"
BLOCK_TOKENS = 16


def shared_prefix(
    n: int,
    rate: float,
    prompts: int,
    system_tokens: int,
    user_tokens: int,
    output_tokens: int,
    seed: int = 1,
) -> list[LlmRequest]:
    """``n`` requests at Poisson ``rate``/s, each one of ``prompts`` system
    prompts (uniform) and its own user part, as block ids."""
    rnd = random.Random(seed)
    t, out = 0.0, []
    for j in range(n):
        t += rnd.expovariate(rate)
        s = rnd.randrange(prompts)
        blocks = tuple(f"s{s}.{b}" for b in range(system_tokens // BLOCK_TOKENS))
        blocks += tuple(f"s{s}.u{j}.{b}" for b in range(user_tokens // BLOCK_TOKENS))
        out.append(LlmRequest(t, system_tokens + user_tokens, output_tokens, prefix_blocks=blocks))
    return out


async def one_policy(
    policy: str, a: argparse.Namespace, schedule: list[LlmRequest], out: Path
) -> dict[str, Any]:
    """Start Galaxy with Dispatch's picker set to ``policy``, deploy the
    fleet, replay the schedule; the summary."""
    up = Up(out / f"run-{policy}", a.nodes, {**_env(), "GALAXY_LLM_PICKER": policy})
    await up.start()
    try:
        name = await up.deploy(SPEC, a.instances, out / "specs")
        target = llmclient.Target(f"http://{up.gateway}/v1", name, up.token, "tokens")
        records, wall = await llmclient.run(target, schedule)
    finally:
        await up.stop()
    s = mt.summarize(records, wall, mt.Limits(a.ttft_s, None))
    s["policy"] = policy
    return s


def table(results: list[dict[str, Any]]) -> str:
    """A Markdown table of the runs, ratios against least-request."""
    base = next((r for r in results if r["policy"] == "least-request"), results[0])
    bp99 = base["latency_ms"]["ttft"]["p99"]
    btok = base["throughput"]["output_tokens_per_s"]
    lines = [
        "| picker | ok / sent | TTFT p50 ms | p90 ms | p99 ms | output tok/s | "
        "p99 vs least-request | tok/s vs least-request |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for r in results:
        t, q = r["latency_ms"]["ttft"], r["throughput"]
        lines.append(
            f"| {r['policy']} | {r['requests']['ok']} / {r['requests']['sent']} | "
            f"{t['p50']:.0f} | {t['p90']:.0f} | {t['p99']:.0f} | "
            f"{q['output_tokens_per_s']:.0f} | {bp99 / t['p99']:.2f}x | "
            f"{q['output_tokens_per_s'] / btok:.2f}x |"
        )
    return "\n".join(lines)


async def run_all(a: argparse.Namespace, out: Path) -> list[dict[str, Any]]:
    """Every policy of ``a.policies`` on the same schedule, one after another."""
    schedule = shared_prefix(
        a.requests, a.rate, a.prompts, a.system_tokens, a.user_tokens, a.output_tokens
    )
    return [await one_policy(p, a, schedule, out) for p in a.policies.split(",")]


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", required=True)
    ap.add_argument("--policies", default="least-request,llm")
    ap.add_argument("--nodes", type=int, default=1)
    ap.add_argument("--instances", type=int, default=3)
    ap.add_argument("--requests", type=int, default=160)
    ap.add_argument("--rate", type=float, default=4.0, help="requests/s (Poisson)")
    ap.add_argument("--prompts", type=int, default=12, help="distinct system prompts")
    ap.add_argument("--system-tokens", type=int, default=6000)
    ap.add_argument("--user-tokens", type=int, default=300)
    ap.add_argument("--output-tokens", type=int, default=32)
    ap.add_argument("--ttft-s", type=float, default=1.0, help="goodput's TTFT limit")
    a = ap.parse_args(argv)
    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    results = asyncio.run(run_all(a, out))
    text = table(results)
    write_results(out, a, results, text)
    print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
