"""The KV-transfer bench runs end to end on every path (small caches): each
row names its path and size, moved bytes arrive whole (the decode instance
answers 201 only for a complete cache), and the floor is the path's own
measured throughput. Its speeds are reported, never asserted."""

from __future__ import annotations

import pytest

from controlplane.bench import kvtransfer, pdpairing
from tests.netns import require_netns

pytestmark = pytest.mark.slow


async def test_the_kv_bench_measures_every_path() -> None:
    require_netns()
    r = await kvtransfer.run([1, 2], rate_mbit=200, trials=1)
    paths = {row["path"] for row in r["rows"]}
    assert paths == {
        "same node, shared memory",
        "same node, Unix socket",
        "same node, TCP loopback",
        "other host, veth",
        "other host, veth shaped 200 Mbit/s",
        "other host, veth, KV relay",
        "other host, veth shaped 200 Mbit/s, KV relay",
    }
    assert len(r["rows"]) == 14
    for row in r["rows"]:
        assert row["bytes"] in (kvtransfer.MIB, 2 * kvtransfer.MIB)
        assert row["seconds"] > 0 and row["floor_seconds"] > 0
        assert row["x_floor"] == pytest.approx(row["seconds"] / row["floor_seconds"])
    shaped = [row for row in r["rows"] if "shaped" in row["path"]]
    assert all(row["path_bytes_per_s"] * 8 / 1e6 <= 200 * 1.1 for row in shaped)  # tc holds
    assert "x floor" in kvtransfer.render(r)


async def test_the_pairing_bench_moves_each_pickers_choices() -> None:
    require_netns()
    r = await pdpairing.run(requests=6, size_mb=1, rate_mbit=200, seed=3)
    assert set(r["times"]) == {"aware", "random"}
    assert all(len(v) == 6 and min(v) > 0 for v in r["times"].values())
    # Nothing queues here, so the aware picker takes the faster link (the
    # node's own path) every time; the seeded random one goes both ways.
    assert r["same_node_share"]["aware"] == 1.0
    assert 0 < r["same_node_share"]["random"] < 1
    assert r["random_over_aware"] == pytest.approx(r["mean_s"]["random"] / r["mean_s"]["aware"])
    assert "random / aware" in pdpairing.render(r)
