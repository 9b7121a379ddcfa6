"""py-spy collapsed stacks -> shares; CPU time from /proc."""

import os

from controlplane.bench import profile

_HEAD = 'process 1:"python";<module> (a/cli.py:10);'
COLLAPSED = "\n".join(
    [
        _HEAD + "run (asyncio/runners.py:44);Runner.run (asyncio/runners.py:118) 60",
        _HEAD
        + "wrapped (controlplane/runtime/rpc.py:70);"
        + "Dispatch (functions/dispatch/service.py:200) 30",
        _HEAD
        + "wrapped (controlplane/runtime/rpc.py:71);"
        + "labels (/usr/lib/python3.11/site-packages/prometheus_client/metrics.py:9) 10",
        "garbage line",
    ]
)


def test_top_functions_self_and_total():
    t = profile.top_functions(COLLAPSED)
    assert t["samples"] == 100
    top_self = dict(t["self"])
    assert top_self["Runner.run (asyncio/runners.py)"] == 0.6
    assert top_self["Dispatch (functions/dispatch/service.py)"] == 0.3
    # Library paths are shortened; line numbers do not split a function.
    assert top_self["labels (prometheus_client/metrics.py)"] == 0.1
    total = dict(t["total"])
    assert total["wrapped (controlplane/runtime/rpc.py)"] == 0.4
    assert "<module> (a/cli.py)" not in total  # on every stack: no information
    assert profile.top_functions("") == {"samples": 0, "self": [], "total": []}


def test_cpu_seconds_of_this_process():
    spent = profile.cpu_seconds(os.getpid())
    assert spent is not None and spent > 0
    assert profile.cpu_seconds(2**22 + 12345) is None
    snap = profile.cpu_snapshot({"me": os.getpid(), "gone": 2**22 + 12345})
    assert set(snap) == {"me"}


def test_machine_cpu_and_the_cores_other_work_took():
    from controlplane.bench import summary

    a = profile.machine_cpu()
    assert set(a) == {"busy", "steal", "at"} and a["busy"] > 0
    # Two readings 2 s apart: 3 CPU-seconds busy (1.5 cores), 0.2 stolen;
    # our processes used 1.0 core, so others took 0.5 + 0.2 (steal).
    r0 = {"busy": 100.0, "steal": 1.0, "at": 10.0}
    r1 = {"busy": 103.0, "steal": 1.4, "at": 12.0}
    m = summary.machine_cores(r0, r1, {"dispatch-0": 0.6, "schedule-0": 0.4, "x": float("nan")})
    assert m["busy"] == 1.5 and m["ours"] == 1.0
    assert abs(m["others"] - 0.7) < 1e-9
    # Readings that cannot be compared give nothing rather than nonsense.
    assert summary.machine_cores({}, r1, {}) == {} and summary.machine_cores(r1, r0, {}) == {}
    # Others never go negative (our CPU is sampled per process, a bit apart).
    assert abs(summary.machine_cores(r0, r1, {"a": 2.0})["others"] - 0.2) < 1e-9
