"""The calibration file and its samplers."""

import json
import random
import statistics

import pytest

from simulator import calibration as cb


def test_default_calibration_has_every_op_with_a_source(cal):
    assert set(cb.OPS) <= set(cal.ops)
    for name, op in cal.ops.items():
        assert op.mean_s > 0 and op.source, name
    for name in ("connect_s", "repartition_s", "control_start_s"):
        assert cal.param(name) > 0 and cal.sources[name], name


def test_sampler_has_the_op_mean_and_cv(cal):
    op = next(iter(cal.ops))
    c = cal.ops[op]
    draw = cal.sampler(op, random.Random(1))
    xs = [draw() for _ in range(20_000)]
    assert statistics.fmean(xs) == pytest.approx(c.mean_s, rel=0.03)
    if c.cv:
        assert statistics.stdev(xs) / statistics.fmean(xs) == pytest.approx(c.cv, rel=0.1)


def test_files_round_trip_and_errors_name_the_entry(tmp_path, cal):
    p = tmp_path / "c.json"
    p.write_text(json.dumps(cal.to_json()))
    again = cb.load(p)
    assert again.ops == cal.ops and again.params == cal.params
    doc = cal.to_json()
    del doc["ops"]["dispatch.dispatch"]
    p.write_text(json.dumps(doc))
    with pytest.raises(cb.CalibrationError, match=r"dispatch\.dispatch"):
        cb.load(p)
    with pytest.raises(cb.CalibrationError, match="cannot read"):
        cb.load(tmp_path / "missing.json")


def _plan(name, ok, dur, cores, probes=0.1, sched_p50_ms=0.06, rpcs_per_s=0.0):
    return {
        "scenario": name,
        "requests": {"ok": ok},
        "throughput": {"duration_s": dur, "probes_per_placement": probes,
                       "rpcs_per_s": rpcs_per_s},
        "cpu_cores": cores,
        "latency_ms": {"scheduling": {"p50": sched_p50_ms}},
    }  # fmt: skip


def test_derive_takes_the_decision_from_the_real_schedule_when_it_rarely_probes():
    from simulator.calibrate import derive

    echo = {"client_s": 0.0002, "server_s": 0.0003}
    warm = _plan("warm", 1000, 1.0, {"dispatch-0": 0.4, "schedule-0": 0.01, "agent-0": 0.1,
                                      "clustermgr-0": 0.1, "load_generator": 0.2},
                 rpcs_per_s=2000.0)  # fmt: skip
    cold = _plan("cold", 500, 1.0, {"dispatch-0": 0.5, "schedule-0": 0.31, "agent-0": 0.35,
                                     "clustermgr-0": 0.1})  # fmt: skip
    ops = derive([warm, cold], echo, nodes=100, decide=0.00002)
    assert ops["schedule.decide"] == pytest.approx(0.00006)  # the real median, not 20 us
    # Schedule per placement: (0.31 - 0.01) / 500 = 600 us, less 1.1 client
    # calls (0.1 probes + the CreateInstance) and the decision.
    assert ops["schedule.schedule"] == pytest.approx(0.0006 - 1.1 * 0.0002 - 0.00006)
    assert ops["agent.create"] == pytest.approx((0.35 - 0.1) / 500 - 0.1 * 0.0003)
    # The warm run's DispatchStream batches: its CPU per message is the
    # message's own work; a request with a stream to itself adds a read
    # and a write (the echo's client CPU per call).
    assert ops["dispatch.message"] == pytest.approx(0.4 / 1000 / 2)
    assert ops["dispatch.dispatch"] == pytest.approx(0.4 / 1000 / 2 + 0.0002)
    # A credit start's stream charges: a write or read is half a unary
    # client call; the messages' own work is the unary figure less its I/O.
    assert ops["dispatch.stream_write"] == ops["agent.stream_write"] == pytest.approx(0.0001)
    assert ops["dispatch.credit_create"] == pytest.approx(ops["dispatch.scale_up"] - 0.0002)
    assert ops["agent.stream_create"] == pytest.approx(ops["agent.create"] - 0.0003)
    # A cold request's Dispatch CPU less what a warm request costs (its
    # Dispatch and Release RPCs, which the model charges every request).
    assert ops["dispatch.scale_up"] == pytest.approx(0.5 / 500 - 0.4 / 1000)
    # A ModNodes call: a unary call on each side (the echo's), plus the
    # in-process upsert per status; per heartbeat is recorded, not charged.
    assert ops["schedule.modnodes"] == 0.0003 and ops["clustermgr.modnodes"] == 0.0002
    assert ops["schedule.modnode"] == pytest.approx(0.01 / 100)
    assert "schedule.modnode" not in cb.OPS and "schedule.upsert" in cb.OPS
    # When most placements probe, their median includes probes: keep the
    # in-process timing.
    cold["throughput"]["probes_per_placement"] = 2.0
    assert derive([warm, cold], echo, nodes=100, decide=0.00002)["schedule.decide"] == 0.00002


@pytest.mark.slow
async def test_event_loop_steps_of_a_grpc_call_are_counted():
    """A real grpc.aio server and client over loopback, in their own processes."""
    from simulator import calibrate

    steps = await calibrate.loop_steps()
    # Reaching a handler takes grpc.aio several iterations (accept, the
    # call's task, reading the message); a reply fewer, but at least one.
    assert steps["loop_request_steps"] > steps["loop_reply_steps"] >= 1
    assert steps["loop_request_steps"] >= 3


@pytest.mark.slow
async def test_control_start_times_a_real_controller_and_stops_it() -> None:
    # It failed with ProcessLookupError once TLS became the default: the
    # controller it spawned refused to start without certificates, and a
    # process that exited early would have been timed as if it had started.
    from simulator.calibrate import control_start

    seconds = await control_start(1)
    assert 0 < seconds < 60


def test_upsert_cost_times_the_modnodes_handling_of_one_status():
    from simulator.calibrate import upsert_cost

    # (Its value is CPU time, not checked against a threshold: it must be
    # measured, i.e. positive.)
    assert upsert_cost(50, rounds=5) > 0
