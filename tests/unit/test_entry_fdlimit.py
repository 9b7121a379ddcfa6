"""The node agent raises its open-file limit for its doors' connections
(``entry.limits.raise_fd_limit``), and says when even the hard limit is too
low for ``--entry-max-connections``. In a child process: limits are the
process's own, and a hard limit once lowered cannot be raised again."""

from __future__ import annotations

import json
import subprocess
import sys

SCRIPT = """
import json, resource
from controlplane.nodeagent.entry.limits import raise_fd_limit
out = {}
soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
resource.setrlimit(resource.RLIMIT_NOFILE, (256, 4096))
out["fits"] = raise_fd_limit(100)
out["raised"] = resource.getrlimit(resource.RLIMIT_NOFILE)
out["short"] = raise_fd_limit(10_000)
print(json.dumps(out))
"""


def test_the_soft_limit_goes_to_the_hard_and_a_short_hard_limit_is_named() -> None:
    r = subprocess.run([sys.executable, "-c", SCRIPT], capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    got = json.loads(r.stdout)
    assert got["fits"] is None
    assert got["raised"] == [4096, 4096]
    short = got["short"]
    assert "4096" in short and "21024" in short and "--entry-max-connections" in short, short
