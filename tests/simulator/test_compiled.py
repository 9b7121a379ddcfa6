"""The optional compiled build (scripts/build_fast.py): an edited source
with an old extension is refused, and the compiled modules give the pure
modules' results. Also the simulator's lease ids (a prefix per router in
place of the production random nonce)."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from controlplane.runtime import compiled
from controlplane.runtime.compiled import FAST_MODULES, MANIFEST, ROOT, check, stale
from functions.dispatch.policy import Instance
from simulator import workload as wl
from simulator.runner import SYSTEMS
from simulator.system import Env, SimConfig

_SO = ".cpython-311-x86_64-linux-gnu.so"


def _tree(tmp_path: Path) -> Path:
    """A fake tree with every FAST_MODULES source and an extension beside one."""
    for m in FAST_MODULES:
        (tmp_path / m).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / m).write_text(f"# {m}\n")
    first = tmp_path / FAST_MODULES[0]
    first.with_name(first.stem + _SO).write_bytes(b"")
    return tmp_path


def _record(root: Path) -> None:
    (root / MANIFEST).parent.mkdir(parents=True, exist_ok=True)
    hashes = {m: compiled.source_hash(root / m) for m in FAST_MODULES}
    (root / MANIFEST).write_text(json.dumps(hashes))


def test_no_extension_is_never_stale(tmp_path):
    for m in FAST_MODULES:
        (tmp_path / m).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / m).write_text("x = 1\n")
    assert stale(tmp_path) == []
    check(tmp_path)  # nothing compiled: nothing to refuse


def test_an_edited_source_is_refused(tmp_path):
    root = _tree(tmp_path)
    _record(root)
    assert stale(root) == []
    (root / FAST_MODULES[0]).write_text("# edited\n")
    assert stale(root) == [FAST_MODULES[0]]
    with pytest.raises(ImportError, match=FAST_MODULES[0]):
        check(root)


def test_an_extension_without_a_manifest_is_refused(tmp_path):
    root = _tree(tmp_path)
    assert stale(root) == [FAST_MODULES[0]]


def _is_built() -> bool:
    return any(compiled.extensions(ROOT, m) for m in FAST_MODULES)


_RUN = """
import hashlib, json, sys
from simulator import calibration, workload as wl
from simulator.runner import run_one
from simulator.system import SimConfig
w = wl.poisson(200.0, 20.0, n_functions=15, mean_duration_s=0.3, seed=4)
out = {}
for s in ("galaxy", "knative", "atoll"):
    r = run_one(s, w, SimConfig(nodes=30, seed=4, keep_alive_s=2.0), calibration.load())
    r.pop("perf")
    out[s] = r
print(json.dumps(out, sort_keys=True, default=str))
"""


def _run_in(root: Path) -> str:
    done = subprocess.run(
        [sys.executable, "-c", _RUN],
        cwd=root,
        env={"PYTHONPATH": str(root), "PATH": "/usr/bin:/bin", "PYTHONHASHSEED": "0"},
        capture_output=True,
        text=True,
        check=True,
        timeout=300,
    )
    return done.stdout


@pytest.mark.skipif(not _is_built(), reason="the compiled build is not present (the default)")
def test_compiled_modules_give_the_pure_results(tmp_path):
    pure = tmp_path / "pure"
    for pkg in ("controlplane", "functions", "simulator", "statestore", "galaxy"):
        shutil.copytree(
            ROOT / pkg, pure / pkg, ignore=shutil.ignore_patterns("*.so", "__pycache__")
        )
    assert not any(compiled.extensions(pure, m) for m in FAST_MODULES)
    assert _run_in(ROOT) == _run_in(pure)


def test_lease_ids_are_unique_across_routers(cal):
    w = wl.poisson(10.0, 1.0, n_functions=2, mean_duration_s=0.1, seed=1)
    env = Env(SimConfig(nodes=4), cal, w, 1)
    model = SYSTEMS["galaxy"](env, {})
    first, again = model.make_router(0), model.make_router(0)  # a router remade (handover)
    assert first.lease_prefix != again.lease_prefix
    assert first.lease_nonce() == ""  # no os.urandom per request in a simulation
    ids = set()
    for r in (first, again):
        r.add_instance(_instance())
        ids |= {r.acquire().lease_id for _ in range(3)}  # type: ignore[union-attr]
    assert len(ids) == 6


def _instance() -> Instance:
    return Instance("i-1", "addr", "n-1", concurrency=10)


def test_clean_removes_extensions_of_modules_no_longer_listed(tmp_path, monkeypatch):
    """A module dropped from FAST_MODULES keeps no extension after --clean
    (left behind, it would be imported without the staleness check)."""
    import importlib.util

    spec = importlib.util.spec_from_file_location("build_fast", ROOT / "scripts/build_fast.py")
    assert spec is not None and spec.loader is not None
    build_fast = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(build_fast)
    root = _tree(tmp_path)
    dropped = "functions/dropped.py"
    (root / dropped).parent.mkdir(parents=True, exist_ok=True)
    (root / dropped).write_text("x = 1\n")
    old = (root / dropped).with_name("dropped" + _SO)
    old.write_bytes(b"")
    _record(root)
    manifest = json.loads((root / MANIFEST).read_text())
    (root / MANIFEST).write_text(json.dumps({**manifest, dropped: "0" * 64}))
    monkeypatch.setattr(build_fast, "ROOT", root)
    gone = build_fast.clean()
    assert old in gone and not old.exists()
    assert not any(compiled.extensions(root, m) for m in FAST_MODULES)
    assert not (root / MANIFEST).exists()
