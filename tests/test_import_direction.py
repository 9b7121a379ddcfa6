"""Imports point one way: from a package to the packages below it.

The layers (docs/architecture.md, "Packages"), lowest first. A module may
import its own package and anything in a lower layer, never a higher one;
services in the same layer do not import each other (each is deployable on
its own, and what they share belongs in the runtime). The check reads the
source with ``ast``, so it sees imports inside functions too.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]

#: (layer name, packages in it), lowest first.
LAYERS: list[tuple[str, tuple[str, ...]]] = [
    ("generated", ("galaxy.v1",)),
    ("runtime", ("controlplane.runtime",)),
    ("state", ("statestore",)),
    ("sdk", ("controlplane.sdk",)),
    (
        "services",
        (
            "controlplane.controller",
            "controlplane.nodeagent",
            "controlplane.gateway",
            "functions.dispatch",
            "functions.schedule",
            "functions.clustermgr",
            "controlplane.llm",
        ),
    ),
    ("launch", ("controlplane.launch",)),
    ("bench", ("controlplane.bench",)),
    ("simulator", ("simulator",)),
    ("tools", ("controlplane.tools",)),
]
#: Packages that hold only a docstring and may be imported by anyone.
NEUTRAL = {"controlplane", "functions"}
SCANNED = ("controlplane", "functions", "statestore", "simulator")


def package_of(module: str) -> str | None:
    """The most specific listed package that holds ``module``."""
    best: str | None = None
    for _, pkgs in LAYERS:
        for p in pkgs:
            if (module == p or module.startswith(p + ".")) and (best is None or len(p) > len(best)):
                best = p
    return best


def layer_of(pkg: str) -> int:
    return next(i for i, (_, pkgs) in enumerate(LAYERS) if pkg in pkgs)


def module_name(path: Path, root: Path = ROOT) -> str:
    parts = list(path.relative_to(root).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def imports(path: Path, root: Path = ROOT) -> list[tuple[int, str]]:
    """(line, imported module) for every absolute import of ours."""
    out = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            out += [(node.lineno, a.name) for a in node.names]
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            # `from pkg import mod` imports pkg.mod when mod is a module.
            for a in node.names:
                full = f"{node.module}.{a.name}"
                as_path = root / Path(*full.split("."))
                is_mod = as_path.with_suffix(".py").exists() or as_path.is_dir()
                out.append((node.lineno, full if is_mod else node.module))
    return [(ln, m) for ln, m in out if m.split(".")[0] in (*SCANNED, "galaxy")]


def violations(root: Path = ROOT) -> list[str]:
    bad = []
    for top in SCANNED:
        for path in sorted((root / top).rglob("*.py")):
            src_mod = module_name(path, root)
            src = package_of(src_mod)
            if src is None:
                if src_mod not in NEUTRAL:
                    bad.append(f"{path.relative_to(root)}: not in any layer")
                continue
            for line, target in imports(path, root):
                dst = package_of(target)
                if dst is None or dst == src:
                    continue
                ls, ld = layer_of(src), layer_of(dst)
                if ld > ls or (ld == ls and LAYERS[ls][0] == "services"):
                    bad.append(
                        f"{path.relative_to(root)}:{line}: {src} ({LAYERS[ls][0]}) "
                        f"imports {target} ({LAYERS[ld][0]})"
                    )
    return bad


@pytest.mark.slow
def test_imports_point_down_the_layers() -> None:
    assert violations() == []


def test_the_check_catches_upward_and_sideways_imports(tmp_path: Path) -> None:
    def write(rel: str, text: str) -> None:
        f = tmp_path / rel
        f.parent.mkdir(parents=True, exist_ok=True)
        f.write_text(text)

    write("controlplane/runtime/rpc.py", "from functions.dispatch import policy\n")
    write("functions/dispatch/policy.py", "def f():\n    import functions.schedule.policy\n")
    write("functions/schedule/policy.py", "from controlplane.runtime import rpc\n")
    write("controlplane/stray.py", "x = 1\n")
    found = violations(tmp_path)
    assert any("runtime/rpc.py:1" in v and "(services)" in v for v in found)
    assert any("dispatch/policy.py:2" in v for v in found)  # service -> service
    assert any("stray.py: not in any layer" in v for v in found)
    assert not any("schedule/policy.py" in v for v in found)  # down is fine


@pytest.mark.slow
def test_every_module_is_in_a_layer() -> None:
    missing = [v for v in violations() if "not in any layer" in v]
    assert missing == []


def test_no_module_over_500_lines() -> None:
    long = []
    for top in SCANNED:
        for path in (ROOT / top).rglob("*.py"):
            n = len(path.read_text().splitlines())
            if n > 500:
                long.append(f"{path.relative_to(ROOT)}: {n} lines")
    assert long == []
