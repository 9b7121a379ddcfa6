"""`galaxy bench` on the shipped LLM bench file in a short form, end to end:
a real `galaxy up`, the emulated LLM server deployed at two instances, a few
seconds of the Azure LLM trace through the gateway, and the report's
figures."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from controlplane.bench import llmtrace as tr
from controlplane.bench.trace import shared_data_dir
from controlplane.llm.profiles import profile
from tests.integration.upctl import REPO

pytestmark = [pytest.mark.integration, pytest.mark.slow]
DATA = shared_data_dir(REPO)


def short_run(shipped: str, tmp_path: Path, instances: int) -> tuple[dict, dict, Path]:
    """The shipped LLM bench file in a short form (4 s of its trace, its
    first plan at ``instances``), run with `galaxy bench`: (the results'
    plan, the trace window, the output directory)."""
    bench = yaml.safe_load((REPO / "experiments" / shipped).read_text())
    window = dict(bench["trace"], duration_s=4, max_output_tokens=20)
    bench.update(trace=window, limits={"ttft_s": 5.0, "tpot_s": 1.0})
    bench["plans"] = [dict(bench["plans"][0], instances=instances)]
    bench.pop("recommend", None)
    f = tmp_path / shipped
    f.write_text(yaml.safe_dump(bench))
    out = tmp_path / "out"
    r = subprocess.run(
        [sys.executable, "-m", "controlplane.tools.cli", "bench", "-f", str(f), "--out", str(out)],
        capture_output=True, text=True, timeout=400, cwd=REPO, env=dict(os.environ),
    )  # fmt: skip
    assert r.returncode == 0, r.stderr[-2000:]
    (p,) = json.loads((out / "results.json").read_text())["plans"]
    return p, window, out


@pytest.mark.skipif(not (DATA / tr.DIR).is_dir(), reason="no Azure LLM trace in ../shared/data")
@pytest.mark.timeout(420)  # the bench subprocess's own bound (400 s), not the suite's 120 s
def test_llm_bench_through_a_real_galaxy_up(tmp_path: Path) -> None:
    p, window, out = short_run("llm-azure.yaml", tmp_path, instances=2)
    sent = len(tr.load(DATA, tr.TraceWindow.from_dict(window)))
    assert p["requests"] == {"sent": sent, "ok": sent, "errors": 0}
    lat = p["latency_ms"]
    assert lat["ttft"]["count"] == sent
    # The emulated engine's decode step is at least its batch-1 TPOT.
    floor_ms = profile("llama2-13b-a100").tpot_base_s * 1000
    assert lat["tpot"]["p50"] >= floor_ms * 0.95
    assert lat["e2e"]["p50"] > lat["ttft"]["p50"]
    assert p["throughput"]["output_tokens_per_s"] > 0
    report = (out / "report.md").read_text()
    for heading in ("TTFT: time to first token", "TPOT: time per output token", "goodput"):
        assert heading in report
