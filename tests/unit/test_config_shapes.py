"""Typed configuration beyond the components: credentials in ``RpcConfig``,
`galaxy up`, bench files and the simulator's commands, and the config
helpers they rely on (environment defaults, code-only and required fields,
settings shared between two configs)."""

from __future__ import annotations

import argparse
from pathlib import Path

import pytest

from controlplane.bench import plan as pl
from controlplane.controller.config import ControllerConfig
from controlplane.launch.upconfig import TOOL_DEFAULTS, UpConfig
from controlplane.nodeagent.config import NodeAgentConfig
from controlplane.runtime import config, rpc, tls
from controlplane.runtime.config import Config, RpcConfig, same_as, setting
from controlplane.tools.cli import build_parser
from simulator.cliconfig import SimulateConfig
from simulator.system import SimConfig


class Sample(Config):
    where: str | None = setting(None, "a place", env="SAMPLE_WHERE")
    secret: str | None = setting(None, "never a flag", cli=False)
    out: str = setting(..., "required")
    count: int = same_as(NodeAgentConfig, "cpu_millis", flag="--count", group=None)


def _parse(cls: type[Config], *argv: str) -> argparse.Namespace:
    p = argparse.ArgumentParser(exit_on_error=False)
    config.add_arguments(p, cls)
    return p.parse_args(list(argv))


def test_env_defaults_code_only_required_and_shared_fields(monkeypatch) -> None:
    monkeypatch.setenv("SAMPLE_WHERE", "from-env")
    args = _parse(Sample, "--out", "o")
    cfg = config.from_args(Sample, args)
    assert (cfg.where, cfg.out, cfg.secret) == ("from-env", "o", None)
    assert Sample(out="o").where is None  # code never reads the environment
    assert "secret" not in config.flag_fields(Sample) and not hasattr(args, "secret")
    with pytest.raises(SystemExit):
        _parse(Sample)  # --out is required
    # The shared field keeps the node agent's default and rule.
    assert cfg.count == NodeAgentConfig().cpu_millis
    with pytest.raises(config.ConfigError, match="--count"):
        config.build(Sample, out="o", count=-1)
    assert config.to_flags(Sample(out="o", secret="s")) == ["--out", "o"]


@pytest.mark.slow
def test_credentials_and_tokens_are_rpc_config(tmp_path: Path) -> None:
    assert RpcConfig().tokens_enabled() is False
    tls.ensure(tmp_path, hosts=["127.0.0.1"])
    files = tls.TlsConfig.for_identity(tmp_path, "dispatch")
    with_tls = RpcConfig(tls=files, token="glx_secret")
    assert with_tls.tokens_enabled() is True  # auto: tokens with TLS
    assert "glx_secret" not in repr(with_tls)
    with pytest.raises(ValueError, match="--auth tokens needs TLS"):
        RpcConfig(auth="tokens").tokens_enabled()
    pool = rpc.ChannelPool(with_tls)
    assert (pool.tls, pool.timeout) == (files, RpcConfig().deadline_s)
    args = build_parser().parse_args(
        ["serve", "dispatch", "--tls-dir", str(tmp_path), "--auth", "none", "--token-cache-s", "3"]
    )
    flags = config.from_args(RpcConfig, args)
    assert (flags.tls_dir, flags.auth, flags.token_cache_s, flags.tls) == (
        str(tmp_path),
        "none",
        3.0,
        None,
    )


def test_galaxy_up_flags_come_from_up_config() -> None:
    args = build_parser().parse_args(
        ["up", "--insecure", "--t-sf", "200", "--standby", "dispatch=1", "--nodes", "3"]
    )
    cfg = config.from_args(UpConfig, args, run_dir=Path("/tmp/x"))
    assert (cfg.tls, cfg.nodes, cfg.gateway_port, cfg.auth) == (False, 3, 8080, "tokens")
    settings = cfg.controller_settings()
    assert settings["t_sf"] == 200.0 and settings["standby_instances"] == ["dispatch=1"]
    assert ControllerConfig(**settings).t_sf == 200.0
    assert UpConfig().node_cpu_millis == NodeAgentConfig().cpu_millis
    tool = UpConfig.for_tool(nodes=1)
    assert (tool.tls, tool.gateway_port) == (TOOL_DEFAULTS["tls"], TOOL_DEFAULTS["gateway_port"])
    with pytest.raises(SystemExit):
        build_parser().parse_args(["up", "--standby", "gateway=1"])


def test_bench_files_are_checked_by_their_config_classes() -> None:
    doc = {
        "control_plane": {"nodes": 8, "heartbeat_ms": -5},
        "scenarios": [{"name": "s", "total_requests": 10}],
    }
    with pytest.raises(pl.BenchFileError, match=r"control_plane\.heartbeat_ms"):
        pl.parse(doc, Path("x.yaml"))
    doc["control_plane"] = {"nodes": 8}
    with pytest.raises(pl.BenchFileError, match=r"load\.bogus"):
        pl.parse({**doc, "load": {"bogus": 1}}, Path("x.yaml"))
    bad = {**doc, "scenarios": [{"name": "s", "total_requests": 10, "concurrency": 0}]}
    bf = pl.parse(bad, Path("x.yaml"))
    with pytest.raises(pl.BenchFileError, match=r"scenario s\.concurrency"):
        pl.load_settings(bf, next(bf.experiment.plans()))
    assert pl.CP_DEFAULTS["node_cpu_millis"] == UpConfig().node_cpu_millis


def test_simulator_flags_come_from_its_config() -> None:
    args = build_parser().parse_args(["simulate", "--out", "/tmp/o", "--until", "5"])
    cfg = config.from_args(SimulateConfig, args)
    assert (cfg.until, cfg.nodes, cfg.no_progress) == (5.0, SimConfig().nodes, False)
    with pytest.raises(SystemExit):
        build_parser().parse_args(["simulate", "--nodes", "0", "--out", "/tmp/o"])
