"""`python -m controlplane.bench.sandbox`: one short run starts and stops the
echo example on every backend (egress included) and reports each; never how
fast."""

from __future__ import annotations

import shutil

import pytest

from controlplane.bench import sandbox

pytestmark = pytest.mark.skipif(
    shutil.which("bwrap") is None or shutil.which("slirp4netns") is None,
    reason="needs bubblewrap and slirp4netns",
)


async def test_every_backend_is_started_and_reported() -> None:
    got = await sandbox.run(2)
    kinds = ("process", "bwrap", "bwrap-relay", "bwrap-factory", "bwrap-egress")
    for kind in kinds:
        assert 0 < got[kind]["p50_ms"] <= got[kind]["p90_ms"]  # type: ignore[index]
    base = got["process"]["p50_ms"]  # type: ignore[index]
    assert got["p50_added_egress_ms"] == got["bwrap-egress"]["p50_ms"] - base  # type: ignore[index]
    assert got["p50_added_relay_ms"] == got["bwrap-relay"]["p50_ms"] - base  # type: ignore[index]
    assert got["rounds"] == 2
