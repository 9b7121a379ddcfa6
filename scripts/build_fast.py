"""Build (or remove) the simulator's optional compiled accelerator.

    python scripts/build_fast.py            # compile the hot modules in place (mypyc + gcc)
    python scripts/build_fast.py --clean    # remove them: back to pure Python

The modules are ``controlplane.runtime.compiled.FAST_MODULES``; the build
puts an extension next to each source (Python imports it in preference to
the ``.py``) and records the sources' hashes, so an edited source with an
old extension is refused at import (``compiled.check``). Needs mypy (a dev
dependency, which brings mypyc) and a C compiler; takes a few minutes.
Nothing else changes: without the build everything runs as pure Python.
"""

from __future__ import annotations

import argparse
import inspect
import json
import os
import shutil
import sys
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from controlplane.runtime.compiled import (  # noqa: E402
    FAST_MODULES,
    MANIFEST,
    extensions,
    source_hash,
)


def clean() -> list[Path]:
    """Remove the extensions, mypyc's shared library and the manifest
    (also the extensions of modules a previous build compiled that are no
    longer in ``FAST_MODULES``: left behind, they would be imported
    unchecked)."""
    manifest = ROOT / MANIFEST
    try:
        built = list(json.loads(manifest.read_text()))
    except (OSError, ValueError):
        built = []
    modules = list(FAST_MODULES) + [m for m in built if m not in FAST_MODULES]
    gone = [p for m in modules for p in extensions(ROOT, m)]
    gone += sorted(ROOT.glob("*__mypyc.*.so"))
    if manifest.exists():
        gone.append(manifest)
    for p in gone:
        p.unlink()
    return gone


class _Signature(inspect.Signature):
    """mypyc writes each compiled method's signature into its docstring
    with ``inspect.Signature``, and rejects one it misreads (a classmethod
    with ``**kwargs`` after a default, as ``KpaConfig.knative_baseline``)
    with a ValueError that stops the build. The docstring is all it is for,
    so such a signature is kept unchecked."""

    def __init__(self, parameters: Any = None, **kw: Any) -> None:
        try:
            super().__init__(parameters, **kw)
        except ValueError:
            super().__init__(parameters, __validate_parameters__=False)


def build(opt_level: str) -> None:
    """Compile FAST_MODULES in place, then record their hashes."""
    from mypyc.build import mypycify
    from setuptools import setup

    inspect.Signature = _Signature  # type: ignore[misc]
    clean()
    # Hashed before compiling: a source edited during the build is stale.
    hashes = {m: source_hash(ROOT / m) for m in FAST_MODULES}
    os.chdir(ROOT)
    setup(
        name="galaxy-fast",
        ext_modules=mypycify(list(FAST_MODULES), opt_level=opt_level),
        script_args=["build_ext", "--inplace", "--build-temp", "build/fast"],
    )
    manifest = ROOT / MANIFEST
    manifest.parent.mkdir(parents=True, exist_ok=True)
    manifest.write_text(json.dumps(hashes, indent=1) + "\n")


def main() -> int:
    """Parse the command line; build or clean."""
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--clean", action="store_true", help="remove the compiled modules")
    p.add_argument("--opt-level", default="3", help="C optimisation level (default 3)")
    args = p.parse_args()
    if args.clean:
        for path in clean():
            print(f"removed {path.relative_to(ROOT)}")
        shutil.rmtree(ROOT / "build" / "fast", ignore_errors=True)
        return 0
    build(args.opt_level)
    print(f"compiled {len(FAST_MODULES)} modules; remove with --clean")
    return 0


if __name__ == "__main__":
    sys.exit(main())
