"""Where `galaxy up` says what runs: the run directory, endpoints.json (read
by every command that looks for a running control plane), and the summary
it prints."""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path
from typing import Any

from controlplane.runtime import tlsfiles

ENDPOINTS_FILE = "endpoints.json"


def default_run_dir() -> Path:
    """Where `galaxy up` writes endpoints.json and logs ($GALAXY_RUN_DIR or ~/.galaxy/run)."""
    env = os.environ.get("GALAXY_RUN_DIR")
    return Path(env) if env else Path.home() / ".galaxy" / "run"


def read_endpoints(run_dir: Path) -> dict[str, Any] | None:
    """The endpoints of a running `galaxy up` in run_dir, if any.

    A file left by a supervisor that died (SIGKILL) is ignored: its children
    exited with it (lifeline), so nothing answers at those addresses.
    """
    try:
        data: dict[str, Any] = json.loads((run_dir / ENDPOINTS_FILE).read_text())
    except (OSError, ValueError):
        return None
    pid = data.get("supervisor_pid")
    if isinstance(pid, int):
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return None
        except PermissionError:
            pass  # alive, owned by someone else
    return data


def print_endpoints(endpoints: dict[str, Any], nodes_alive: int, out: Any = sys.stdout) -> None:
    """The human summary `galaxy up` prints."""
    print(f"Galaxy control plane is up (controller {endpoints['controller']})", file=out)
    for c in endpoints["components"]:
        extra = f" nodes={len(c['nodes'])}" if "nodes" in c else ""
        proto = "http" if c.get("kind") == "gateway" else "grpc"
        print(
            f"  {c['name']:<14} {proto} {c['address']:<21} metrics http://{c['metrics']}/metrics"
            f"  pid {c['pid']}{extra}",
            file=out,
        )
    if endpoints.get("supervisor_metrics"):
        sup = endpoints["supervisor_metrics"]
        print(f"  {'supervisor':<14} restarts at http://{sup}/metrics", file=out)
    if endpoints.get("prometheus_targets"):
        targets = endpoints["prometheus_targets"]
        print(f"  {'prometheus':<14} file_sd targets in {targets}", file=out)
    if endpoints.get("prometheus"):
        print(f"  {'prometheus':<14} http://{endpoints['prometheus']}", file=out)
    print(f"  nodes alive: {nodes_alive}", file=out)
    if endpoints.get("tls_dir"):
        print(
            f"  mutual TLS: certificates in {endpoints['tls_dir']} (the CLI here uses "
            "client/admin; elsewhere set GALAXY_TLS_DIR; see docs/security.md)",
            file=out,
        )
    else:
        print(f"  WARNING: {tlsfiles.INSECURE_WARNING}", file=out)
    if endpoints.get("token_file"):
        print(
            f"  tokens: the admin token is in {endpoints['token_file']} (the CLI here uses "
            "it; elsewhere set GALAXY_TOKEN; `galaxy tokens create` makes more)",
            file=out,
        )
    if endpoints.get("gateway"):
        print(f"Gateway: http://{endpoints['gateway']}", file=out)
    if endpoints.get("runtimes"):
        names = ", ".join(endpoints["runtimes"])
        print(f"Serving runtimes: {names} (`galaxy runtimes list`)", file=out)
    print("Try: galaxy deploy -f examples/echo.yaml && galaxy invoke echo --data hello", file=out)
    if endpoints.get("gateway"):
        # examples/echo.yaml is public: no token needed to invoke it.
        print(f"     curl http://{endpoints['gateway']}/functions/echo -d hi", file=out)
    print("Press Ctrl-C to stop.", file=out, flush=True)
