"""The router comparison's prompts (``bench/llmrouters.py``): the Mooncake
trace's block hash ids become text so that routers which see only text
(vllm-router, sglang-router) and the emulated server (one token per word)
find the same shared prefixes the trace records."""

from __future__ import annotations

import json
from pathlib import Path

from controlplane.bench.llmrouters import BLOCK, mooncake
from controlplane.llm.engine import block_hashes


def _trace(tmp_path: Path, rows: list[dict]) -> Path:
    p = tmp_path / "trace.jsonl"
    p.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return p


def test_shared_hash_ids_are_a_shared_text_prefix(tmp_path: Path) -> None:
    rows = [
        {"timestamp": 0, "input_length": 1100, "output_length": 5, "hash_ids": [0, 1, 2]},
        {"timestamp": 500, "input_length": 1300, "output_length": 7, "hash_ids": [0, 1, 9]},
        {"timestamp": 900, "input_length": 700, "output_length": 3, "hash_ids": [4, 5]},
        {"timestamp": 61_000, "input_length": 10, "output_length": 3, "hash_ids": [6]},
    ]
    a, b, c = mooncake(_trace(tmp_path, rows), minutes=1, speed=2.0, max_prompt=4096)
    wa, wb, wc = a.text.split(), b.text.split(), c.text.split()
    assert [len(wa), len(wb), len(wc)] == [1100, 1300, 700]  # the trace's input lengths
    assert (a.prompt_tokens, a.output_tokens) == (1101, 5)  # + the role word the server counts
    assert (b.at_s, c.at_s) == (0.25, 0.45)  # time divided by speed; the 61 s row is past 1 min
    shared = next(i for i, (x, y) in enumerate(zip(wa, wb, strict=False)) if x != y)
    assert shared == 2 * BLOCK  # hash ids 0, 1 in common: two blocks of text
    assert not set(wa) & set(wc)
    # The emulated server's prefix blocks agree: a and b share exactly the
    # blocks inside their two common trace blocks.
    ha, hb = block_hashes(wa, 16), block_hashes(wb, 16)
    common = next(i for i, (x, y) in enumerate(zip(ha, hb, strict=False)) if x != y)
    assert common == 2 * BLOCK // 16


def test_prompts_are_cut_at_the_bound(tmp_path: Path) -> None:
    rows = [{"timestamp": 0, "input_length": 5000, "output_length": 1, "hash_ids": list(range(10))}]
    (r,) = mooncake(_trace(tmp_path, rows), minutes=1, speed=1.0, max_prompt=1500)
    assert len(r.text.split()) == 1500
