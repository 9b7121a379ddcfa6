"""`python -m controlplane.bench.relayfloor`: a short run reports both
clients on both paths, leaves no process behind, and refuses a bad argument
by name. Never how fast anything is."""

import json
import subprocess
import sys

import pytest

from controlplane.bench import relayfloor
from tests.nodeagent.conftest import child_pids


def test_a_short_run_reports_both_clients_on_both_paths() -> None:
    r = subprocess.run(
        [
            sys.executable,
            "-m",
            "controlplane.bench.relayfloor",
            "--requests",
            "100",
            "--rounds",
            "2",
        ],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert r.returncode == 0, r.stderr[-2000:]
    got = json.loads(r.stdout)
    assert (got["requests"], got["rounds"]) == (100, 2)
    for kind in relayfloor.CLIENTS:
        k = got[kind]
        # Every answer was checked 200 on the way (else the run fails).
        assert k["direct_us"] > 0 and k["door_us"] > 0
        assert len(k["rounds_us"]["direct"]) == len(k["rounds_us"]["door"]) == 2
        # (each figure rounded on its own)
        assert k["added_us"] == pytest.approx(k["door_us"] - k["direct_us"], abs=0.11)
        assert k["door_cpu_us_per_request"] >= 0


def test_run_leaves_no_process_behind() -> None:
    # (this worker may hold children of other tests: only new ones count)
    before = child_pids()
    got = relayfloor.run(50, 1, ("raw",))
    assert set(got) == {"requests", "rounds", "raw"}
    assert child_pids() - before == set()


@pytest.mark.parametrize(
    ("argv", "said"),
    [
        (["--requests", "0"], "--requests and --rounds must be at least 1"),
        (["--rounds", "0"], "--requests and --rounds must be at least 1"),
        (["--clients", "curl"], "--clients: raw and/or aiohttp, got 'curl'"),
    ],
)
def test_a_bad_argument_is_refused_by_name(
    argv: list[str], said: str, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit) as e:
        relayfloor.main(argv)
    assert e.value.code == 2
    err = capsys.readouterr().err
    assert said in err and "Traceback" not in err
