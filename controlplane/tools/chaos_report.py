"""The arithmetic of a `galaxy chaos` report (pure; chaos.py runs the load
and the faults): the load's summary (``report``), and for several faults in
one run, the fault list, how the load's requests are shared out between
the faults and each fault's verdict.

``--fault dispatch,schedule,clustermgr`` injects the faults one after
another in one control plane: the first at ``--at-s``, each next one
``--every-s`` after the previous one was over (its fault function
returned: replaced, taken over, resumed...), so that each fault meets a
settled cluster and its effects can be told apart. A request belongs to
the fault that came last before it ended (a request in flight at a fault
is that fault's), and each fault gets its own report and verdict from its
requests; the run's goal is met when every fault's is.
"""

from __future__ import annotations

import argparse
import itertools
import statistics
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

#: A request as the load records it: (start s, latency s, error or "").
Row = tuple[float, float, str]
#: The error of a request still unanswered when the load ended (cancelled).
HUNG = "HUNG"


@dataclass
class Outcome:
    """Requests of one run: (start time, latency s, error or "")."""

    rows: list[tuple[float, float, str]] = field(default_factory=list)
    #: The first message seen per error code (what a failure said).
    samples: dict[str, str] = field(default_factory=dict)
    #: The load's start (event-loop time): rows' start times count from it.
    t0: float = 0.0
    #: How long requests were sent (the load's length).
    load_s: float = 0.0


def report(
    out: Outcome,
    at_s: float,
    fault: str,
    victim: str,
    back: bool | None,
    hung_s: float = 5.0,
    fault_t: float | None = None,
    registered_t: float | None = None,
) -> dict[str, Any]:
    """The summary of one run (pure). ``fault_t``: when the fault was
    injected, in the rows' time (requests in flight then are counted apart);
    ``registered_t``: when a restarted agent was seen registered (requests
    sent from the fault until then are counted apart too)."""
    rows = sorted(out.rows)
    ok = [r for r in rows if not r[2]]
    errors: dict[str, int] = {}
    for r in rows:
        if r[2]:
            errors[r[2]] = errors.get(r[2], 0) + 1
    # The longest time with no request completing successfully.
    done = sorted(r[0] + r[1] for r in ok)
    if rows:  # failures after the last success count as a gap too
        done.append(max(done[-1] if done else 0.0, max(r[0] + r[1] for r in rows)))
    gaps = [b - a for a, b in itertools.pairwise(done)]
    # Recovered when the last request that failed after the fault ended.
    failed_after = [r[0] + r[1] for r in rows if r[2] and r[0] >= at_s]

    def p(rows: list[tuple[float, float, str]], q: float) -> float | None:
        lat = [r[1] * 1000 for r in rows]
        if len(lat) < 2:
            return None
        return round(statistics.quantiles(lat, n=100)[int(q * 100) - 1], 2)

    before = [r for r in ok if r[0] < at_s]
    after = [r for r in ok if r[0] >= at_s]
    return {
        "fault": fault,
        "victim": victim,
        "victim_back": back,
        "requests": len(rows),
        "succeeded": len(ok),
        "failed": len(rows) - len(ok),
        "errors": errors,
        "error_samples": dict(out.samples),
        "hung": sum(1 for r in rows if r[2] == HUNG or r[1] >= hung_s),
        # Failed (not hung) requests already in flight when the fault struck.
        "failed_in_flight_at_fault": 0
        if fault_t is None
        else sum(1 for r in rows if r[2] and r[2] != HUNG and r[0] <= fault_t <= r[0] + r[1]),
        # Failed (not hung) requests sent between the fault and the restarted
        # agent's registration: nothing could know the instance had died.
        "failed_before_registration": 0
        if fault_t is None or registered_t is None
        else sum(1 for r in rows if r[2] and r[2] != HUNG and fault_t < r[0] < registered_t),
        "recover_s": round(max(failed_after) - at_s, 3) if failed_after else 0.0,
        "longest_gap_s": round(max(gaps, default=0.0), 3),
        "p50_ms_before": p(before, 0.5),
        "p99_ms_before": p(before, 0.99),
        "p50_ms_after": p(after, 0.5),
        "p99_ms_after": p(after, 0.99),
    }


#: Faults that end the run's state as it was (the whole control plane is
#: started again): requests meanwhile fail by design, and no leak check.
RESTART = "restart"
#: The agent fault's excused failures (see ``load_verdict``).
AGENT = "agent"


def parse_faults(text: str, known: Sequence[str]) -> list[str]:
    """``--fault``'s value: one fault or several, comma-separated, each one
    of ``known``; "none" only alone. Raises ``argparse.ArgumentTypeError``
    naming the bad item (argparse prints it as an error of ``--fault``)."""
    faults = [f.strip() for f in text.split(",")]
    for f in faults:
        if f not in known:
            shown = f[:40] or "(empty)"
            raise argparse.ArgumentTypeError(
                f"unknown fault {shown!r}; choose from {', '.join(known)}"
            )
    if "none" in faults and len(faults) > 1:
        raise argparse.ArgumentTypeError("'none' cannot be combined with other faults")
    if len(set(faults)) != len(faults):
        raise argparse.ArgumentTypeError("a fault is named twice")
    return faults


def windows(rows: Sequence[Row], fault_ts: Sequence[float]) -> list[list[Row]]:
    """The load's rows shared out between faults injected at ``fault_ts``
    (the rows' time, ascending): a row goes to the last fault at or before
    its end (start + latency), rows that ended before the first fault to
    the first. One list per fault, in order."""
    out: list[list[Row]] = [[] for _ in fault_ts]
    if not fault_ts:
        return out
    for row in rows:
        end = row[0] + row[1]
        i = 0
        for k, t in enumerate(fault_ts):
            if t <= end:
                i = k
        out[i].append(row)
    return out


def load_verdict(fault: str, rep: dict[str, Any]) -> tuple[str, bool]:
    """The load's part of a fault's goal, from its report: no request
    failed or hung, but (agent) those on the killed agent's instances
    before it registered again, and (restart) any: a restart stops
    everything, its requests meanwhile fail by design. A killed agent
    takes its instances along: a request in flight on one, or sent to one
    before the restarted agent registered (until then nothing knows it
    died), cannot be answered; every request sent after the registration
    counts, and so does every hang."""
    if fault == RESTART:
        return "", True
    excused = 0
    goal = "0 requests failed or hung"
    if fault == AGENT:
        excused = rep["failed_in_flight_at_fault"] + rep["failed_before_registration"]
        goal += " (but those on the killed agent's instances before it registered again)"
    return goal, rep["failed"] - excused == 0 and rep["hung"] == 0


def joined_goal(*goals: str) -> str:
    """Goals joined with "; ", empty ones left out."""
    return "; ".join(g for g in goals if g)
