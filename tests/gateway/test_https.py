"""The gateway serves HTTPS with a configured certificate (curl verifies it
against the CA), and refuses a half or broken configuration clearly."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from controlplane.gateway import main as gateway
from controlplane.gateway.config import GatewayConfig
from controlplane.runtime import tls
from tests.gateway.conftest import Gateway
from tests.gateway.test_gateway import curl


async def test_https_with_a_configured_certificate(gw: Gateway, tmp_path: Path) -> None:
    certs = tmp_path / "certs"
    tls.ensure(certs, ["gateway"], ["127.0.0.1"])
    cfg = GatewayConfig(
        https_cert=str(tls.cert_path(certs, "gateway")),
        https_key=str(tls.key_path(certs, "gateway")),
    )
    runner, proxy, address = await gateway.start(cfg, gw.cluster.controller, "127.0.0.1", 0)
    try:
        ok = await curl("--cacert", str(certs / "ca.pem"), f"https://{address}/functions/echo",
                        "-d", "over tls")  # fmt: skip
        assert ok.returncode == 0, ok.stderr
        assert json.loads(ok.stdout)["echo"] == "over tls"
        # Without the CA, curl cannot verify the gateway: no answer.
        unverified = await curl(f"https://{address}/functions/echo", "-d", "x")
        assert unverified.returncode != 0
        plain = await curl(f"http://{address}/functions/echo", "-d", "x")
        assert "over tls" not in plain.stdout
    finally:
        await gateway.stop(runner, proxy)


@pytest.mark.parametrize("which", ["cert_only", "missing_file"])
def test_bad_https_configuration_names_the_flags(tmp_path: Path, which: str) -> None:
    cfg = (
        GatewayConfig(https_cert=str(tmp_path / "c.pem"))
        if which == "cert_only"
        else GatewayConfig(https_cert=str(tmp_path / "c.pem"), https_key=str(tmp_path / "k.pem"))
    )
    with pytest.raises(ValueError) as e:
        gateway.https_context(cfg)
    assert "--https-cert" in str(e.value)
