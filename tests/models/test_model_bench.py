"""The model bench runs end to end (a small model over a shaped link): each
trial lands in the tier it claims to measure, and the report carries every
figure the docs' table reads. Its speeds are reported, never asserted."""

from __future__ import annotations

import pytest

from controlplane.bench import models as bench
from tests.netns import require_netns

pytestmark = pytest.mark.slow


async def test_the_model_bench_measures_each_tier_and_its_floor() -> None:
    require_netns()
    r = await bench.run(size_mb=8, rate_mbit=400, trials=1)
    assert r["size_bytes"] == 8 * bench.MIB
    for k in ("store", "disk", "memory"):
        assert len(r["trials"][k]) == 1 and r["seconds"][k] > 0
        assert r["floor_seconds"][k] > 0
        assert r["x_floor"][k] == pytest.approx(r["seconds"][k] / r["floor_seconds"][k])
    assert r["disk_first_read_seconds"] > 0
    assert 0 < r["link"]["measured_mbit"] <= 400 * 1.1  # tc shapes the link
    table = bench.render(r)
    assert all(k in table for k in ("store", "disk", "memory", "first read"))
