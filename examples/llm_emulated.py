"""Launch the emulated LLM server (controlplane/llm/server.py) as a function
instance: the node agent sets $HOST and $PORT; flags pass through
(--profile NAME, --model ID). The repository root is put on the path first,
as this file runs from its checkout."""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from controlplane.llm.server import main

if __name__ == "__main__":
    sys.exit(main())
