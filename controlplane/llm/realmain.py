"""The real-model runtime's entry (runtime ``llama-cpp-galaxy``): the server
of ``realserver``, its malloc asked to advise transparent huge pages.

    python -m controlplane.llm.realmain --model gemma-3-270m-q4_k_m.gguf

glibc reads ``GLIBC_TUNABLES`` only when a process starts, and a runtime's
command cannot set environment variables, so this module re-executes itself
once with ``glibc.malloc.hugetlb=1`` added (same pid, same arguments) before
importing the server: a wake then faults its KV cache in 2 MiB pages
(``realhost``, "Waking in huge pages"). Kept import-light so the re-exec
costs an interpreter start and no more. glibc learns whether the kernel has
transparent huge pages from ``THP_CONFIG`` (the bubblewrap sandbox shows it
read-only); where that is not visible the tunable would do nothing, and
there is no re-exec.
"""

from __future__ import annotations

import os
import sys

TUNABLE = "glibc.malloc.hugetlb=1"
#: what glibc reads to learn the kernel's huge-page mode and size
THP_CONFIG = "/sys/kernel/mm/transparent_hugepage/enabled"


def tunables(current: str) -> str | None:
    """``GLIBC_TUNABLES`` with the huge-page tunable added; None when it is
    there already (or the variable sets the tunable otherwise: left alone)."""
    parts = [p for p in current.split(":") if p]
    if any(p.startswith("glibc.malloc.hugetlb=") for p in parts):
        return None
    return ":".join([*parts, TUNABLE])


def main() -> int:
    """Re-execute once with the tunable (where it can work), then run the
    server."""
    wanted = tunables(os.environ.get("GLIBC_TUNABLES", ""))
    if wanted is not None and os.access(THP_CONFIG, os.R_OK):
        env = dict(os.environ, GLIBC_TUNABLES=wanted)
        argv = [sys.executable, "-m", "controlplane.llm.realmain", *sys.argv[1:]]
        os.execve(sys.executable, argv, env)
    from controlplane.llm import realhost

    realhost.no_huge_pages()  # before the server's imports fill the heap
    from controlplane.llm import realserver

    return realserver.main()


if __name__ == "__main__":
    sys.exit(main())
