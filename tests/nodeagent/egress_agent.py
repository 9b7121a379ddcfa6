"""Run by tests/nodeagent/test_egress.py as a user that is not root (the
Kubernetes-shaped agent): the bwrap backend starts the egress probe with
``egress`` set, asks it to reach the targets given, and reports as JSON on
stdout what it reached and whether a network stack ran beside it."""

from __future__ import annotations

import asyncio
import json
import os
import sys
from pathlib import Path

from controlplane.nodeagent.sandbox.bwrap import BwrapBackend
from galaxy.v1 import common_pb2
from tests.nodeagent.delegated_agent import get
from tests.nodeagent.egress_probe import PROBE


async def main(work: Path, targets: str) -> dict[str, object]:
    backend = BwrapBackend(log_dir=work / "logs", instance_dir=work / "inst")
    out: dict[str, object] = {"euid": os.geteuid(), "entry": backend.entry}
    spec = common_pb2.FunctionSpec(name="probe", command=[sys.executable, "-c", PROBE], egress=True)
    spec.env["PROBE_TARGETS"] = targets
    try:
        sb = await backend.start("n-0", "probe-1", spec)
        out["stacks"] = len(backend._egress)
        out["reached"] = json.loads(await get(sb.address))
        await sb.stop()
        out["stacks_after"] = len(backend._egress)
    finally:
        await backend.close()
    return out


if __name__ == "__main__":
    print(json.dumps(asyncio.run(main(Path(sys.argv[1]), sys.argv[2]))))
