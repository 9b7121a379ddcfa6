"""Generate the committed Python code for the galaxy.v1 API from proto/.

This is the only way the files under galaxy/v1/ are produced. Run it after
editing any .proto file:

    python scripts/genproto.py            # regenerate in place
    python scripts/genproto.py --out DIR  # write to DIR (used by the drift test)

The output depends on the grpcio-tools version, which is pinned in the
``dev`` extra of pyproject.toml.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from grpc_tools import protoc

ROOT = Path(__file__).resolve().parent.parent
PROTO_DIR = ROOT / "proto"


def proto_files() -> list[Path]:
    """All .proto files of the API, in a stable order."""
    return sorted((PROTO_DIR / "galaxy" / "v1").glob("*.proto"))


def generate(out: Path) -> None:
    """Run protoc for every API file, writing galaxy/v1/*_pb2*.py(i) under out."""
    out.mkdir(parents=True, exist_ok=True)
    include = str(Path(protoc.__file__).parent / "_proto")
    args = [
        "protoc",
        f"-I{PROTO_DIR}",
        f"-I{include}",
        f"--python_out={out}",
        f"--pyi_out={out}",
        f"--grpc_python_out={out}",
        *[str(p.relative_to(PROTO_DIR)) for p in proto_files()],
    ]
    # protoc resolves the relative file names against the -I roots.
    code = protoc.main(args)
    if code != 0:
        raise SystemExit(f"protoc failed with exit code {code}")
    for pkg in (out / "galaxy", out / "galaxy" / "v1"):
        init = pkg / "__init__.py"
        if not init.exists():
            init.write_text('"""Generated gRPC code for the galaxy.v1 API (see proto/)."""\n')


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=ROOT, help="output root (default: repo root)")
    args = parser.parse_args(argv)
    generate(args.out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
