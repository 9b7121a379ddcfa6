"""Cross-check of the LLM bench's measurements against a tool we did not
write (PyPI ``guidellm``), on the same endpoint and the same load.

    python -m controlplane.bench.llmcrosscheck --guidellm /path/to/venv/bin/guidellm

guidellm pins its own ``transformers``, so it lives in its own virtualenv
(``python3 -m venv V && V/bin/pip install guidellm``); this command is given
its executable. Each tool gets a fresh emulated LLM server (so neither sees
the other's prefix cache) and the same requests: ``--requests`` chat
completions of ``--prompt-tokens`` words (one token each, as the emulated
server counts) and ``--output-tokens`` tokens, sent open loop at a constant
``--rate``. guidellm needs a Hugging Face tokenizer, which this machine
cannot download: a word-level one (one token per whitespace-separated word,
the emulated server's rule) is built with the ``tokenizers`` package of
guidellm's own virtualenv.

Both tools' per-request figures go through the bench's own statistics
(``llmmetrics.stats``), so what is compared is the measurement, not two
percentile methods. Definitions: the bench's TPOT is (end - first token) /
(tokens - 1) (vLLM's); guidellm calls that ITL, and its own "TPOT" is
(end - send) / tokens, first token included (reported here as
``tpot_incl_first``, not compared).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

from controlplane.bench import llmclient
from controlplane.bench.emuserver import EmulatedServer
from controlplane.bench.llmmetrics import Limits, stats, summarize
from controlplane.bench.llmtrace import LlmRequest

#: The agreement the LLM issue asks for.
TOLERANCE = 0.10
#: The figures compared: (label, bench key, guidellm per-request field).
COMPARED = (
    ("ttft", "ttft", "time_to_first_token_ms"),
    ("tpot", "tpot", "inter_token_latency_ms"),
    ("e2e", "e2e", "request_latency"),
)
_TOKENIZER = """
import sys
from tokenizers import Tokenizer, decoders, models, pre_tokenizers
from transformers import PreTrainedTokenizerFast
words = sys.argv[2].split(",")
tok = Tokenizer(models.WordLevel({w: i for i, w in enumerate(words)}, unk_token="[UNK]"))
tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
tok.decoder = decoders.WordPiece(prefix="##")  # joins words with spaces
PreTrainedTokenizerFast(tokenizer_object=tok, unk_token="[UNK]").save_pretrained(sys.argv[1])
"""


def prompt_text(n: int) -> str:
    """The prompt both tools send: n words (the bench's text form)."""
    return llmclient.text_prompt(n)


def run_guidellm(exe: Path, url: str, a: argparse.Namespace, work: Path) -> list[dict[str, Any]]:
    """guidellm's successful per-request records for the load of ``a``."""
    rows = [{"prompt": prompt_text(a.prompt_tokens), "prompt_tokens_count": a.prompt_tokens,
             "output_tokens_count": a.output_tokens}] * a.requests  # fmt: skip
    (work / "requests.json").write_text(json.dumps(rows))
    tok = work / "tokenizer"
    vocab = ",".join(["[UNK]", "user:", *sorted(set(prompt_text(a.prompt_tokens).split()))])
    subprocess.run([str(exe.parent / "python"), "-c", _TOKENIZER, str(tok), vocab], check=True)
    out = work / "guidellm.json"
    cmd = [str(exe), "run", "--backend", f"kind=openai_http,target={url}",
           "--profile", f"kind=constant,rate={a.rate}",
           "--data", f"kind=json_file,path={work / 'requests.json'}",
           "--tokenizer", f"kind=huggingface_auto,model={tok}",
           "--constraint", f"kind=max_requests,count={a.requests}",
           "--disable-console", "--output", f"kind=json,path={out}"]  # fmt: skip
    subprocess.run(cmd, check=True, stdout=subprocess.DEVNULL, cwd=work)
    bench = json.loads(out.read_text())["benchmarks"][0]
    errored = len(bench["requests"].get("errored") or [])
    if errored:
        raise RuntimeError(f"guidellm: {errored} of {a.requests} requests failed")
    return list(bench["requests"]["successful"])


def guidellm_figures(records: list[dict[str, Any]]) -> dict[str, dict[str, float]]:
    """guidellm's per-request values through the bench's statistics (ms)."""
    out = {}
    for label, _, field in COMPARED:
        to_s = 1.0 if field == "request_latency" else 1e-3  # its latency is in s, the rest ms
        out[label] = stats([r[field] * to_s for r in records if r.get(field) is not None])
    incl = [r["time_per_output_token_ms"] / 1000.0 for r in records
            if r.get("time_per_output_token_ms") is not None]  # fmt: skip
    out["tpot_incl_first"] = stats(incl)
    return out


async def run_bench(url: str, a: argparse.Namespace) -> dict[str, dict[str, float]]:
    """The bench's load generator on the same load: its figures (ms)."""
    schedule = [LlmRequest(i / a.rate, a.prompt_tokens, a.output_tokens)
                for i in range(a.requests)]  # fmt: skip
    target = llmclient.Target(url + "/v1", "emu", prompt="text")
    records, wall = await llmclient.run(target, schedule)
    s = summarize(records, wall, Limits())
    if s["requests"]["errors"]:
        raise RuntimeError(f"bench: {s['errors_by_kind']}")
    return {label: s["latency_ms"][key] for label, key, _ in COMPARED}


def compare(ours: dict[str, dict[str, float]], theirs: dict[str, dict[str, float]]) -> list[str]:
    """A Markdown table of both and their ratio; a row per figure."""
    lines = ["| figure | bench (ms) | guidellm (ms) | bench/guidellm |", "|---|---|---|---|"]
    for label, _, _ in COMPARED:
        for q in ("mean", "p50", "p95"):
            b, g = ours[label][q], theirs[label][q]
            lines.append(f"| {label} {q} | {b:.2f} | {g:.2f} | {b / g:.3f} |")
    incl = theirs["tpot_incl_first"]["mean"]
    lines.append(f"| guidellm TPOT incl. first token, mean | - | {incl:.2f} | - |")
    return lines


def within(ours: dict[str, dict[str, float]], theirs: dict[str, dict[str, float]]) -> bool:
    """Every compared mean and p50 within TOLERANCE of guidellm's."""
    return all(
        abs(ours[label][q] / theirs[label][q] - 1) <= TOLERANCE
        for label, _, _ in COMPARED
        for q in ("mean", "p50")
    )


async def main_async(a: argparse.Namespace) -> int:
    """Both tools, each on its own fresh server; prints the table."""
    results: dict[str, dict[str, dict[str, float]]] = {}
    with tempfile.TemporaryDirectory(prefix="galaxy-crosscheck-") as tmp:
        for tool in ("guidellm", "bench"):
            server = EmulatedServer(a.profile)
            try:
                await server.ready()
                if tool == "guidellm":
                    recs = await asyncio.to_thread(run_guidellm, a.guidellm, server.url, a,
                                                   Path(tmp))  # fmt: skip
                    results[tool] = guidellm_figures(recs)
                else:
                    results[tool] = await run_bench(server.url, a)
            finally:
                server.stop()
    print("\n".join(compare(results["bench"], results["guidellm"])))
    ok = within(results["bench"], results["guidellm"])
    print(f"\nmeans and medians within {TOLERANCE:.0%}: {'yes' if ok else 'NO'}")
    return 0 if ok else 1


def main(argv: list[str] | None = None) -> int:
    """Command line."""
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--guidellm", type=Path, required=True,
                   help="the guidellm executable (in its own virtualenv)")  # fmt: skip
    p.add_argument("--profile", default="smollm2-135m-cpu", help="emulated server profile")
    p.add_argument("--rate", type=float, default=1.0, help="requests per second")
    p.add_argument("--requests", type=int, default=30)
    p.add_argument("--prompt-tokens", type=int, default=200)
    p.add_argument("--output-tokens", type=int, default=50)
    a = p.parse_args(argv)
    if not a.guidellm.is_file():
        p.error(f"--guidellm: no such file: {a.guidellm}")
    for name in ("rate", "requests", "prompt_tokens", "output_tokens"):
        if not getattr(a, name) > 0:
            p.error(f"--{name.replace('_', '-')}: must be > 0")
    try:
        return asyncio.run(main_async(a))
    except (RuntimeError, subprocess.CalledProcessError, OSError) as e:
        print(f"crosscheck: {e}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
