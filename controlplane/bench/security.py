"""What security costs, measured in one run (`python -m controlplane.bench.security`).

Four control planes run side by side on this machine, one node each, the
echo example deployed on each:

- ``plain``: plaintext gRPC, no cgroups (Galaxy before issue 13);
- ``cgroups``: plaintext, each instance in its own cgroup with its limits;
- ``mtls``: mutual TLS everywhere and cgroups, no bearer tokens;
- ``mtls+tokens``: the same with bearer tokens checked on every public
  call (`galaxy up`'s default).

Warm requests (SDK: Dispatch, HTTP to the instance, Release) alternate
between them in rounds, so the machine's drift hits all alike; cold starts
(a new function's first request) likewise. Beside them, in the same rounds,
the echo yardstick over mutual TLS (``controlplane.bench.echo --tls-dir``:
one bare gRPC round trip with the same certificates), so the warm figures
can be read against what one TLS round trip costs on this machine now.
The report gives latencies and the ratios to ``plain`` (docs/security.md,
"What it costs").
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

from controlplane.bench.echo import METHOD as ECHO_METHOD
from controlplane.bench.echo import EchoProcess
from controlplane.launch.up import Supervisor, UpConfig
from controlplane.runtime import rpc
from controlplane.runtime import spec as specs
from controlplane.sdk.client import GalaxyClient

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "echo.yaml"
MODES = {
    "plain": UpConfig.for_tool(nodes=1, extra={"nodeagent": ["--cgroups", "off"]}),
    "cgroups": UpConfig.for_tool(nodes=1, extra={"nodeagent": ["--cgroups", "on"]}),
    "mtls": UpConfig.for_tool(
        nodes=1, tls=True, auth="none", extra={"nodeagent": ["--cgroups", "on"]}
    ),
    "mtls+tokens": UpConfig.for_tool(nodes=1, tls=True, extra={"nodeagent": ["--cgroups", "on"]}),
}


def _q(v: list[float], p: float) -> float:
    return statistics.quantiles(v, n=1000)[int(p * 1000) - 1] * 1000


async def _warm(c: GalaxyClient, n: int) -> list[float]:
    out = []
    for _ in range(n):
        t0 = time.perf_counter()
        r = await c.invoke("echo", b"x")
        if r.status != 200:
            raise RuntimeError(f"echo answered HTTP {r.status}")
        out.append(time.perf_counter() - t0)
    return out


async def _cold(c: GalaxyClient, name: str) -> float:
    spec = specs.load_file(EXAMPLE)
    spec.name = name
    await c.deploy(spec)
    t0 = time.perf_counter()
    await c.invoke(name, b"x")
    took = time.perf_counter() - t0
    await c.delete_function(name)
    return took


async def _echo(call: Any, n: int) -> list[float]:
    out = []
    for _ in range(n):
        t0 = time.perf_counter()
        await call(b"x", timeout=5)
        out.append(time.perf_counter() - t0)
    return out


async def measure(warm: int, rounds: int, colds: int) -> dict[str, object]:
    """Latencies (ms) per mode and ratios to plain."""
    sups: dict[str, Supervisor] = {}
    clients: dict[str, GalaxyClient] = {}
    base = Path(tempfile.mkdtemp(prefix="galaxy-bench-security-"))
    echo = EchoProcess()
    echo_lat: list[float] = []
    try:
        for mode, cfg in MODES.items():
            sups[mode] = sup = Supervisor(cfg.replace(run_dir=base / mode))
            ep = await sup.start()
            await sup.wait_nodes_registered()
            clients[mode] = c = GalaxyClient(
                ep["controller"], tls=sup.client_tls(), token=sup.client_token()
            )
            await c.deploy(specs.load_file(EXAMPLE))
            await _warm(c, 50)  # the instance, the connections
        tls_sup = sups["mtls+tokens"]
        assert tls_sup.tls_dir is not None
        address = await echo.start(tls_dir=str(tls_sup.tls_dir))
        channel = rpc.insecure_channel(address, tls_sup.client_tls())
        call = channel.unary_unary(ECHO_METHOD)
        await _echo(call, 50)
        lat: dict[str, list[float]] = {m: [] for m in MODES}
        cold: dict[str, list[float]] = {m: [] for m in MODES}
        for _ in range(rounds):
            for m, c in clients.items():
                lat[m] += await _warm(c, warm)
            echo_lat += await _echo(call, warm)
        await channel.close()
        for i in range(colds):
            for m, c in clients.items():
                cold[m].append(await _cold(c, f"cold-{i}"))
    finally:
        await echo.stop()
        for c in clients.values():
            await c.close()
        for sup in sups.values():
            await sup.stop()
    modes = {
        m: {
            "warm_p50_ms": round(_q(lat[m], 0.5), 3),
            "warm_p99_ms": round(_q(lat[m], 0.99), 3),
            "cold_median_ms": round(statistics.median(cold[m]) * 1000, 1),
        }
        for m in MODES
    }
    plain = modes["plain"]
    echo_p50 = _q(echo_lat, 0.5)
    return {
        "warm_requests_per_mode": warm * rounds,
        "cold_starts_per_mode": colds,
        "modes": modes,
        "echo_tls_yardstick": {
            "p50_ms": round(echo_p50, 3),
            "p99_ms": round(_q(echo_lat, 0.99), 3),
        },
        "warm_p50_in_tls_echo_round_trips": {
            m: round(modes[m]["warm_p50_ms"] / echo_p50, 2) for m in MODES
        },
        "ratios_to_plain": {
            m: {k: round(v / plain[k], 3) for k, v in modes[m].items()} for m in MODES
        },
    }


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--warm", type=int, default=300, help="warm requests per mode and round")
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--colds", type=int, default=8, help="cold starts per mode")
    a = p.parse_args()
    print(json.dumps(asyncio.run(measure(a.warm, a.rounds, a.colds)), indent=2))


if __name__ == "__main__":
    main()
