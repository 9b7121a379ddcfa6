"""``galaxy bench -f FILE`` for LLM bench files (``kind: llm``): run the
plans, or with ``--recommend --slo ...`` find the smallest deployment."""

from __future__ import annotations

import argparse
import shlex
import sys
from pathlib import Path

from controlplane.bench import llm
from controlplane.bench import llmmetrics as mt
from controlplane.bench.llmreport import render_recommendation
from controlplane.bench.llmup import UpError
from controlplane.bench.trace import TraceError


async def cmd_llm(args: argparse.Namespace, out: Path, data_dir: Path) -> int:
    """Exit code: 0 done (or a deployment recommended), 1 failed plans or
    none met the SLO, 2 bad input."""
    command = "galaxy " + shlex.join(sys.argv[1:])
    try:
        b = llm.load_file(args.file)
        if args.recommend:
            if not args.slo:
                raise mt.ObjectiveError("--recommend needs --slo, e.g. 'p99_ttft<1s'")
            objectives = mt.parse_objectives(args.slo)
            doc = await llm.recommend(b, objectives, out, data_dir, command)
            print(render_recommendation(doc))
            return 0 if doc["recommendation"] is not None else 1
        res = await llm.run(b, out, data_dir, command)
    except (TraceError, mt.ObjectiveError) as e:
        print(f"galaxy bench: {e}", file=sys.stderr)
        return 2
    except UpError as e:
        print(f"galaxy bench: {e}", file=sys.stderr)
        return 1
    print(f"wrote {out / 'report.md'}")
    return 1 if res["failures"] else 0
