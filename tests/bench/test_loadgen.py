"""The load generator against the raw echo server (real processes, loopback)."""

import pytest

from controlplane.bench import loadgen, runner
from controlplane.bench.echo import EchoProcess

pytestmark = pytest.mark.integration


@pytest.fixture
async def echo():
    e = EchoProcess()
    await e.start()
    yield e
    await e.stop()
    assert e.proc is None


async def test_closed_loop_counts(echo):
    job = loadgen.Job(
        target="echo",
        address=echo.address,
        mode="closed",
        concurrency=4,
        requests=[(0.0, 0, 0.0)] * 300,
        warmup=50,
    )
    r = await loadgen.run(job)
    assert r["measured"] == r["ok"] == 250 and r["errors"] == {}
    assert r["rpcs"] == 250 and r["duration_s"] > 0 and r["cpu_s"] > 0
    assert len(r["lat_ms"]) == len(r["t_ms"]) == len(r["cold"]) == 250
    assert r["lag_ms"] == []  # closed loop has no schedule to be late for


async def test_open_loop_measures_from_the_intended_send_time(echo):
    # 200 requests all due at once: whoever goes out last was due long ago,
    # and its latency must include that wait (no coordinated omission).
    job = loadgen.Job(
        target="echo", address=echo.address, mode="open", requests=[(0.0, 0, 0.0)] * 200
    )
    r = await loadgen.run(job)
    assert r["ok"] == 200 and len(r["lag_ms"]) == 200
    assert all(t == 0.0 for t in r["t_ms"])
    assert max(r["lat_ms"]) >= max(r["lag_ms"]) > 0
    assert min(r["lag_ms"]) >= 0  # never sent before its time


def test_latency_starts_at_the_due_time_or_the_earlier_send():
    # Late (1.002 > 1.0): from the due time, so the generator's own wait
    # counts. Early (a millisecond timer fired first): from the send.
    assert loadgen._start(due=1.0, now=1.002) == 1.0
    assert loadgen._start(due=1.0, now=0.9995) == 0.9995


@pytest.mark.slow
async def test_open_loop_never_times_from_before_the_send(echo):
    # Sub-millisecond gaps: uvloop's millisecond timers fire early.
    reqs = [(i * 0.0003, 0, 0.0) for i in range(300)]
    job = loadgen.Job(target="echo", address=echo.address, mode="open", requests=reqs)
    r = await loadgen.run(job)
    assert r["ok"] == 300 and min(r["lag_ms"]) >= 0
    assert min(r["lat_ms"]) > 0.03  # a loopback gRPC round trip, not a clock artifact


async def test_open_loop_stops_at_max_duration(echo):
    reqs = [(i * 0.01, 0, 0.0) for i in range(100)]  # 1 s of schedule
    job = loadgen.Job(
        target="echo", address=echo.address, mode="open", requests=reqs, max_duration_s=0.2
    )
    r = await loadgen.run(job)
    assert 0 < r["not_sent"] < 100 and r["ok"] + r["not_sent"] == 100


async def test_subprocess_announces_the_measured_phase(echo, tmp_path):
    lines = []

    async def on_line(line, pid):
        lines.append(line)

    job = {
        "target": "echo",
        "address": echo.address,
        "requests": [(0.0, 0, 0.0)] * 100,
        "warmup": 10,
    }
    r = await runner.run_loadgen(job, tmp_path, "t", on_line)
    assert lines == [loadgen.MEASURING, loadgen.MEASURED]
    assert r["ok"] == 90
    assert not (tmp_path / "t.job.json").exists()  # cleaned up


@pytest.mark.slow
async def test_measuring_waits_for_the_runners_snapshot(echo, tmp_path):
    """The runner's snapshot (a scrape of every process) between warm-up and
    measurement must not overlap the first measured requests."""
    import asyncio
    import time

    snapshot_done: list[float] = []

    async def on_line(line, pid):
        if line == loadgen.MEASURING:
            await asyncio.sleep(1.0)  # stands for the scrape: its length is the point
            snapshot_done.append(time.perf_counter())

    for mode in ("closed", "open"):
        job = {
            "target": "echo", "address": echo.address, "mode": mode,
            "requests": [(i * 0.001, 0, 0.0) for i in range(60)], "warmup": 20,
        }  # fmt: skip
        r = await runner.run_loadgen(job, tmp_path, f"t-{mode}", on_line)
        assert r["ok"] == 40
        assert r["started_at"] >= snapshot_done[-1], mode
        if mode == "open":
            # The pause is not counted as lateness of the measured requests.
            assert max(r["lag_ms"]) < 1000


async def test_unreachable_server_is_counted_by_status(tmp_path):
    job = loadgen.Job(
        target="echo",
        address="127.0.0.1:1",
        mode="closed",
        requests=[(0.0, 0, 0.0)] * 5,
        timeout_s=0.5,
    )
    r = await loadgen.run(job)
    assert r["ok"] == 0 and r["errors"] == {"UNAVAILABLE": 5} and r["measured"] == 5


# Starts its own echo process and makes a CA and certificates: 1-2 s quiet,
# 5.3 s in a full run at load 25-31 (2026-11-29), over the fast bound.
@pytest.mark.slow
async def test_echo_yardstick_over_mutual_tls(tmp_path):
    """`--tls-dir`: the yardstick answers a client certificate of the same
    CA and refuses a plaintext caller (so it measures a TLS round trip)."""
    import grpc

    from controlplane.bench.echo import METHOD
    from controlplane.runtime import rpc, tls

    tls.ensure(tmp_path)
    e = EchoProcess()
    address = await e.start(tls_dir=str(tmp_path))
    try:
        async with rpc.insecure_channel(
            address, tls.TlsConfig.for_identity(tmp_path, "client/admin")
        ) as ch:
            assert await ch.unary_unary(METHOD)(b"ping", timeout=10) == b"ping"
        async with grpc.aio.insecure_channel(address) as ch:
            with pytest.raises(grpc.aio.AioRpcError) as err:
                await ch.unary_unary(METHOD)(b"ping", timeout=5)
            assert err.value.code() == grpc.StatusCode.UNAVAILABLE
    finally:
        await e.stop()
