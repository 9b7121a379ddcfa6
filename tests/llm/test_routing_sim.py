"""The routing simulator drives the real pickers over emulated engines: on a
shared-prefix mix the prefix-aware picker gets more prefix-cache hits and a
lower TTFT tail than least-request, with the same requests and instances."""

from __future__ import annotations

from controlplane.llm.profiles import profile
from simulator.llm_routing import for_blocks, shared_prefix, simulate, table


def test_prefix_aware_beats_least_request_on_shared_prefixes() -> None:
    prof = for_blocks(profile("llama2-13b-a100"), 16, cache_tokens=20_000)
    jobs = shared_prefix(150, rate=6.0, prompts=8, system_tokens=4000, output_tokens=20)
    lr = simulate(jobs, "least-request", 3, prof, scrape_s=0.5)
    llm = simulate(jobs, "llm", 3, prof, scrape_s=0.5)
    assert lr.done == llm.done == len(jobs)
    assert llm.prefix_hit > lr.prefix_hit
    assert llm.pct(99) < lr.pct(99)
    out = table([lr, llm])
    assert "| least-request |" in out and "| llm |" in out
