"""A start's attempt loop (functions/dispatch/attempts.py), the core that
Dispatch's starts.py and the simulator's placement.py both drive."""

from __future__ import annotations

from functions.dispatch import attempts as at


def _loop(
    ranked: list[str], room: list[bool] | None = None, max_spill: int = 1
) -> at.StartAttempts[str]:
    answers = iter(room or [])
    retry = (lambda tries: next(answers)) if room is not None else None
    return at.StartAttempts("an instance of f", lambda: ranked, max_spill, retry)


def test_a_credit_first_then_the_ranked_schedule_instances_with_spill() -> None:
    loop = _loop(["s0", "s1", "s2"], room=[False])
    assert loop.next() == at.UseCredit(["s0", "s1", "s2"])
    loop.no_credit()
    assert loop.next() == at.AskSchedule("s0", False)
    loop.failed("RESOURCE_EXHAUSTED", "schedule s0: full")
    assert loop.next() == at.AskSchedule("s1", True)
    loop.failed("RESOURCE_EXHAUSTED", "schedule s1: full")
    step = loop.next()  # max_spill 1: s2 is not asked; no room left to return
    assert isinstance(step, at.GiveUp) and step.failure == at.NO_ROOM
    assert step.message == "cannot start an instance of f: schedule s0: full; schedule s1: full"


def test_no_room_is_tried_again_once_spent_credits_are_returned() -> None:
    loop = _loop(["s0"], room=[True, False])
    loop.next()
    loop.no_credit()
    loop.next()
    loop.failed("RESOURCE_EXHAUSTED", "full")
    assert loop.next() == at.ReturnCredits()
    assert loop.next() == at.UseCredit(["s0"])  # a new round, a credit first
    assert loop.room_retries == 1


def test_a_start_handed_over_is_not_tried_again() -> None:
    loop = _loop(["s0"], room=[True])
    loop.next()
    loop.no_credit()
    loop.next()
    loop.failed("RESOURCE_EXHAUSTED", "full")
    assert isinstance(loop.next(routed=False), at.GiveUp)


def test_in_doubt_is_retried_through_schedule_only_with_growing_pauses() -> None:
    loop = _loop(["s0"], room=[])
    assert isinstance(loop.next(), at.UseCredit)
    loop.credit_failed(at.IN_DOUBT, "create timed out")
    assert loop.next() == at.Pause(at.START_RETRY_S)
    for pause in (at.START_RETRY_S * 2, None):
        assert loop.next() == at.AskSchedule("s0", False)  # no credit: Schedule joins it
        loop.failed("DEADLINE_EXCEEDED", "schedule s0: deadline")
        step = loop.next()
        if pause is not None:
            assert step == at.Pause(pause)
    assert isinstance(step, at.GiveUp) and step.failure == at.IN_DOUBT
    assert step.message.endswith("retry later") and loop.doubts == at.START_ATTEMPTS


def test_a_deadline_does_not_spill_but_unreachable_does() -> None:
    loop = _loop(["s0", "s1"])
    assert loop.next() == at.AskSchedule("s0", False)
    loop.failed("UNAVAILABLE", "s0 gone")
    assert loop.next() == at.AskSchedule("s1", True)
    loop.failed("DEADLINE_EXCEEDED", "s1 slow")
    assert isinstance(loop.next(), at.Pause)


def test_never_fits_only_when_every_partition_says_so() -> None:
    loop = _loop(["s0", "s1"])
    for s in ("s0", "s1"):
        assert isinstance(loop.next(), at.AskSchedule)
        loop.failed("FAILED_PRECONDITION", f"{s}: too big")
    step = loop.next()
    assert isinstance(step, at.GiveUp) and step.failure == at.NEVER_FITS
    loop = _loop(["s0", "s1"])
    loop.next()
    loop.failed("FAILED_PRECONDITION", "s0: too big")
    loop.next()
    loop.failed("RESOURCE_EXHAUSTED", "s1: full")
    step = loop.next()
    assert isinstance(step, at.GiveUp) and step.failure == at.NO_ROOM


def test_no_schedule_instance_yet_is_in_doubt() -> None:
    loop = _loop([])
    step = loop.next()
    assert step == at.Pause(at.START_RETRY_S)
