"""Keep-alive policies: fixed, and the hybrid histogram policy (ATC'20)."""

import math

import pytest

from functions.dispatch.autoscaling import (
    FixedKeepAlive,
    HybridHistogramKeepAlive,
    KeepAlivePolicy,
    KpaAutoscaler,
    KpaConfig,
    make_keepalive,
)

MIN = 60.0
HOUR = 3600.0


def replay(policy, gaps, start=0.0, busy=1.0):
    """Invoke, run ``busy`` seconds, go idle for each gap, invoke again."""
    t = start
    policy.on_invocation(t)
    for gap in gaps:
        t += busy
        policy.on_idle_start(t)
        t += gap
        policy.on_invocation(t)
    return t


def test_fixed_keep_alive():
    p = FixedKeepAlive(600)
    assert isinstance(p, KeepAlivePolicy)
    replay(p, [5.0, 7000.0])
    assert (p.keep_alive_s(0.0), p.prewarm_s(0.0)) == (600.0, 0.0)
    with pytest.raises(ValueError, match=r"FixedKeepAlive.seconds must be >= 0"):
        FixedKeepAlive(-1)


def test_periodic_function_gets_prewarm_and_short_keep_alive():
    p = HybridHistogramKeepAlive()
    # Idle times always ~10 min (10.2 to 10.8 min): all in the [10, 11) min bin.
    replay(p, [(10.2 + 0.6 * (i % 7) / 6) * MIN for i in range(60)])
    assert p.mode() == "histogram"
    prewarm, keep = p.windows()
    assert math.isclose(prewarm, 9 * MIN)  # head 10 min - 10%
    assert math.isclose(keep, 11 * 1.1 * MIN - 9 * MIN)  # tail 11 min + 10%, minus pre-warm
    assert 2 * MIN < keep < 4 * MIN  # a few minutes around the expected request
    assert p.prewarm_s(0.0) == prewarm and p.keep_alive_s(0.0) == keep


def test_head_and_tail_follow_the_5th_and_99th_percentiles():
    p = HybridHistogramKeepAlive(min_samples=1)
    gaps = [2 * MIN + 1] * 5 + [10 * MIN + 1] * 90 + [30 * MIN + 1] * 5  # 5% at 2 min, 5% at 30
    for g in gaps:
        p.record_idle_time(g)
    prewarm, keep = p.windows()
    assert math.isclose(prewarm, 2 * MIN * 0.9)  # the 5th percentile is in the 2-min bin
    assert math.isclose(prewarm + keep, 31 * MIN * 1.1)  # the 99th in the 30-min bin


def test_erratic_function_falls_back_to_keeping_warm_for_the_whole_range():
    p = HybridHistogramKeepAlive()
    replay(p, [(i % 240) * MIN + 30 for i in range(480)])  # flat over 4 hours
    assert p.cv() < 2.0
    assert p.mode() == "fallback"
    assert p.windows() == (0.0, 4 * HOUR)


def test_too_few_samples_falls_back_even_when_periodic():
    p = HybridHistogramKeepAlive()
    assert p.min_samples == 48  # 240 bins / (2**2 + 1), rounded up
    replay(p, [10.5 * MIN] * 47)
    assert p.cv() > 2.0 and p.mode() == "fallback"
    assert p.windows() == (0.0, 4 * HOUR)
    replay(p, [10.5 * MIN])
    assert p.mode() == "histogram"


def test_no_history_falls_back():
    p = HybridHistogramKeepAlive()
    assert p.windows() == (0.0, 4 * HOUR)


def test_out_of_bounds_idle_times_use_the_simplified_forecast():
    p = HybridHistogramKeepAlive()
    replay(p, [6 * HOUR] * 8 + [10 * MIN] * 2)  # 80% beyond the 4-hour range
    assert p.mode() == "out-of-bounds"
    prewarm, keep = p.windows()
    forecast = 6 * HOUR  # median of the last 10 idle times
    assert math.isclose(prewarm, 0.85 * forecast) and math.isclose(keep, 0.30 * forecast)


def test_idle_time_runs_from_idle_start_not_from_the_last_invocation():
    p = HybridHistogramKeepAlive(min_samples=1)
    p.on_invocation(0.0)  # first request ever: no idle time
    p.on_invocation(5.0)  # busy (no idle start): no idle time
    assert p.in_range == 0
    p.on_idle_start(100.0)
    p.on_invocation(100.0 + 10.5 * MIN)
    assert p.in_range == 1 and p.counts[10] == 1


@pytest.mark.parametrize(
    "opts,field",
    [
        ({"bin_s": 0}, "bin_s"),
        ({"range_s": 30}, "range_s"),  # shorter than a bin
        ({"margin": 1.0}, "margin"),
        ({"tail_percentile": 101}, "tail_percentile"),
        ({"head_percentile": 50, "tail_percentile": 40}, "tail_percentile"),
        ({"min_samples": 0}, "min_samples"),
        ({"oob_threshold": 0}, "oob_threshold"),
        ({"oob_margin": 0.5}, "oob_margin"),
        ({"forecast_samples": 1.5}, "forecast_samples"),
    ],
)
def test_bad_hybrid_options_name_the_field(opts, field):
    with pytest.raises(ValueError, match=f"HybridHistogramKeepAlive.{field} must be"):
        HybridHistogramKeepAlive(**opts)


def test_factory():
    assert make_keepalive("fixed").keep_alive_s(0.0) == 0.0
    assert make_keepalive("fixed", seconds=600).keep_alive_s(0.0) == 600.0
    h = make_keepalive("hybrid", bin_s=30, range_s=HOUR)
    assert isinstance(h, HybridHistogramKeepAlive) and h.n_bins == 120
    with pytest.raises(ValueError, match=r"unknown keep-alive policy 'lru'.*fixed.*hybrid"):
        make_keepalive("lru")
    with pytest.raises(ValueError, match=r"keep-alive policy 'fixed'.*bogus"):
        make_keepalive("fixed", bogus=1)


def test_autoscaler_learns_a_periodic_function_and_prewarms_it():
    """End to end: a request every ~10 min; once learnt, the function is
    unloaded after the window, pre-warmed at 9 min, released after 12.1 min."""
    hybrid = HybridHistogramKeepAlive()
    a = KpaAutoscaler(KpaConfig(target_concurrency=1), hybrid)
    now, ready = 0.0, 0
    log = []
    for _ in range(55):  # each cycle: 4 s busy, then ~10 min 24 s idle
        for conc in [1, 1] + [0] * 312:
            now += 2.0
            a.observe(now, conc)
            d = a.decide(now, ready)
            ready = d.desired
            log.append((now, conc, d.desired))
    assert hybrid.mode() == "histogram"
    assert math.isclose(hybrid.prewarm_s(now), 9 * MIN)
    # The last cycle: busy samples at c0 and c0 + 2, idle from c0 + 4.
    c0 = log[-314][0]
    want = {t: n for t, _, n in log[-314:]}
    idle_at = c0 + 4
    # The last busy sample (c0 + 2) leaves the 60 s window at c0 + 62.
    assert want[idle_at + 56] == 1
    assert want[idle_at + 58] == 0  # unloaded: pre-warming will bring it back
    assert want[idle_at + 9 * MIN - 2] == 0
    assert want[idle_at + 9 * MIN] == 1  # pre-warmed before the next request
    assert want[c0 + 312 * 2] == 1  # still warm when the request lands (10 min 20 s)
