"""Routed entries' pure parts: the subnet's /30 slots an agent holds, the
flag's subnet, and route tokens (what the door checks before it routes)."""

from __future__ import annotations

import ipaddress

import pytest

from controlplane.nodeagent.entry import routing
from controlplane.nodeagent.entry.routes import RoutePool, parse_subnet
from controlplane.runtime import leasetoken
from controlplane.runtime.leasetoken import SKEW_MS, LeaseKey, Verdict

NOW = 1_800_000_000_000
KEY = LeaseKey(b"k" * 32)
ROUTE = KEY.route_key()


def test_slots_are_the_subnets_30s_named_by_their_number():
    pool = RoutePool(ipaddress.IPv4Network("10.213.0.0/28"))
    assert pool.size == 4
    s = pool.take()
    assert s is not None
    assert (s.index, s.host, s.inner, s.ifname) == (0, "10.213.0.1", "10.213.0.2", "gxe0")
    last = pool.slot(3)
    assert (last.host, last.inner) == ("10.213.0.13", "10.213.0.14")


def test_take_skips_held_slots_and_wraps_from_its_start():
    pool = RoutePool(ipaddress.IPv4Network("10.213.0.0/28"), start=6)  # 6 % 4 = 2
    got = []
    for _ in range(4):
        s = pool.take()
        assert s is not None
        pool.hold(s)
        got.append(s.index)
    assert got == [2, 3, 0, 1]
    assert pool.take() is None and pool.held == 4
    pool.release(pool.slot(3))
    s = pool.take()
    assert s is not None and s.index == 3


def test_a_name_taken_by_another_agent_moves_take_on():
    """take proposes the next slot every call, so a slot whose name the
    kernel refused (another agent's) is not proposed again at once."""
    pool = RoutePool(ipaddress.IPv4Network("10.213.0.0/16"))
    first, second = pool.take(), pool.take()
    assert first is not None and second is not None and first.index != second.index


@pytest.mark.parametrize(
    "text, error",
    [
        ("nonsense", "is not an IPv4 network"),
        ("10.213.0.1/16", "is not an IPv4 network"),  # host bits set
        ("fd00::/64", "IPv4 only"),
        ("10.213.0.0/30", "at most /28"),
    ],
)
def test_a_bad_subnet_is_named(text, error):
    with pytest.raises(ValueError, match=error):
        parse_subnet(text)


def test_an_empty_subnet_turns_routing_off():
    assert parse_subnet("") is None and parse_subnet("  ") is None
    assert parse_subnet("10.213.0.0/16") == ipaddress.IPv4Network("10.213.0.0/16")


def test_a_route_token_opens_one_port_from_one_source_port_until_its_end():
    token = ROUTE.sign_route(8000, 40000, NOW + 1_000)
    assert ROUTE.verify_route(token, 8000, 40000, NOW) is Verdict.OK
    assert ROUTE.verify_route(token, 8000, 40000, NOW + 1_001 + SKEW_MS) is Verdict.EXPIRED
    assert ROUTE.verify_route(token, 8001, 40000, NOW) is Verdict.FORGED
    assert ROUTE.verify_route(token, 8000, 40001, NOW) is Verdict.FORGED
    assert LeaseKey(b"x" * 32).route_key().verify_route(token, 8000, 40000, NOW) is Verdict.FORGED
    assert ROUTE.verify_route("nope", 8000, 40000, NOW) is Verdict.MALFORMED
    assert ROUTE.verify_route(None, 8000, 40000, NOW) is Verdict.MISSING


def test_a_lease_token_is_not_a_route_token_nor_the_reverse():
    """Two domains under one key: neither token passes for the other."""
    lease = KEY.sign("8000", NOW + 1_000)
    assert ROUTE.verify_route(lease, 8000, 40000, NOW) is Verdict.FORGED
    route = ROUTE.sign_route(8000, 40000, NOW + 1_000)
    assert KEY.verify(route, "8000", NOW) is Verdict.FORGED


def test_the_node_tables_name_the_agent_and_guard_every_veth():
    script = routing.host_script(1234, "10.213.0.0/16")
    assert "table ip galaxy_route_1234" in script and "table ip galaxy_guard_1234" in script
    # Nothing from an instance but answers; nothing to one but what the map
    # sent there: by address, never by interface name.
    assert "ip saddr 10.213.0.0/16 drop" in script
    assert "ip daddr 10.213.0.0/16 ct status dnat accept; ip daddr 10.213.0.0/16 drop" in script
    assert "ifname" not in script
    assert "dnat to 127.0.0.1" in routing.inner_script(8000).replace("dnat ip to", "dnat to")


def test_the_gateways_route_key_file_signs_no_lease(tmp_path):
    """route.key is derived from lease.key (the agents need no second
    secret) and is not it: a lease signed with it opens nothing."""
    leasetoken.ensure(tmp_path)
    path = leasetoken.ensure_route(tmp_path)
    assert oct(path.stat().st_mode & 0o777) == "0o600"
    lease = leasetoken.load(tmp_path)
    route = leasetoken.load_route(tmp_path)
    assert lease is not None and route is not None
    token = route.sign_route(8000, 40000, NOW + 1_000)
    assert lease.route_key().verify_route(token, 8000, 40000, NOW) is Verdict.OK
    forged = LeaseKey(path.read_bytes()).sign("i-1", NOW + 1_000)
    assert lease.verify(forged, "i-1", NOW) is Verdict.FORGED
    assert leasetoken.load_route(tmp_path / "none") is None
