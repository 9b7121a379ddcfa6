"""`python -m controlplane.bench.wakeups`: a short run reports every kind and
placement with plausible figures, leaves no child behind, and refuses a bad
argument by name. Never how fast anything is."""

import json
import os
import subprocess
import sys

import pytest

from controlplane.bench import wakeups
from tests.nodeagent.conftest import child_pids


def test_round_trips_report_time_and_cpu_and_reap_the_child() -> None:
    before = child_pids()
    cpus = os.sched_getaffinity(0)
    first = min(cpus)
    got = wakeups.round_trips("tcp", (first, first), 200, 100)
    assert got["round_trip_us"] > 0 and got["cpu_us"] >= 0
    assert child_pids() - before == set()
    assert os.sched_getaffinity(0) == cpus  # this process's placement is given back


def test_the_command_reports_each_kind_and_placement() -> None:
    r = subprocess.run(
        [
            sys.executable,
            "-m",
            "controlplane.bench.wakeups",
            "--round-trips",
            "100",
            "--rounds",
            "1",
        ],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert r.returncode == 0, r.stderr
    runs = json.loads(r.stdout)["runs"]
    placements = {"same_cpu", "other_cpu"} if len(os.sched_getaffinity(0)) > 1 else {"same_cpu"}
    for kind in ("tcp", "unix"):
        assert set(runs[kind]) == placements
        for got in runs[kind].values():
            assert len(got) == 1 and got[0]["round_trip_us"] > 0


@pytest.mark.parametrize("flag", ["--round-trips", "--size"])
def test_a_bad_count_is_refused_by_name(flag: str, capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as e:
        wakeups.main([flag, "0"])
    assert e.value.code == 2
    err = capsys.readouterr().err
    assert "--round-trips and --size must be at least 1" in err
    assert "Traceback" not in err
