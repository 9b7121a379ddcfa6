"""Revision names and traffic splits (pure functions)."""

from __future__ import annotations

import pytest

from controlplane.runtime import revisions
from controlplane.runtime.errors import InvalidArgument, NotFound
from galaxy.v1 import common_pb2

T = common_pb2.TrafficTarget


def spec(latest: int, *targets: common_pb2.TrafficTarget) -> common_pb2.FunctionSpec:
    return common_pb2.FunctionSpec(name="f", revision=latest, traffic=list(targets))


def never(_rev: int) -> bool:
    return False


def test_names_round_trip_and_plain_names_are_their_own_key() -> None:
    assert revisions.revision_name("my-fn", 7) == "my-fn-00007"
    assert revisions.split("my-fn-00007") == ("my-fn", 7)
    assert revisions.split("my-fn") == ("my-fn", 0)
    assert revisions.split("fn-00000") == ("fn-00000", 0)  # no revision 0
    assert revisions.split("fn-0001") == ("fn-0001", 0)  # four digits: a plain name
    assert revisions.routing_key("my-fn-00007") == revisions.routing_key("my-fn") == "my-fn"


def test_latest_ready_falls_back_to_the_newest_ready_revision() -> None:
    assert revisions.latest_ready(3, lambda r: r == 1) == 1
    assert revisions.latest_ready(3, lambda r: r in (1, 2)) == 2
    assert revisions.latest_ready(3, lambda r: True) == 3
    assert revisions.latest_ready(3, never) == 3  # none ready: start the latest


def test_choose_splits_by_percent_over_u() -> None:
    s = spec(2, T(revision=1, percent=90), T(revision=2, percent=10))
    assert revisions.choose(s, "", 0.0, never) == 1
    assert revisions.choose(s, "", 0.899, never) == 1
    assert revisions.choose(s, "", 0.9, never) == 2
    assert revisions.choose(s, "", 0.999999, never) == 2
    counts = {1: 0, 2: 0}
    for i in range(1000):
        counts[revisions.choose(s, "", i / 1000, never)] += 1
    assert counts == {1: 900, 2: 100}


def test_empty_split_and_latest_target_follow_the_latest_ready() -> None:
    assert revisions.choose(spec(2), "", 0.5, lambda r: r == 1) == 1
    assert revisions.choose(spec(2), "", 0.5, lambda r: r == 2) == 2
    s = spec(3, T(revision=0, percent=100))
    assert revisions.choose(s, "", 0.3, lambda r: r <= 2) == 2


def test_tags_pin_a_revision_whatever_its_share() -> None:
    s = spec(2, T(revision=1, percent=100), T(revision=2, percent=0, tag="canary"))
    assert revisions.choose(s, "canary", 0.0, never) == 2
    assert revisions.choose(s, "", 0.99, never) == 1
    with pytest.raises(NotFound) as e:
        revisions.choose(s, "blue", 0.0, never)
    assert "blue" in str(e.value)


def test_routed_names_revisions_with_a_share_or_a_tag() -> None:
    s = spec(3, T(revision=1, percent=100), T(revision=3, percent=0, tag="next"))
    assert revisions.routed(s, never) == {1, 3}
    assert revisions.routed(spec(3), lambda r: r == 2) == {2}
    assert revisions.routed(common_pb2.FunctionSpec(name="f"), never) == set()


@pytest.mark.parametrize(
    ("targets", "field"),
    [
        ([], "traffic"),
        ([T(revision=1, percent=50)], "traffic"),
        ([T(revision=4, percent=100)], "traffic[0].revision"),
        ([T(revision=1, percent=101)], "traffic[0].percent"),
        ([T(revision=1, percent=100, tag="Bad_Tag")], "traffic[0].tag"),
        (
            [T(revision=1, percent=50, tag="a"), T(revision=2, percent=50, tag="a")],
            "traffic[1].tag",
        ),
    ],
)
def test_bad_splits_name_the_field(targets: list[common_pb2.TrafficTarget], field: str) -> None:
    with pytest.raises(InvalidArgument) as e:
        revisions.check_targets(targets, latest=3)
    assert e.value.message.startswith(field), e.value.message


def test_a_good_split_passes() -> None:
    revisions.check_targets([T(revision=0, percent=80), T(revision=2, percent=20, tag="b")], 3)
