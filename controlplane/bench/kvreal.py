"""The real model's KV state moved between a prefill and a decode instance
on each path, against the path's floor (bytes / the path's own measured
throughput, measured with a plain socket stream of at least 64 MiB), the
same paths and floor as ``controlplane.bench.kvtransfer``.

    python -m controlplane.bench.kvreal --prompt-tokens 1400 --rate-mbit 1000

A prefill instance of the real model (``controlplane.llm.realserver``, this
namespace) evaluates a prompt and PUTs llama.cpp's state of it (realkv) to a
decode instance of the same model: on the same node over its Unix socket and
over TCP loopback, and on another host (a network namespace behind a veth)
unshaped and shaped to ``--rate-mbit`` with ``tc``. ``transfer_s`` is what
the prefill instance reports for the PUT. On each path the first state is
decoded from (a few greedy tokens, checked equal to the prefill instance
decoding alone, with one prompt token evaluated on the decode side); the
others are deleted once landed. Needs root and the ``llm`` extra.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import sys
import tempfile
import urllib.request
from pathlib import Path
from typing import Any

from controlplane.bench import kvtransfer as kt
from controlplane.bench.llmup import write_text
from controlplane.bench.shapedlink import ShapedHost

PREFILL_PORT = kt.PORT + 10
GOAL_X = 1.5
LINK_PROBE = 64 * kt.MIB
ASK: dict[str, Any] = {"max_tokens": 6, "temperature": 0, "seed": 7}


def _call(url: str, body: dict[str, Any] | None = None, method: str = "POST") -> Any:
    data = None if body is None else json.dumps(body).encode()
    req = urllib.request.Request(url, data=data, method=method)
    with urllib.request.urlopen(req, timeout=600) as r:
        raw = r.read()
    return json.loads(raw) if raw else None


def prompt_of(tokens: int) -> str:
    """A prompt of about ``tokens`` tokens (numbered sentences: ~15 tokens each)."""
    return " ".join(f"Step {i}: the keeper lit lamp {i} at dusk." for i in range(tokens // 15))


def _path_rows(
    prefill: str, path: kt.Path_, prompt: str, alone: str, trials: int
) -> dict[str, Any]:
    moved = []
    for trial in range(trials):
        r = _call(prefill + "/v1/pd/prefill", {"prompt": prompt, "galaxy_decode": path.target})
        moved.append(r)
        if trial == 0:  # decode on from it once: the state is the prompt's
            out = _call(path.http + "/v1/completions",
                        {"prompt": prompt, **ASK, "galaxy_kv_id": r["kv_id"]})  # fmt: skip
            if out["choices"][0]["text"] != alone:
                raise RuntimeError(f"{path.name}: decoding from the moved state differs")
            if out["usage"]["galaxy_evaluated_prompt_tokens"] != 1:
                raise RuntimeError(f"{path.name}: the decode instance evaluated the prompt")
        else:
            _call(f"{path.http}/v1/kv/{r['kv_id']}", method="DELETE")
    size = moved[0]["kv_bytes"]
    # The link's throughput as kvtransfer measures it: a plain stream, large
    # enough that connection set-up and the shaper's burst do not count.
    probe = max(size, LINK_PROBE)
    bw = statistics.median(kt._raw_throughput(path.sink, probe) for _ in range(trials))
    secs = statistics.median(m["transfer_s"] for m in moved)
    return {"path": path.name, "bytes": size, "prompt_tokens": moved[0]["prompt_tokens"],
            "seconds": secs, "trials": [m["transfer_s"] for m in moved],
            "floor_seconds": size / bw, "x_floor": secs * bw / size,
            "path_bytes_per_s": bw,
            "prefill_s": statistics.median(m["prefill_s"] for m in moved)}  # fmt: skip


def run(model: Path, prompt_tokens: int, rate_mbit: float, trials: int) -> dict[str, Any]:
    """Every path; the report (see the module docstring)."""
    prompt = prompt_of(prompt_tokens)
    n_ctx = str(max(512, 2 * prompt_tokens))
    server = ("-m", "controlplane.llm.realserver", "--model", str(model), "--n_ctx", n_ctx)
    work = Path(tempfile.mkdtemp(prefix="galaxy-bench-kvreal-"))
    rows: list[dict[str, Any]] = []
    env = dict(os.environ, HOST="127.0.0.1", PORT=str(PREFILL_PORT))
    pre = kt._spawn((), list(server), env)
    try:
        prefill = f"http://127.0.0.1:{PREFILL_PORT}"
        kt._await_http(prefill, pre, within_s=300)
        alone = _call(prefill + "/v1/completions", {"prompt": prompt, **ASK})["choices"][0]["text"]
        unix = str(work / "sink.sock")
        with kt._host((), "127.0.0.1", 256, unix, server):
            http = f"http://127.0.0.1:{kt.PORT}"
            for p in (kt.Path_("same node, Unix socket", f"unix:{unix}.kv", ("unix", unix), http),
                      kt.Path_("same node, TCP loopback", http,
                               ("tcp", f"127.0.0.1:{kt.SINK_PORT}"), http)):  # fmt: skip
                rows.append(_path_rows(prefill, p, prompt, alone, trials))
        for rate in (None, rate_mbit):
            with (
                ShapedHost(rate, prefix="galaxy-kvr") as host,
                kt._host(host.exec_prefix, host.host_ip, 256, None, server),
            ):
                name = "other host, veth" + ("" if rate is None else f" shaped {rate:g} Mbit/s")
                http = f"http://{host.host_ip}:{kt.PORT}"
                far = kt.Path_(name, http, ("tcp", f"{host.host_ip}:{kt.SINK_PORT}"), http)
                rows.append(_path_rows(prefill, far, prompt, alone, trials))
    finally:
        pre.kill()
        pre.wait(timeout=10)
        shutil.rmtree(work, ignore_errors=True)
    return {"rate_mbit": rate_mbit, "trials": trials, "goal_x_floor": GOAL_X, "rows": rows}


def main(argv: list[str] | None = None) -> int:
    """Command line of ``python -m controlplane.bench.kvreal``."""
    from controlplane.llm import realmodel

    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--model", type=realmodel.existing, default=str(realmodel.DEFAULT_DEST),
                   help="the GGUF file")  # fmt: skip
    p.add_argument("--prompt-tokens", type=int, default=1400)
    p.add_argument("--rate-mbit", type=float, default=1000.0, help="the shaped link's rate")
    p.add_argument("--trials", type=int, default=3)
    p.add_argument("--out", default=None, help="write the report as JSON here")
    a = p.parse_args(argv)
    if not 32 <= a.prompt_tokens <= 16384 or not a.rate_mbit > 0 or not 1 <= a.trials <= 20:
        p.error("--prompt-tokens 32..16384, --rate-mbit > 0, --trials 1..20")
    if os.geteuid() != 0:
        print("kvreal bench: needs root (network namespaces and tc)", file=sys.stderr)
        return 2
    r = run(a.model, a.prompt_tokens, a.rate_mbit, a.trials)
    print(kt.render(r))
    if a.out:
        write_text(Path(a.out), json.dumps(r, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
