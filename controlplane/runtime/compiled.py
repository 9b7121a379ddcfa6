"""The optional compiled accelerator of the simulator's hot modules.

``python scripts/build_fast.py`` compiles ``FAST_MODULES`` with mypyc (an
ahead-of-time compiler from the mypy project) into extension modules next
to their sources; Python then imports the extension instead of the ``.py``
file. The ``.py`` files stay the source of truth and everything runs
without the build (the default, and what CI runs); ``--clean`` removes it.

An extension compiled from an older source would silently run old code, so
the build records a hash of each source (``MANIFEST``) and ``check`` -- run
when ``functions`` or ``simulator`` is first imported -- refuses to go on
when a compiled module no longer matches its source.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Callable
from pathlib import Path
from types import ModuleType
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    # What the compiler reads: ``@mypyc_attr(allow_interpreted_subclasses=True)``
    # on a compiled class that plain Python classes (the models, tests)
    # subclass. mypy_extensions comes with mypy, a dev dependency only.
    from mypy_extensions import mypyc_attr
else:

    def mypyc_attr(*_args: Any, **_kwargs: Any) -> Callable[[type], type]:
        """Without the compiler: a decorator that changes nothing."""
        return lambda cls: cls


#: The repository root (the directory holding the packages).
ROOT = Path(__file__).resolve().parents[2]
#: The modules compiled, chosen by profile (docs/simulator.md "Speed"):
#: the event loop, the data path, the router and the KPA, the Galaxy
#: model's control plane and the recording of results; since the fifth
#: pass also Schedule's placement policy and credit ledger, ClusterMgr's
#: registry and the Galaxy model's placement, credit and scaling paths.
FAST_MODULES = (
    "simulator/engine.py",
    "simulator/frontend.py",
    "simulator/calibration.py",
    "simulator/cluster.py",
    "simulator/metrics.py",
    "simulator/autoscale.py",
    "simulator/galaxy/control.py",
    "functions/dispatch/policy.py",
    "functions/dispatch/credits.py",
    "functions/dispatch/autoscaling/kpa.py",
    "functions/schedule/policy.py",
    "functions/schedule/model.py",
    "functions/schedule/credits.py",
    "functions/clustermgr/policy.py",
    "simulator/galaxy/credits.py",
    "simulator/galaxy/placement.py",
    "simulator/galaxy/scaling.py",
    "simulator/galaxy/model.py",
    "simulator/system.py",
    "controlplane/nodeagent/capacity.py",
)
#: Where the build records the hash of each source it compiled.
MANIFEST = "build/fast-manifest.json"

_checked = False


def source_hash(path: Path) -> str:
    """The hash the manifest records for a source file."""
    return hashlib.sha256(path.read_bytes()).hexdigest()


def extensions(root: Path, module: str) -> list[Path]:
    """The compiled extension files of one ``FAST_MODULES`` entry under root."""
    src = root / module
    return sorted(src.parent.glob(f"{src.stem}.*.so")) + sorted(
        src.parent.glob(f"{src.stem}.*.pyd")
    )


def stale(root: Path = ROOT) -> list[str]:
    """The compiled modules under root that do not match their source (empty
    when there is no build, or when the build is current)."""
    built = [m for m in FAST_MODULES if extensions(root, m)]
    if not built:
        return []
    try:
        recorded = json.loads((root / MANIFEST).read_text())
    except (OSError, ValueError):
        recorded = {}
    return [m for m in built if recorded.get(m) != source_hash(root / m)]


def is_compiled(module: ModuleType) -> bool:
    """True when module was imported from a compiled extension (its classes
    then cannot be patched: tests that patch one skip)."""
    return not (module.__file__ or "").endswith(".py")


def check(root: Path = ROOT) -> None:
    """Raise ImportError when a compiled module is out of date with its
    source (once per process; cheap when nothing is compiled)."""
    global _checked
    if _checked and root == ROOT:
        return
    bad = stale(root)
    if bad:
        raise ImportError(
            f"compiled modules older than their source: {', '.join(bad)}; rebuild them with "
            "`python scripts/build_fast.py` or remove them with "
            "`python scripts/build_fast.py --clean`"
        )
    if root == ROOT:
        _checked = True
