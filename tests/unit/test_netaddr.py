"""Addresses a process hands out: host:port parsing and what to advertise."""

from __future__ import annotations

import ipaddress

import pytest

from controlplane.runtime import netaddr


@pytest.mark.parametrize(
    ("address", "expected"),
    [
        ("10.0.0.1:80", ("10.0.0.1", 80)),
        ("node-1.example:7000", ("node-1.example", 7000)),
        ("[fd00::1]:9090", ("fd00::1", 9090)),
        (":0", ("", 0)),
    ],
)
def test_split_host_port(address: str, expected: tuple[str, int]) -> None:
    assert netaddr.split_host_port(address) == expected


@pytest.mark.parametrize("bad", ["10.0.0.1", "host:", "host:http", "h:70000", "x" * 500])
def test_split_host_port_refuses_with_a_short_message(bad: str) -> None:
    with pytest.raises(ValueError) as e:
        netaddr.split_host_port(bad)
    assert len(str(e.value)) < 200


def test_join_brackets_ipv6_only() -> None:
    assert netaddr.join_host_port("fd00::1", 80) == "[fd00::1]:80"
    assert netaddr.join_host_port("10.0.0.1", 80) == "10.0.0.1:80"
    addr = netaddr.join_host_port("fd00::1", 80)
    assert netaddr.split_host_port(addr) == ("fd00::1", 80)


def test_advertised_host_prefers_explicit_then_specific_listen_host() -> None:
    assert netaddr.advertised_host("0.0.0.0", "10.1.2.3") == "10.1.2.3"
    assert netaddr.advertised_host("10.1.2.3") == "10.1.2.3"
    assert netaddr.advertised_host("127.0.0.1") == "127.0.0.1"  # asked for loopback


def test_every_interface_advertises_the_outward_address() -> None:
    # This machine has a default route (package registries are reachable),
    # so listening everywhere must not advertise loopback.
    host = netaddr.advertised_host("0.0.0.0")
    assert host == netaddr.outward_host()
    assert not ipaddress.ip_address(host).is_unspecified
    assert not ipaddress.ip_address(host).is_loopback
