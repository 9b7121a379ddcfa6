"""Rendezvous hashing: ownership, balance, minimal movement."""

import statistics

from controlplane.runtime import rendezvous


def nodes(n):
    return [f"node-{i}" for i in range(n)]


def test_every_key_has_exactly_one_owner_independent_of_member_order():
    members = ["s-0", "s-1", "s-2"]
    for k in nodes(300):
        o = rendezvous.owner(k, members)
        assert o in members
        assert rendezvous.owner(k, list(reversed(members))) == o
        assert rendezvous.ranked(k, members)[0] == o
    parts = rendezvous.partition(nodes(300), members)
    assert sum(len(v) for v in parts.values()) == 300


def test_no_members_no_owner():
    assert rendezvous.owner("k", []) is None


def test_balance_for_210_and_10000_nodes():
    # max/mean within 1.35 for 210 nodes over 4 (binomial spread, n/k ~ 52)
    # and within 1.1 for 10,000 nodes over 8.
    for n, k, bound in ((210, 4, 1.35), (10_000, 8, 1.1)):
        members = [f"s-{i}" for i in range(k)]
        sizes = [len(v) for v in rendezvous.partition(nodes(n), members).values()]
        assert max(sizes) / statistics.mean(sizes) <= bound, (n, k, sizes)


def test_adding_a_member_moves_only_keys_it_wins():
    keys = nodes(10_000)
    before = [f"s-{i}" for i in range(4)]
    after = [*before, "s-4"]
    moved = [k for k in keys if rendezvous.owner(k, before) != rendezvous.owner(k, after)]
    assert all(rendezvous.owner(k, after) == "s-4" for k in moved)
    # ~1/(n+1) = 20% move; allow sampling noise.
    assert 0.17 < len(moved) / len(keys) < 0.23


def test_removing_a_member_moves_only_its_keys():
    keys = nodes(5_000)
    members = [f"s-{i}" for i in range(5)]
    gone = "s-2"
    rest = [m for m in members if m != gone]
    for k in keys:
        o = rendezvous.owner(k, members)
        if o != gone:
            assert rendezvous.owner(k, rest) == o
