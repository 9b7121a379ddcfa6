"""The egress deny list's parsing, its nftables script and its flag."""

from __future__ import annotations

import argparse

import pytest

from controlplane.nodeagent.sandbox import egressdeny


def test_a_list_is_normalised_and_deduplicated() -> None:
    assert egressdeny.parse(" 10.0.0.0/8, 169.254.169.254 ,,10.0.0.0/8,FD00:EC2::254/128") == (
        "10.0.0.0/8",
        "169.254.169.254/32",
        "fd00:ec2::254/128",
    )
    assert egressdeny.parse("") == ()
    assert egressdeny.parse(egressdeny.DEFAULT) == ("169.254.0.0/16", "fd00:ec2::254/128")


@pytest.mark.parametrize(
    ("text", "said"),
    [
        ("metadata", "'metadata' is not a network (CIDR, e.g. 169.254.0.0/16)"),
        ("10.0.0.1/8", "'10.0.0.1/8' has host bits set (the network is 10.0.0.0/8)"),
        ("10.0.0.0/33", "'10.0.0.0/33' is not a network"),
    ],
)
def test_a_bad_entry_is_named(text: str, said: str) -> None:
    with pytest.raises(ValueError) as e:
        egressdeny.parse(f"169.254.0.0/16,{text}")
    assert said in str(e.value)


def test_a_long_bad_entry_is_not_echoed_whole() -> None:
    with pytest.raises(ValueError) as e:
        egressdeny.parse("x" * 5000)
    assert len(str(e.value)) < 200 and "..." in str(e.value)


def test_a_list_is_bounded() -> None:
    many = ",".join(f"10.{i // 250}.{i % 250}.0/24" for i in range(egressdeny.MAX_ENTRIES + 1))
    with pytest.raises(ValueError, match=f"at most {egressdeny.MAX_ENTRIES} networks"):
        egressdeny.parse(many)


def test_the_script_rejects_each_family_on_the_output_hook() -> None:
    script = egressdeny.ruleset(("169.254.0.0/16", "10.1.0.0/16", "fd00:ec2::254/128"))
    assert "type filter hook output priority filter; policy accept;" in script
    assert (
        "ip daddr { 169.254.0.0/16, 10.1.0.0/16 } reject with icmpx type admin-prohibited"
    ) in script
    assert "ip6 daddr { fd00:ec2::254/128 } reject with icmpx type admin-prohibited" in script
    only4 = egressdeny.ruleset(("169.254.0.0/16",))
    assert "ip6" not in only4 and f"table inet {egressdeny.TABLE}" in only4


def test_a_node_without_ipv6_gets_an_ipv4_table_without_the_ipv6_entries() -> None:
    script = egressdeny.ruleset(("169.254.0.0/16", "fd00:ec2::254/128"), ipv6=False)
    assert f"table ip {egressdeny.TABLE}" in script and "inet" not in script
    assert "ip daddr { 169.254.0.0/16 } reject with icmp type admin-prohibited" in script
    assert "ip6" not in script


def _parse(*argv: str) -> argparse.Namespace:
    from controlplane.nodeagent.main import add_arguments

    p = argparse.ArgumentParser()
    add_arguments(p)
    return p.parse_args(list(argv))


def test_the_flag_defaults_to_the_metadata_services_and_names_a_bad_value(capsys) -> None:
    from controlplane.nodeagent.config import NodeAgentConfig
    from controlplane.runtime import config

    cfg = config.from_args(NodeAgentConfig, _parse())
    assert cfg.instance_egress_deny == egressdeny.DEFAULT
    cfg = config.from_args(NodeAgentConfig, _parse("--instance-egress-deny", ""))
    assert egressdeny.parse(cfg.instance_egress_deny) == ()
    with pytest.raises(SystemExit):
        _parse("--instance-egress-deny", "10.0.0.1/8")
    err = capsys.readouterr().err
    assert "--instance-egress-deny" in err and "host bits set" in err
