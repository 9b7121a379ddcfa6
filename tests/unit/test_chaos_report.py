"""Several faults in one `galaxy chaos` run: the --fault list, how requests
are shared out between the faults, and each fault's load verdict (pure)."""

from __future__ import annotations

import argparse

import pytest

from controlplane.tools import cli
from controlplane.tools.chaos_more import FAULTS
from controlplane.tools.chaos_report import Outcome, load_verdict, parse_faults, report, windows


def test_a_fault_list_is_parsed_in_order() -> None:
    assert parse_faults("dispatch", FAULTS) == ["dispatch"]
    assert parse_faults("dispatch, schedule,clustermgr", FAULTS) == [
        "dispatch", "schedule", "clustermgr",
    ]  # fmt: skip


@pytest.mark.parametrize(
    ("text", "says"),
    [
        ("dispatch,nosuch", "'nosuch'"),
        ("dispatch,", "(empty)"),
        ("none,dispatch", "'none' cannot be combined"),
        ("dispatch,dispatch", "named twice"),
    ],
)
def test_a_bad_fault_list_is_refused_naming_the_item(text: str, says: str) -> None:
    with pytest.raises(argparse.ArgumentTypeError) as e:
        parse_faults(text, FAULTS)
    assert says in str(e.value)


def test_the_cli_refuses_a_bad_list_naming_the_flag(
    capsys: pytest.CaptureFixture[str], tmp_path: object
) -> None:
    with pytest.raises(SystemExit) as e:
        cli.main(["chaos", "--fault", "dispatch,x" * 50, "--out", f"{tmp_path}/r.json"])
    err = capsys.readouterr().err
    assert e.value.code != 0 and "--fault" in err and "Traceback" not in err
    assert len(err) < 1000  # the bad item is named, the input not echoed whole


def test_requests_go_to_the_last_fault_before_they_ended() -> None:
    rows = [
        (0.0, 0.1, ""),  # ended before the first fault: the first's
        (1.9, 0.2, "UNAVAILABLE"),  # in flight at the first fault (2.0)
        (3.0, 0.1, ""),
        (4.8, 0.5, "DEADLINE_EXCEEDED"),  # in flight at the second (5.0)
        (6.0, 0.1, ""),
    ]
    first, second = windows(rows, [2.0, 5.0])
    assert first == rows[:3] and second == rows[3:]
    assert windows(rows, [2.0]) == [rows]
    assert windows(rows, []) == []


def test_each_fault_gets_its_own_verdict_from_its_requests() -> None:
    rows = [(0.0, 0.1, ""), (2.5, 0.1, "UNAVAILABLE"), (5.5, 0.1, "")]
    plan = [(2.0, "dispatch"), (5.0, "schedule")]
    per = [
        report(Outcome(rows=w), at, name, "", True, fault_t=at)
        for w, (at, name) in zip(windows(rows, [at for at, _ in plan]), plan, strict=True)
    ]
    assert [load_verdict(r["fault"], r)[1] for r in per] == [False, True]
    # A restart's requests fail by design; an agent's before its
    # registration are excused, not one after.
    assert load_verdict("restart", per[0]) == ("", True)
    agent = report(Outcome(rows=rows), 2.0, "agent", "agent-0", True, fault_t=2.0, registered_t=3.0)
    goal, ok = load_verdict("agent", agent)
    assert ok and "registered again" in goal
    late = report(Outcome(rows=rows), 2.0, "agent", "agent-0", True, fault_t=2.0, registered_t=2.4)
    assert not load_verdict("agent", late)[1]
