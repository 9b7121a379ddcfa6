"""The packed vLLM checkpoint is the same bytes for the same content: its
header is rewritten with sorted keys (safetensors writes metadata in a hash
map's order, so two packs of one checkpoint had two sha256s, and a spec
pins one)."""

from __future__ import annotations

import json
from pathlib import Path

from controlplane.llm.vllmmodel import canonical, read_header


def _safetensors(path: Path, meta: dict[str, str], data: bytes) -> None:
    doc = {"__metadata__": meta, "w": {"dtype": "U8", "shape": [len(data)],
                                        "data_offsets": [0, len(data)]}}  # fmt: skip
    head = json.dumps(doc).encode()
    path.write_bytes(len(head).to_bytes(8, "little") + head + data)


def test_the_same_content_in_another_key_order_packs_to_the_same_bytes(tmp_path: Path) -> None:
    data = bytes(range(256)) * 4
    _safetensors(tmp_path / "a", {"x": "1", "y": "é"}, data)
    _safetensors(tmp_path / "b", {"y": "é", "x": "1"}, data)
    assert (tmp_path / "a").read_bytes() != (tmp_path / "b").read_bytes()
    canonical(tmp_path / "a", tmp_path / "a.c")
    canonical(tmp_path / "b", tmp_path / "b.c")
    packed = (tmp_path / "a.c").read_bytes()
    assert packed == (tmp_path / "b.c").read_bytes()
    n = int.from_bytes(packed[:8], "little")
    assert n % 8 == 0 and packed[8 + n :] == data  # the tensors' bytes follow, untouched
    assert read_header(tmp_path / "a.c")["__metadata__"] == {"x": "1", "y": "é"}
