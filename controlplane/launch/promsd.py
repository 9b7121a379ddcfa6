"""Prometheus service discovery for `galaxy up`: a file_sd file.

`galaxy up` writes ``RUN_DIR/prometheus/targets.json`` (Prometheus's
``file_sd_configs`` format: a list of target groups) with every process that
serves ``/metrics`` — the supervisor and each child — and rewrites it whenever
a child restarts, so a restarted child on a new port is scraped again at the
next file refresh. Each group's labels are ``component`` (the child's name,
e.g. ``dispatch-0``), ``kind`` (``dispatch``, ``nodeagent``, ``supervisor``,
...) and ``instance`` (the component name, stable across restarts, instead of
Prometheus's default ``host:port``, which changes with the port).

The file is replaced atomically (write, then rename), as Prometheus's
documentation asks of file_sd writers, so a scrape never reads half of it.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import tempfile
from pathlib import Path
from typing import Any

from controlplane.runtime import netaddr, procs

TARGETS_FILE = Path("prometheus") / "targets.json"


def _kind(component: dict[str, Any]) -> str:
    kind = component.get("kind")
    if isinstance(kind, str) and kind:
        return kind
    name = str(component.get("name", ""))
    return "nodeagent" if name.startswith("agent-") else name.rsplit("-", 1)[0]


def target_groups(endpoints: dict[str, Any]) -> list[dict[str, Any]]:
    """The file_sd target groups of an endpoints.json document."""
    groups: list[dict[str, Any]] = []
    sup = endpoints.get("supervisor_metrics")
    if sup:
        groups.append(
            {
                "targets": [sup],
                "labels": {"component": "supervisor", "kind": "supervisor",
                           "instance": "supervisor"},
            }
        )  # fmt: skip
    for c in endpoints.get("components", []):
        if not c.get("metrics"):
            continue
        name = str(c["name"])
        groups.append(
            {
                "targets": [str(c["metrics"])],
                "labels": {"component": name, "kind": _kind(c), "instance": name},
            }
        )
    return groups


def write_targets(run_dir: Path, endpoints: dict[str, Any]) -> Path:
    """Write (atomically replace) RUN_DIR/prometheus/targets.json."""
    path = run_dir / TARGETS_FILE
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=".targets.")
    try:
        with os.fdopen(fd, "w") as f:
            json.dump(target_groups(endpoints), f, indent=2)
        os.chmod(tmp, 0o644)  # Prometheus may run as its own user
        os.replace(tmp, path)
    except BaseException:
        os.unlink(tmp)
        raise
    return path


def shipped_rules() -> Path | None:
    """deploy/monitoring/galaxy-rules.yaml when this is a checkout that has it."""
    path = Path(__file__).resolve().parents[2] / "deploy" / "monitoring" / "galaxy-rules.yaml"
    return path if path.is_file() else None


def scrape_config(run_dir: Path, interval_s: float = 5.0, rules: Path | None = None) -> str:
    """A minimal prometheus.yml that scrapes `galaxy up` through the file
    (and evaluates the rule file given)."""
    rule_files = f"rule_files: ['{rules}']\n" if rules is not None else ""
    return (
        "global:\n"
        f"  scrape_interval: {interval_s:g}s\n"
        f"  evaluation_interval: {interval_s:g}s\n"
        f"{rule_files}"
        "scrape_configs:\n"
        "  - job_name: galaxy\n"
        "    file_sd_configs:\n"
        f"      - files: ['{run_dir / TARGETS_FILE}']\n"
        f"        refresh_interval: {interval_s:g}s\n"
    )


def prometheus_binary() -> str | None:
    """The `prometheus` binary on PATH (Debian package prometheus), or None."""
    return shutil.which("prometheus")


def _prepare(run_dir: Path, log_dir: Path) -> Path:
    """Write RUN_DIR/prometheus/prometheus.yml; make the log dir."""
    d = run_dir / "prometheus"
    d.mkdir(parents=True, exist_ok=True)
    (d / "prometheus.yml").write_text(scrape_config(run_dir, rules=shipped_rules()))
    log_dir.mkdir(parents=True, exist_ok=True)
    return d


async def start_prometheus(run_dir: Path, host: str, port: int, log_dir: Path) -> procs.Spawned:
    """Start a local Prometheus that scrapes through the targets file (its
    config and data under RUN_DIR/prometheus); RuntimeError when the binary
    is missing. The caller terminates it."""
    binary = prometheus_binary()
    if binary is None:
        raise RuntimeError(
            "--prometheus: no `prometheus` binary on PATH (apt-get install prometheus)"
        )
    d = _prepare(run_dir, log_dir)
    with open(log_dir / "prometheus.log", "ab") as log:  # noqa: ASYNC230 (local file)
        return await procs.spawn(
            binary,
            f"--config.file={d / 'prometheus.yml'}",
            f"--storage.tsdb.path={d / 'data'}",
            f"--web.listen-address={netaddr.join_host_port(host, port)}",
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=log,
        )
