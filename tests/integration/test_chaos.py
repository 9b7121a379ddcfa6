"""The fault suite, kills of the request path: kill -9 of Dispatch, of
Schedule and of ClusterMgr under load loses no request (SDK failover,
supervision), a restarted controller then a Dispatch kill keep epochs: one
`galaxy chaos` run injecting them one after another; and the report's and
checks' arithmetic (pure). The other
faults: test_chaos_failover.py (controller leader, etcd) and
test_chaos_nodes.py (node agents, restarts, deletes)."""

from __future__ import annotations

import pytest

from controlplane.tools.chaos_checks import epoch_check, scale_action_check
from controlplane.tools.chaos_more import config_for
from controlplane.tools.chaos_report import Outcome, report
from tests.integration.chaosrun import by_fault, chaos

# Real `galaxy` processes: the full suite, not the fast tier.
pytestmark = [pytest.mark.integration, pytest.mark.slow]


def test_report_counts_failures_gaps_and_latency_around_the_fault() -> None:
    out = Outcome()
    out.rows = [(0.0, 0.010, ""), (1.0, 0.020, ""), (2.0, 0.5, "UNAVAILABLE"), (3.0, 0.030, "")]
    rep = report(out, at_s=1.5, fault="dispatch", victim="dispatch-0", back=True)
    assert (rep["requests"], rep["failed"], rep["errors"]) == (4, 1, {"UNAVAILABLE": 1})
    assert rep["longest_gap_s"] == pytest.approx(2.01)  # 1.02 -> 3.03
    assert rep["p50_ms_before"] == pytest.approx(15.0)
    assert (rep["succeeded"], rep["hung"], rep["recover_s"]) == (3, 0, pytest.approx(1.0))
    # Failures after the last success: a gap to the end; slow is hung.
    out.rows.append((4.0, 6.0, "HUNG"))
    rep = report(out, at_s=1.5, fault="dispatch", victim="dispatch-0", back=True, hung_s=5.0)
    assert rep["hung"] == 1 and rep["longest_gap_s"] == pytest.approx(6.97)


def test_report_counts_apart_the_failures_in_flight_at_the_fault() -> None:
    out = Outcome()
    out.rows = [
        (1.0, 0.8, "UNAVAILABLE"),  # in flight at 1.5: died with its instance
        (1.2, 0.2, "UNAVAILABLE"),  # over before the fault
        (1.6, 0.1, "UNAVAILABLE"),  # sent after it
        (1.4, 6.0, "HUNG"),  # in flight, but hung: never excused
        (2.0, 0.01, ""),
    ]
    rep = report(out, at_s=1.5, fault="agent", victim="agent-0", back=True, fault_t=1.5)
    assert rep["failed"] == 4 and rep["failed_in_flight_at_fault"] == 1
    assert rep["failed_before_registration"] == 0  # no registration seen: none
    assert report(out, 1.5, "agent", "agent-0", True)["failed_in_flight_at_fault"] == 0
    # Registered again at 1.65: the request sent at 1.6 could not have known.
    rep = report(out, 1.5, "agent", "agent-0", True, fault_t=1.5, registered_t=1.65)
    assert rep["failed_before_registration"] == 1
    rep = report(out, 1.5, "agent", "agent-0", True, fault_t=1.5, registered_t=1.55)
    assert rep["failed_before_registration"] == 0


def test_scale_action_check_finds_an_action_applied_twice() -> None:
    def rec(action: str, term: int) -> dict[str, object]:
        return {"action": action, "term": term, "desired": 3}

    clean = [(10, rec("5-1", 5)), (12, rec("5-2", 5)), (20, rec("9-1", 9))]
    assert scale_action_check(clean) == {
        "scale_actions": 3, "scale_actions_applied_twice": 0,
        "scale_actions_after_a_newer_term": 0,
    }  # fmt: skip
    # The same decision applied again by a new leader; then a deposed
    # leader's action landing after its successor's (by store revision).
    bad = [*clean, (25, rec("5-2", 5))]
    got = scale_action_check(bad)
    assert got["scale_actions_applied_twice"] == 1
    assert got["scale_actions_after_a_newer_term"] == 1
    assert scale_action_check([])["scale_actions"] == 0


def test_epoch_check_finds_an_epoch_going_backwards_per_source() -> None:
    # A client's 0 before its first answer, and sources interleaved: fine.
    ok = [("client", 0), ("controller", 5), ("client", 5), ("controller", 7), ("client", 7)]
    assert epoch_check(ok)["epochs_backwards"] == 0
    # A restarted controller numbering from 1 again (the bug).
    got = epoch_check([*ok, ("controller", 1), ("client", 7), ("controller", 2)])
    assert got["epochs_backwards"] == 2, got
    assert got["epochs_backwards_first"] == ["controller: 7 -> 1", "controller: 7 -> 2"]


def test_delete_many_gets_room_and_limits_for_its_instances() -> None:
    assert config_for("dispatch", 5000, 4) == {}
    cfg = config_for("delete-many", 5000, 4, orphan_check_s=2.0)
    # 1,250 instances a node of 1 millicore and 1 MiB each, twice over, on
    # top of the default node; the controller lets one function have 5,000.
    assert (cfg["node_cpu_millis"], cfg["node_memory_mib"]) == (4000 + 2500, 8192 + 2500)
    args = cfg["controller_args"]
    assert args[args.index("--max-instances-per-function") + 1] == "5000"
    assert args[args.index("--default-quota-fraction") + 1] == "1"
    assert cfg["extra"] == {"nodeagent": ["--orphan-check-s", "2.0"]}


@pytest.mark.etcd
# Several faults in one run: longer than one fault's (pyproject's 120 s).
@pytest.mark.timeout(300)
def test_kills_of_each_control_function_and_the_controller_lose_no_request(tmp_path) -> None:
    """One control plane, four faults one after another: kill -9 of
    Dispatch, of Schedule, of ClusterMgr, then of the controller followed by
    a Dispatch (the epochs check). Each fault is judged on the requests
    that ended in its window (until the next fault)."""
    rep, r = chaos(
        tmp_path, "--fault", "dispatch,schedule,clustermgr,controller-then-dispatch",
        "--duration-s", "8", "--at-s", "3", "--every-s", "3", timeout_s=270,
    )  # fmt: skip
    faults = by_fault(rep)
    assert list(faults) == ["dispatch", "schedule", "clustermgr", "controller-then-dispatch"]
    # The open-loop load sent every request of its length (40/s).
    assert abs(rep["requests"] - 40 * rep["load_s"]) <= 2, (rep["requests"], rep["load_s"])
    for kind in ("dispatch", "schedule", "clustermgr"):
        f = faults[kind]
        assert f["victim"].startswith(kind) and f["victim_back"], (f, r.stdout[-2000:])
        assert f["requests"] > 0 and f["failed"] == 0, (kind, f["errors"], f["error_samples"])
        assert f["goal_met"], f
    ctd = faults["controller-then-dispatch"]
    assert ctd["victim"].startswith("controller, then dispatch-"), ctd
    assert ctd["controller_serving_s"] is not None and ctd["victim_back"], ctd
    assert ctd["repartitioned_after_dispatch_kill_s"] is not None, ctd
    # The restarted controller's epoch is above its predecessor's, and no
    # sample (controller or client) ever went back.
    assert ctd["epoch_end"] > ctd["epoch_after_controller_restart"] > ctd["epoch_before"]
    assert ctd["epoch_samples"] > 10 and ctd["epochs_backwards"] == 0, ctd
    assert (ctd["failed"], ctd["hung"]) == (0, 0), ctd["error_samples"]
    assert (rep["failed"], rep["hung"]) == (0, 0), rep["error_samples"]
    assert rep["functions_after"] == rep["functions_before"] == 4
    assert rep["goal_met"] and r.returncode == 0
