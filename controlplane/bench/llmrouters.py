"""Galaxy's LLM request path against routers we did not write, on identical
backends and the Mooncake conversation trace (real arrival times and
512-token prefix-block hash ids, ``../shared/data/mooncake-2025``).

    python -m controlplane.bench.llmrouters --routers-venv /tmp/rvenv --instances 4 --minutes 2

The routers are PyPI's ``vllm-router`` and ``sglang-router`` (Rust, with a
Python launcher), installed in their own virtualenv
(``python3 -m venv V && V/bin/pip install vllm-router sglang-router``).
The instances ``galaxy up`` starts run the runtime's ``python3``: put the
environment holding Galaxy's dependencies first on ``PATH``.
Each contender gets ``--instances`` fresh emulated LLM servers (the same
server and ``--profile``; fresh, so no contender inherits another's prefix
cache) and the same requests, open loop through the bench's load generator:

- ``galaxy``: a real ``galaxy up`` whose gateway's OpenAI route routes to the
  function's instances (Dispatch picks; the node agents run the servers);
- ``vllm-router cache_aware`` / ``round_robin`` and ``sglang-router
  cache_aware``: the router in front of servers this command starts.

Prompts are text, so every router sees what it would see in production: a
request's prompt is its trace blocks in order, block ``h`` being ``h``'s own
word repeated for the block's tokens (512, the last block the remainder), so
two prompts share a text prefix exactly when they share leading hash ids, and
the emulated server (one token per word) finds the same prefix blocks.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

from controlplane.bench import llmclient
from controlplane.bench.emuserver import EmulatedServer, free_port, wait_ok
from controlplane.bench.llmmetrics import Limits, summarize
from controlplane.bench.llmtrace import LlmRequest
from controlplane.bench.llmup import Up
from controlplane.runtime import procs

REPO = Path(__file__).resolve().parents[2]
TRACE = REPO.parent / "shared" / "data" / "mooncake-2025" / "conversation_trace.jsonl"
SPEC = REPO / "experiments" / "llm" / "llama2-13b-emulated.yaml"
#: Tokens per trace block (the Mooncake trace's hash ids cover 512 tokens).
BLOCK = 512
#: (label, executable, arguments before the common ones)
ROUTERS = (
    ("vllm-router cache_aware", "vllm-router", ["--policy", "cache_aware"]),
    ("vllm-router round_robin", "vllm-router", ["--policy", "round_robin"]),
    ("sglang-router cache_aware", "sglang-router", ["launch", "--policy", "cache_aware"]),
)
READY_TIMEOUT_S = 60.0


def mooncake(path: Path, minutes: float, speed: float, max_prompt: int) -> list[LlmRequest]:
    """The trace's first ``minutes`` (time divided by ``speed``) as text
    requests; prompts are cut at ``max_prompt`` tokens."""
    out = []
    with path.open() as f:
        for line in f:
            r = json.loads(line)
            t = r["timestamp"] / 1000.0
            if t > minutes * 60:
                break
            n = min(int(r["input_length"]), max_prompt)
            words: list[str] = []
            for k, h in enumerate(r["hash_ids"]):
                take = min(BLOCK, n - k * BLOCK)
                if take <= 0:
                    break
                words += [f"h{h}"] * take
            text = " ".join(words)
            out.append(LlmRequest(t / speed, len(words) + 1, int(r["output_length"]), text=text))
    if not out:
        raise ValueError(f"trace: {path} holds no request in the first {minutes:g} min")
    return out


async def run_router(
    label: str, exe: Path, args: list[str], a: argparse.Namespace, jobs: list[LlmRequest]
) -> dict[str, Any]:
    """One external router in front of fresh emulated servers."""
    servers = [EmulatedServer(a.profile) for _ in range(a.instances)]
    proc = None
    try:
        await asyncio.gather(*(s.ready() for s in servers))
        port = free_port()
        cmd = [str(exe), *args, "--host", "127.0.0.1", "--port", str(port),
               "--prometheus-port", str(free_port()),
               "--worker-urls", *(s.url for s in servers)]  # fmt: skip
        proc = await procs.spawn(*cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        url = f"http://127.0.0.1:{port}"
        # /v1/models answers once the router reaches a worker.
        await wait_ok(url + "/v1/models", lambda: proc.returncode, "router", READY_TIMEOUT_S)
        return await _measure(label, llmclient.Target(url + "/v1", "emu", prompt="text"), jobs)
    finally:
        if proc is not None and proc.returncode is None:
            proc.terminate()
            await asyncio.wait_for(proc.wait(), 10)
        for s in servers:
            s.stop()


async def run_galaxy(a: argparse.Namespace, jobs: list[LlmRequest], tmp: Path) -> dict[str, Any]:
    """A real ``galaxy up`` with the function at ``--instances``."""
    up = Up(tmp / "run", a.nodes)
    await up.start()
    try:
        spec = tmp / "spec.yaml"
        text = SPEC.read_text().replace("llama2-13b-a100", a.profile)
        spec.write_text(text.replace("../../examples/", str(REPO / "examples") + "/"))
        name = await up.deploy(spec, a.instances, tmp)
        target = llmclient.Target(f"http://{up.gateway}/v1", name, up.token, prompt="text")
        return await _measure("galaxy", target, jobs)
    finally:
        await up.stop()


async def _measure(label: str, t: llmclient.Target, jobs: list[LlmRequest]) -> dict[str, Any]:
    records, wall = await llmclient.run(t, jobs)
    return {"label": label, **summarize(records, wall, Limits())}


def table(results: list[dict[str, Any]]) -> str:
    """Markdown: one row per contender, P90 TTFT against Galaxy's."""
    ref = next((r for r in results if r["label"] == "galaxy"), results[0])
    p90 = ref["latency_ms"]["ttft"]["p90"]
    lines = ["| contender | ok | errors | TTFT p50 ms | p90 ms | p99 ms | TPOT p50 ms | "
             "output tok/s | P90 TTFT / galaxy's |",
             "|---|---|---|---|---|---|---|---|---|"]  # fmt: skip
    for r in results:
        lat, rq = r["latency_ms"], r["requests"]
        lines.append(
            f"| {r['label']} | {rq['ok']} | {rq['errors']} | {lat['ttft']['p50']:.0f} | "
            f"{lat['ttft']['p90']:.0f} | {lat['ttft']['p99']:.0f} | {lat['tpot']['p50']:.1f} | "
            f"{r['throughput']['output_tokens_per_s']:.0f} | {lat['ttft']['p90'] / p90:.2f} |"
        )
    return "\n".join(lines)


async def main_async(a: argparse.Namespace) -> int:
    """Every contender in turn on the same requests."""
    jobs = mooncake(a.trace, a.minutes, a.speed, a.max_prompt_tokens)
    print(f"{len(jobs)} requests, {a.instances} instances of {a.profile} per contender",
          file=sys.stderr)  # fmt: skip
    results = []
    with tempfile.TemporaryDirectory(prefix="galaxy-routers-") as tmp:
        if "galaxy" in a.only:
            results.append(await run_galaxy(a, jobs, Path(tmp)))
        for label, exe, args in ROUTERS:
            if label.split()[0] in a.only:
                results.append(await run_router(label, a.routers_venv / "bin" / exe, args, a,
                                                jobs))  # fmt: skip
    if a.out:
        a.out.write_text(json.dumps(results, indent=1))
    print(table(results))
    return 0


def main(argv: list[str] | None = None) -> int:
    """Command line."""
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--routers-venv", type=Path, required=True,
                   help="virtualenv holding vllm-router and sglang-router")  # fmt: skip
    p.add_argument("--instances", type=int, default=4)
    p.add_argument("--nodes", type=int, default=2, help="galaxy up's nodes")
    p.add_argument("--profile", default="llama2-13b-a100", help="emulated server profile")
    p.add_argument("--minutes", type=float, default=2.0, help="of the trace, from its start")
    p.add_argument("--speed", type=float, default=1.0, help="time compression of the trace")
    p.add_argument("--max-prompt-tokens", type=int, default=32768)
    p.add_argument("--trace", type=Path, default=TRACE)
    p.add_argument("--only", nargs="+", default=["galaxy", "vllm-router", "sglang-router"],
                   choices=["galaxy", "vllm-router", "sglang-router"])  # fmt: skip
    p.add_argument("--out", type=Path, help="write the results as JSON here")
    a = p.parse_args(argv)
    for name in ("instances", "nodes", "minutes", "speed", "max_prompt_tokens"):
        if not getattr(a, name) > 0:
            p.error(f"--{name.replace('_', '-')}: must be > 0")
    if not a.trace.is_file():
        p.error(f"--trace: no such file: {a.trace}")
    for _, exe, _ in ROUTERS:
        if not (a.routers_venv / "bin" / exe).is_file():
            p.error(f"--routers-venv: no bin/{exe} in {a.routers_venv}")
    try:
        return asyncio.run(main_async(a))
    except (RuntimeError, ValueError, OSError) as e:
        print(f"llmrouters: {e}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    os.environ.setdefault("PYTHONUNBUFFERED", "1")
    sys.exit(main())
