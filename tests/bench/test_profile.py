"""py-spy collapsed stacks -> shares; CPU time from /proc."""

import os

from controlplane.bench import profile

_HEAD = 'process 1:"python";<module> (a/cli.py:10);'
COLLAPSED = "\n".join(
    [
        _HEAD + "run (asyncio/runners.py:44);Runner.run (asyncio/runners.py:118) 60",
        _HEAD + "wrapped (controlplane/rpc.py:70);Dispatch (functions/dispatch/service.py:200) 30",
        _HEAD
        + "wrapped (controlplane/rpc.py:71);"
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
    assert total["wrapped (controlplane/rpc.py)"] == 0.4
    assert "<module> (a/cli.py)" not in total  # on every stack: no information
    assert profile.top_functions("") == {"samples": 0, "self": [], "total": []}


def test_cpu_seconds_of_this_process():
    spent = profile.cpu_seconds(os.getpid())
    assert spent is not None and spent > 0
    assert profile.cpu_seconds(2**22 + 12345) is None
    snap = profile.cpu_snapshot({"me": os.getpid(), "gone": 2**22 + 12345})
    assert set(snap) == {"me"}
