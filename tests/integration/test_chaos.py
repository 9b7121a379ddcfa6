"""The fault suite: kill -9 of a control function under load loses no
request (SDK failover, supervision), through `galaxy chaos` itself; the
goals of the leading controller's death (--ha), of an etcd outage, of a node
agent stopped past the dead-node timeout and of a whole-control-plane
restart, short versions; and the report's and checks' arithmetic (pure)."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from controlplane.tools.chaos import Outcome, report
from controlplane.tools.chaos_checks import busiest_agent, epoch_check, scale_action_check
from controlplane.tools.chaos_more import config_for
from tests.etcd_server import require_etcd
from tests.integration.upctl import REPO, pid_alive

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


@pytest.mark.parametrize("fault", ["dispatch", "schedule"])
def test_kill_9_under_load_loses_no_request(fault: str, tmp_path) -> None:
    out = tmp_path / "chaos.json"
    r = subprocess.run(
        [sys.executable, "-m", "controlplane.tools.cli", "chaos", "--fault", fault,
         "--rate", "40", "--duration-s", "8", "--at-s", "3", "--nodes", "2",
         "--out", str(out)],
        capture_output=True, text=True, timeout=180, cwd=REPO,
    )  # fmt: skip
    rep = json.loads(out.read_text())
    assert rep["requests"] == 320
    assert rep["victim"].startswith(fault) and rep["victim_back"], r.stdout[-2000:]
    assert rep["failed"] == 0, rep["errors"]
    assert r.returncode == 0


def chaos(
    tmp_path, *flags: str, etcd: bool = True
) -> tuple[dict, subprocess.CompletedProcess[str]]:
    """Run `galaxy chaos` with its own etcd (the binary the fixtures use)
    when the fault needs one."""
    out = tmp_path / "chaos.json"
    env = {**os.environ, "GALAXY_ETCD_BINARY": require_etcd()} if etcd else None
    r = subprocess.run(
        [sys.executable, "-m", "controlplane.tools.cli", "chaos", "--rate", "40", "--nodes", "2",
         "--out", str(out), *flags],
        capture_output=True, text=True, timeout=180, cwd=REPO, env=env,
    )  # fmt: skip
    assert out.exists(), r.stdout[-2000:] + r.stderr[-3000:]
    rep = json.loads(out.read_text())
    # Everything the run started is gone (kills and stops were by PID).
    assert not [p for p in rep["pids"] if pid_alive(p)]
    return rep, r


@pytest.mark.etcd
def test_kill_9_of_the_leading_controller_fails_over_within_the_lease_ttl(tmp_path) -> None:
    rep, r = chaos(tmp_path, "--fault", "controller-leader", "--duration-s", "8", "--at-s", "3")
    assert rep["ha"] and rep["victim"].startswith("controller-"), r.stdout[-2000:]
    # The goal is the lease TTL; by design a takeover may take up to etcd's
    # lease expiry sweep (500 ms) more, which the report states.
    assert rep["detect_s"] is not None and rep["detect_s"] <= rep["takeover_bound_s"], rep
    assert (rep["requests"], rep["failed"], rep["hung"]) == (320, 0, 0), rep["errors"]
    assert rep["victim_back"] and rep["functions_after"] == rep["functions_before"]
    assert rep["scale_actions_applied_twice"] == rep["scale_actions_after_a_newer_term"] == 0


@pytest.mark.etcd
def test_a_takeover_with_scale_actions_fails_nothing_and_applies_none_twice(tmp_path) -> None:
    # T = 10/s per Dispatch instance at 40/s: the leader scales out before
    # the kill, and its instances (its children) die with it.
    rep, r = chaos(
        tmp_path, "--fault", "controller-leader", "--duration-s", "10", "--at-s", "5",
        "--autoscale-t-df", "10",
    )  # fmt: skip
    assert rep["scale_actions"] >= 1, (rep["scale_action_log"], r.stdout[-2000:])
    assert rep["scale_actions_applied_twice"] == rep["scale_actions_after_a_newer_term"] == 0
    # The new leader answers no membership read before it has loaded its
    # predecessor's (the SDK failed with FAILED_PRECONDITION when it did).
    assert (rep["failed"], rep["hung"]) == (0, 0), rep["error_samples"]


@pytest.mark.etcd
def test_an_etcd_outage_refuses_deploys_and_leaves_warm_traffic_alone(tmp_path) -> None:
    rep, r = chaos(
        tmp_path, "--fault", "etcd", "--duration-s", "10", "--at-s", "3", "--outage-s", "4"
    )
    assert (rep["requests"], rep["failed"], rep["hung"]) == (400, 0, 0), rep["errors"]
    during = rep["deploys_during_outage"]
    assert during >= 3 and rep["deploys_refused_unavailable"] == during, rep
    assert rep["acknowledged_deploys_lost"] == 0 and rep["deploys_back_after_s"] is not None
    assert rep["cold_start_during_outage"] == "OK" and rep["write_behind_peak"] > 0
    assert rep["write_behind_drained_after_s"] is not None  # the records landed
    # Before the fault: a function to cold-start in the outage; after the restart: a probe.
    assert rep["functions_after"] == rep["functions_before"] + rep["acknowledged_deploys"] == 6
    assert rep["goal_met"] and r.returncode == 0


def test_the_agent_fault_picks_the_agent_hosting_instances() -> None:
    agents = {"agent-0": ["n-0", "n-1"], "agent-1": ["n-2"]}
    assert busiest_agent(agents, ["n-2", "n-2", "n-0"]) == "agent-1"
    assert busiest_agent(agents, ["n-1", "n-0", "n-2"]) == "agent-0"
    assert busiest_agent(agents, ["n-9"]) is None


@pytest.mark.slow
def test_a_restarted_agent_leaves_no_ghost_instance_with_process_sandboxes(tmp_path) -> None:
    """kill -9 of the node agent hosting the load's instances, restarted at
    once by supervision: Dispatch must stop routing to the instances that
    died with it well before the node could be declared dead."""
    rep, r = chaos(
        tmp_path, "--fault", "agent", "--sandbox", "process", "--duration-s", "12",
        "--at-s", "4", etcd=False,
    )  # fmt: skip
    assert rep["victim"].startswith("agent-") and rep["victim_back"], r.stdout[-2000:]
    assert rep["views_agree_s"] is not None, rep
    assert rep["ghost_instances"] == rep["duplicate_instances"] == 0, rep
    assert rep["goal_met"], rep


def test_a_stopped_node_agent_is_detected_within_3_beats_and_leaks_nothing(tmp_path) -> None:
    # Stopped for 4 s: past the dead-node timeout (3 heartbeats of 1 s).
    rep, r = chaos(
        tmp_path, "--fault", "sigstop-nodeagent", "--duration-s", "10", "--at-s", "3",
        "--outage-s", "4", etcd=False,
    )  # fmt: skip
    assert rep["victim"].startswith("agent-"), r.stdout[-2000:]
    # Declared dead at its last heartbeat + 3 heartbeats: within 3 of the
    # stop (its last beat came before), plus the time to see it.
    assert rep["detect_s"] is not None and rep["detect_s"] <= rep["detect_bound_s"], rep
    assert 3.0 <= rep["silence_when_seen_dead_s"] <= rep["detect_bound_s"], rep
    # Back after SIGCONT, with no duplicate instance and no leaked allocation.
    assert rep["victim_back"] and rep["nodes_alive"] == 2, rep
    assert rep["duplicate_instances"] == rep["leaked_instances"] == 0, rep
    assert (rep["requests"], rep["failed"], rep["hung"]) == (400, 0, 0), rep["errors"]
    assert rep["goal_met"] and r.returncode == 0


@pytest.mark.etcd
def test_a_restarted_control_plane_brings_everything_back(tmp_path) -> None:
    rep, r = chaos(
        tmp_path, "--fault", "restart", "--duration-s", "5", "--at-s", "2", "--functions", "2"
    )
    assert rep["victim"] == "control plane", r.stdout[-2000:]
    assert rep["functions_after"] == rep["functions_before"] == 2, rep
    assert rep["revisions_after"] == rep["revisions_before"] > 0, rep
    assert rep["duplicate_instances"] == rep["leaked_instances"] == 0, rep
    assert rep["nodes_alive"] == 2, rep
    assert rep["goal_met"] and r.returncode == 0


@pytest.mark.etcd
def test_a_restarted_controller_then_a_dispatch_kill_fails_nothing_and_keeps_epochs(
    tmp_path,
) -> None:
    rep, r = chaos(
        tmp_path, "--fault", "controller-then-dispatch", "--duration-s", "6", "--at-s", "2"
    )
    assert rep["victim"] == "controller, then dispatch-0", r.stdout[-2000:] + r.stderr[-2000:]
    assert rep["controller_serving_s"] is not None and rep["victim_back"], rep
    assert rep["repartitioned_after_dispatch_kill_s"] is not None, rep
    # The restarted controller's epoch is above its predecessor's, and no
    # sample (controller or client) ever went back.
    assert rep["epoch_end"] > rep["epoch_after_controller_restart"] > rep["epoch_before"]
    assert rep["epoch_samples"] > 10 and rep["epochs_backwards"] == 0, rep
    assert (rep["failed"], rep["hung"]) == (0, 0), rep["error_samples"]
    assert rep["functions_after"] == rep["functions_before"] == 4
    assert rep["goal_met"] and r.returncode == 0


def test_deleting_a_function_of_many_instances_leaves_none_on_the_nodes(tmp_path) -> None:
    rep, r = chaos(
        tmp_path, "--fault", "delete-many", "--instances", "200", "--orphan-check-s", "1",
        "--duration-s", "4", "--at-s", "2", etcd=False,
    )  # fmt: skip
    assert rep["instances_running_before_delete"] == 200, r.stdout[-2000:] + r.stderr[-2000:]
    assert rep["left_first_look"] > 0  # counted while they were being deleted
    assert rep["zero_left_after_s"] is not None and rep["left_after_grace"] == 0, rep
    assert (rep["failed"], rep["hung"]) == (0, 0), rep["error_samples"]
    assert rep["goal_met"] and r.returncode == 0
