"""Typed configuration: flags derived from the models, one rule everywhere."""

from __future__ import annotations

import argparse
import subprocess
import sys

import pytest

from controlplane.runtime import config
from controlplane.runtime.config import Config, ConfigError, RpcConfig, setting
from functions.clustermgr.config import ClusterMgrConfig
from functions.dispatch.config import DispatchConfig
from functions.schedule import scoring
from functions.schedule.config import ScheduleConfig
from functions.schedule.policy import PlacementPolicy
from simulator.galaxy.model import GalaxyConfig


class Sample(Config):
    count: int = setting(3, "how many", ge=1)
    cache: bool = setting(True, "the cache")
    verbose: bool = setting(False, "talk more")
    mode: str = setting("a", "which mode", choices=("a", "b"))
    limit: float | None = setting(None, "an optional limit", gt=0)
    item: list[str] = setting([], "repeatable", flag="--item")


def parser_for(cls: type[Config]) -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="t", exit_on_error=False)
    config.add_arguments(p, cls)
    return p


def test_flags_are_derived_from_the_fields() -> None:
    p = parser_for(Sample)
    cfg = config.from_args(Sample, p.parse_args([]))
    assert cfg == Sample()
    cfg = config.from_args(
        Sample,
        p.parse_args(
            [
                *("--count", "7", "--no-cache", "--verbose", "--mode", "b"),
                *("--limit", "2.5", "--item", "x", "--item", "y"),
            ]
        ),
    )
    assert (cfg.count, cfg.cache, cfg.verbose, cfg.mode, cfg.limit, cfg.item) == (
        7,
        False,
        True,
        "b",
        2.5,
        ["x", "y"],
    )


@pytest.mark.parametrize(
    "argv, flag",
    [(["--count", "0"], "--count"), (["--mode", "c"], "--mode"), (["--limit", "-1"], "--limit")],
)
def test_a_bad_flag_fails_at_parse_time_naming_it(argv: list[str], flag: str) -> None:
    with pytest.raises(argparse.ArgumentError) as e:
        parser_for(Sample).parse_args(argv)
    assert flag in str(e.value)


def test_the_same_rule_holds_from_code() -> None:
    with pytest.raises(ConfigError, match=r"^--count: .*greater than or equal to 1"):
        config.build(Sample, count=0)
    with pytest.raises(ConfigError, match="--probe-d"):
        config.build(ScheduleConfig, probe_d=0)
    # Configs are immutable; replace() validates like a new one.
    cfg = ScheduleConfig()
    with pytest.raises(Exception):  # noqa: B017 - pydantic's frozen error
        cfg.probe_d = 3  # type: ignore[misc]
    assert cfg.replace(probe_d=4).probe_d == 4


def test_an_error_echoes_at_most_a_short_prefix() -> None:
    with pytest.raises(ConfigError) as e:
        config.build(DispatchConfig, state="x" * 100_000)
    assert "--state" in str(e.value) and len(str(e.value)) < 200


def test_a_rule_across_fields_names_them() -> None:
    with pytest.raises(ConfigError, match="--dead-after-ms must be at least --heartbeat-ms"):
        config.build(ClusterMgrConfig, heartbeat_ms=1000, dead_after_ms=10)
    assert ClusterMgrConfig(heartbeat_ms=500).dead_after_s == 1.5


def test_defaults_live_in_one_place() -> None:
    # The policy, the simulator's Galaxy model and the flags agree because
    # they read the same config, not because the numbers were copied.
    sched, disp = ScheduleConfig(), DispatchConfig()
    pol = PlacementPolicy()
    sim = GalaxyConfig()
    assert (pol.d, sim.d) == (sched.probe_d, sched.probe_d)
    assert sim.probe_ttl_s == sched.probe_ttl_s
    assert sim.max_spill == disp.max_spill
    assert RpcConfig().connection_cache is True


def test_scoring_terms_are_looked_up_by_name() -> None:
    assert scoring.lookup("least_loaded") is scoring.SCORES["least_loaded"]
    with pytest.raises(ConfigError, match="unknown scoring term"):
        config.build(ScheduleConfig, scoring="nearest_cache")
    with pytest.raises(ValueError, match="already registered"):
        scoring.register("least_loaded")(lambda *a: 0.0)


@pytest.mark.slow
def test_the_cli_reports_a_config_error_without_a_traceback() -> None:
    out = subprocess.run(
        [
            *(sys.executable, "-m", "controlplane.tools.cli", "serve", "clustermgr"),
            *("--controller", "127.0.0.1:1", "--heartbeat-ms", "1000", "--dead-after-ms", "5"),
            "--insecure",
        ],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert out.returncode == 2
    assert "--dead-after-ms must be at least --heartbeat-ms" in out.stderr
    assert "Traceback" not in out.stderr


def test_to_flags_gives_back_the_same_config() -> None:
    from controlplane.nodeagent.config import NodeAgentConfig

    s = Sample(count=5, cache=False, verbose=True, mode="b", limit=2.5, item=["x", "y"])
    flags = config.to_flags(s)
    assert flags == ["--count", "5", "--no-cache", "--verbose", "--mode", "b", "--limit", "2.5",
                     "--item", "x", "--item", "y"]  # fmt: skip
    assert config.from_args(Sample, parser_for(Sample).parse_args(flags)) == s
    assert config.to_flags(Sample()) == []  # defaults are left out
    agent = NodeAgentConfig(nodes=3, node_index_start=6, sandbox="emulated", log_dir="/l")
    back = config.from_args(NodeAgentConfig, parser_for(NodeAgentConfig).parse_args(
        config.to_flags(agent)))  # fmt: skip
    assert back == agent
