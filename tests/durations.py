"""The test files' durations the suite orders its files by (tests/conftest.py).

``python -m tests.durations RUN.xml`` reads the junit XML of a full run
(``python -m pytest --junitxml=RUN.xml``; through ``.ci/run``:
``PYTEST_ADDOPTS=--junitxml=RUN.xml bash .ci/run``) and rewrites
``tests/durations.json``: each test file that took at least ``MIN_S`` seconds
(setup, call and teardown of its tests, summed), in seconds, longest first.
Shorter files are left out: they fill in around the long ones in any order,
and the table stays small enough to review in a diff.
"""

from __future__ import annotations

import json
import sys
import xml.etree.ElementTree as ET
from collections import defaultdict
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
#: The committed table: test file (relative to the repository) -> seconds.
TABLE = REPO / "tests" / "durations.json"
#: Files shorter than this are not listed.
MIN_S = 2.0


def _file_of(classname: str) -> str | None:
    """The test file a junit ``classname`` (``tests.pkg.test_x[.Class]``)
    names, if it exists in this tree."""
    parts = classname.split(".")
    for k in range(len(parts), 0, -1):
        rel = "/".join(parts[:k]) + ".py"
        if (REPO / rel).is_file():
            return rel
    return None


def from_junit(xml: Path) -> dict[str, float]:
    """Per existing test file, the seconds its tests took (all phases), for
    the files of at least ``MIN_S``; longest first."""
    per: defaultdict[str, float] = defaultdict(float)
    for case in ET.parse(xml).getroot().iter("testcase"):
        name = _file_of(case.get("classname") or case.get("name") or "")
        if name is not None:
            per[name] += float(case.get("time") or 0)
    longest = sorted(per.items(), key=lambda kv: -kv[1])
    return {f: round(s, 1) for f, s in longest if s >= MIN_S}


def load() -> dict[str, float]:
    """The committed table (empty when it is missing or unreadable: the
    order then falls back to slow files first, which is still correct)."""
    try:
        table = json.loads(TABLE.read_text())
    except (OSError, ValueError):
        return {}
    return {str(k): float(v) for k, v in table.items()} if isinstance(table, dict) else {}


def main(argv: list[str]) -> int:
    """Rewrite the table from one junit XML; 2 with a usage line otherwise."""
    if len(argv) != 1:
        print("usage: python -m tests.durations RUN.xml", file=sys.stderr)
        return 2
    table = from_junit(Path(argv[0]))
    TABLE.write_text(json.dumps(table, indent=1) + "\n")
    print(f"{TABLE.relative_to(REPO)}: {len(table)} files, {sum(table.values()):.0f} s")
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
