"""The committed generated code must match what scripts/genproto.py makes."""

import filecmp
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def test_generated_code_matches_protos(tmp_path):
    subprocess.run(
        [sys.executable, str(REPO / "scripts" / "genproto.py"), "--out", str(tmp_path)], check=True
    )
    gen = tmp_path / "galaxy" / "v1"
    committed = REPO / "galaxy" / "v1"
    names = sorted(p.name for p in gen.iterdir() if p.suffix in (".py", ".pyi"))
    assert names == sorted(p.name for p in committed.iterdir() if p.suffix in (".py", ".pyi"))
    drifted = [n for n in names if not filecmp.cmp(gen / n, committed / n, shallow=False)]
    assert not drifted, f"run `python scripts/genproto.py` and commit: {drifted} differ"
