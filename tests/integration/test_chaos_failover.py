"""The fault suite, state and leadership: kill -9 of the leading controller
(--ha) with scale actions in flight fails over within its bound and applies
no action twice; an etcd outage refuses deploys and leaves warm traffic
alone, and then a restart of the whole control plane on that etcd brings
everything back (one run, two faults). Short versions of `galaxy chaos` runs."""

from __future__ import annotations

import pytest

from controlplane.controller.leader import DEFAULT_TTL_S
from controlplane.tools.chaos_faults import TAKEOVER_BOUND_S
from tests.integration.chaosrun import by_fault, chaos

# Real `galaxy` processes: the full suite, not the fast tier.
pytestmark = [pytest.mark.integration, pytest.mark.slow]


@pytest.mark.etcd
def test_a_takeover_with_scale_actions_is_bounded_fails_nothing_and_applies_none_twice(
    tmp_path,
) -> None:
    # T = 10/s per Dispatch instance at 40/s: the leader scales out before
    # the kill, and its instances (its children) die with it.
    rep, r = chaos(
        tmp_path, "--fault", "controller-leader", "--duration-s", "10", "--at-s", "5",
        "--autoscale-t-df", "10",
    )  # fmt: skip
    assert rep["ha"] and rep["victim"].startswith("controller-"), r.stdout[-2000:]
    # The bound by design (docs/reliability.md, "Leader takeover"): the TTL
    # after the victim's last keepalive, etcd's lease sweep (0.5 s), a
    # follower's campaign (two etcd writes) and the poll that sees it; it
    # was TTL + sweep (3.5 s), which left the last two out and was missed
    # by 27 ms in one CI run under load. A run past it says which part
    # overran.
    parts = {k: rep[k] for k in ("detect_s", "lease_expired_s", "campaign_s")}
    assert rep["takeover_bound_s"] == TAKEOVER_BOUND_S > DEFAULT_TTL_S
    assert rep["detect_s"] is not None and rep["detect_s"] <= rep["takeover_bound_s"], parts
    assert rep["lease_expired_s"] is not None and rep["campaign_s"] is not None, parts
    assert rep["scale_actions"] >= 1, (rep["scale_action_log"], r.stdout[-2000:])
    assert rep["scale_actions_applied_twice"] == rep["scale_actions_after_a_newer_term"] == 0
    # The new leader answers no membership read before it has loaded its
    # predecessor's (the SDK failed with FAILED_PRECONDITION when it did).
    assert (rep["failed"], rep["hung"]) == (0, 0), rep["error_samples"]
    assert abs(rep["requests"] - 40 * rep["load_s"]) <= 2, (rep["requests"], rep["load_s"])
    assert rep["victim_back"] and rep["functions_after"] == rep["functions_before"]


@pytest.mark.etcd
# Several faults in one run: longer than one fault's (pyproject's 120 s).
@pytest.mark.timeout(300)
def test_an_etcd_outage_then_a_whole_restart_lose_nothing_acknowledged(tmp_path) -> None:
    rep, r = chaos(
        tmp_path, "--fault", "etcd,restart", "--duration-s", "10", "--at-s", "3",
        "--outage-s", "4", "--every-s", "3", timeout_s=270,
    )  # fmt: skip
    faults = by_fault(rep)
    etcd, restart = faults["etcd"], faults["restart"]
    # The outage: warm traffic untouched, deploys refused, none lost.
    assert etcd["requests"] > 0 and (etcd["failed"], etcd["hung"]) == (0, 0), etcd["errors"]
    during = etcd["deploys_during_outage"]
    assert during >= 3 and etcd["deploys_refused_unavailable"] == during, etcd
    assert etcd["acknowledged_deploys_lost"] == 0 and etcd["deploys_back_after_s"] is not None
    assert etcd["cold_start_during_outage"] == "OK" and etcd["write_behind_peak"] > 0
    assert etcd["write_behind_drained_after_s"] is not None  # the records landed
    assert etcd["goal_met"], etcd
    # The restart on the same etcd: every function and revision back (the
    # ones the outage's probes deployed too), no duplicate, no leak.
    assert restart["victim"] == "control plane", r.stdout[-2000:]
    assert restart["revisions_after"] == restart["revisions_before"] > 0, restart
    assert restart["duplicate_instances"] == restart["leaked_instances"] == 0, restart
    assert restart["nodes_alive"] == 2, restart
    assert restart["goal_met"], restart
    # Before the outage: a function to cold-start in it; after the etcd
    # restart: a probe; both survive the whole restart.
    assert rep["functions_after"] == rep["functions_before"] + etcd["acknowledged_deploys"] == 6
    assert abs(rep["requests"] - 40 * rep["load_s"]) <= 2, (rep["requests"], rep["load_s"])
    assert rep["goal_met"] and r.returncode == 0
