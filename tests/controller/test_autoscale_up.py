"""End to end: `galaxy up --nodes 210 --sandbox emulated --autoscale-control`
with a low configured T_SF. A burst of cold starts makes the controller add
Schedule instances (real processes it starts); when the burst ends they are
drained and removed while a trickle of requests keeps flowing, and no request
fails."""

from __future__ import annotations

import asyncio
import re
import urllib.request

import pytest

from controlplane.tools.burst import burst, summarize
from tests.integration.upctl import GalaxyUp, pid_alive

pytestmark = [pytest.mark.integration, pytest.mark.timeout(120)]


@pytest.mark.slow
def test_schedule_scales_out_on_a_burst_and_back_in(tmp_path):
    # Without capacity credits: with them, most cold starts skip Schedule (a
    # credit places them), so its SRPS is the credit exchanges only and the
    # burst does not load it; this test is about scaling Schedule on SRPS.
    g = GalaxyUp(
        tmp_path,
        "--nodes", "210", "--sandbox", "emulated", "--autoscale-control", "--no-credits",
        "--t-sf", "25", "--max-instances", "schedule=3", "--scale-in-cooldown-s", "2",
    )  # fmt: skip
    g.start(timeout=120)
    pids = g.pids()
    try:
        res = asyncio.run(
            burst(
                g.controller,
                functions=16,
                concurrency=16,
                burst_s=8.0,
                tail_s=40.0,
                tail_rate=4.0,  # 16% of one instance: low enough to scale in
                settle=scaled_out_and_back,
                tls=g.tls(),
                token=g.token,
            )
        )
        s = summarize(res)
        assert res.errors == 0, s["error_messages"]
        assert s["max_schedule_instances"] >= 2, s
        assert s["scale_outs"] and s["scale_outs"][0]["code"] == "overload", s
        assert s["final_schedule_instances"] == 1, s
        ins = [d for d in s["scale_ins"] if d["outcome"] == "done"]
        assert ins and all(d["code"] == "underload" for d in ins), s
        # Scale-out took traffic within seconds of the decision.
        assert 0 < s["scale_outs"][0]["duration_s"] < 30, s

        st = g.cli("status")
        assert st.returncode == 0, st.stderr
        assert re.search(
            r"controller controller-0: leader; autoscaling on \(actuator local\)", st.stdout
        )
        assert re.search(r"schedule\s+instances 1/1 desired \[1\.\.3\]", st.stdout), st.stdout
        assert re.search(r"\d+->\d+ done in [\d.]+s: (overload|underload)", st.stdout), st.stdout
        metrics_addr = g.component("controller")["metrics"]
        text = urllib.request.urlopen(f"http://{metrics_addr}/metrics", timeout=5).read().decode()
        assert 'galaxy_control_instances{kind="schedule",state="ready"} 1.0' in text
        actions = (
            r'galaxy_control_scale_actions_total\{code="overload",direction="out",kind="schedule"\}'
        )
        assert re.search(actions + " [1-9]", text)
        assert 'galaxy_control_capacity_ops_per_second{kind="schedule"} 25.0' in text
    finally:
        rest = g.stop()
    assert "stopped." in rest
    assert not g.kill_leftovers(pids), "processes left after shutdown"
    # The instances the controller started died with it (lifeline).
    left = [int(p) for p in re.findall(r"started schedule schedule-a\d+ \(pid (\d+)\)", _log(g))]
    assert left and not [p for p in left if pid_alive(p)]


def scaled_out_and_back(r) -> bool:
    """Ends the run early: a scale-out was done and every instance added is
    gone again (nothing pending)."""
    outs = [d for d in r.decisions if d["to"] > d["from"] and d["outcome"] == "done"]
    pending = [d for d in r.decisions if d["outcome"] == "pending"]
    return bool(outs) and not pending and bool(r.samples) and r.samples[-1].instances == 1


def _log(g: GalaxyUp) -> str:
    return (g.run_dir / "logs" / "controller.log").read_text()
