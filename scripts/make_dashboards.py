"""Generate the Grafana dashboards in deploy/monitoring/dashboards/ (grafanalib)
and the Prometheus Operator's PrometheusRule from deploy/monitoring/galaxy-rules.yaml.

    python scripts/make_dashboards.py          # write the files
    python scripts/make_dashboards.py --check  # exit 1 if they are stale

The panels' PromQL is defined here once; tests/monitoring/ checks that the
committed JSON matches this script and evaluates every panel's expression
against a real Prometheus scraping `galaxy up` (each must return data).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import yaml
from grafanalib._gen import DashboardEncoder
from grafanalib.core import (
    Dashboard,
    GridPos,
    RowPanel,
    Target,
    Template,
    Templating,
    TimeSeries,
)

MONITORING = Path(__file__).resolve().parents[1] / "deploy" / "monitoring"
OUT = MONITORING / "dashboards"
RULE_CR = MONITORING / "kubernetes" / "prometheusrule.yaml"
DATASOURCE = "${datasource}"

#: (row title, [(panel title, unit, [(PromQL, legend)])]) for the control plane.
CONTROL_PLANE = [
    ("Traffic", [
        ("Gateway requests/s by route and code", "reqps",
         [("galaxy:gateway_requests:rate5m", "{{route}} {{code}}")]),
        ("Gateway 5xx ratio", "percentunit",
         [("galaxy:gateway_error_ratio:rate5m", "5xx ratio")]),
        ("Gateway p99 by route", "s",
         [("galaxy:gateway_request_seconds:p99_5m", "{{route}}")]),
        ("gRPC calls/s by kind", "reqps",
         [("sum by (kind) (galaxy:rpc_requests:rate5m)", "{{kind}}")]),
        ("Instance doors: refusals/s by reason", "reqps",
         [("galaxy:entry_refused:rate5m", "{{reason}}")]),
        ("Instance doors: open connections by node agent", "short",
         [("sum by (instance) (galaxy_entry_open_connections)", "{{instance}}")]),
        ("Gateway connections to instances/s: routed or relayed", "ops",
         [("sum by (outcome) (rate(galaxy_gateway_entry_routes_total[5m]))", "{{outcome}}")]),
    ]),
    ("Scale-up path", [
        ("Cold starts/s", "ops", [("galaxy:cold_starts:rate5m", "cold starts")]),
        ("Cold-start p99", "s", [("galaxy:cold_start_latency_seconds:p99_5m", "p99")]),
        ("Scheduling p99", "s", [("galaxy:scheduling_latency_seconds:p99_5m", "p99")]),
        ("gRPC server-error ratio by kind", "percentunit",
         [("galaxy:rpc_error_ratio:rate5m", "{{kind}}")]),
    ]),
    ("Cluster", [
        ("Nodes", "short",
         [("galaxy:nodes:alive", "alive"), ("galaxy:nodes:dead", "dead")]),
        ("Control instances by kind", "short",
         [("sum by (kind) (galaxy_control_instances)", "{{kind}}")]),
        ("Bounded queues: fraction of their bound", "percentunit",
         [("galaxy:queue_saturation:ratio", "{{queue}}")]),
        ("Restarts of supervised processes (15 min)", "short",
         [("galaxy:supervisor_restarts:increase15m", "restarts")]),
        ("Process CPU (cores) by component", "short",
         [("rate(process_cpu_seconds_total{job=~\"galaxy.*\"}[1m])", "{{instance}}")]),
        ("Build", "short", [("galaxy_build_info", "{{instance}} {{version}} {{commit}}")]),
    ]),
]  # fmt: skip

#: The same for one function (template variable $function).
FUNCTION = [
    ("Requests", [
        ("Requests/s by code", "reqps",
         [("sum by (code) (rate(galaxy_function_requests_total{function=~\"$function\"}[5m]))",
           "{{code}}")]),
        ("Latency p50 / p99", "s",
         [("histogram_quantile(0.5, sum by (le) (rate("
           "galaxy_function_request_seconds_bucket{function=~\"$function\"}[5m])))", "p50"),
          ("histogram_quantile(0.99, sum by (le) (rate("
           "galaxy_function_request_seconds_bucket{function=~\"$function\"}[5m])))", "p99")]),
    ]),
    ("Instances", [
        ("Instances by revision and state", "short",
         [("sum by (revision, state) (galaxy_function_instances{function=~\"$function\"})",
           "{{revision}} {{state}}")]),
        ("Cold starts/s by revision", "ops",
         [("sum by (revision) (rate(galaxy_cold_starts_total{function=~\"$function\"}[5m]))",
           "{{revision}}")]),
    ]),
]  # fmt: skip


def _panels(rows: list) -> list:  # type: ignore[type-arg]
    """Rows of half-width time series, laid out on Grafana's 24-column grid."""
    out: list = []  # type: ignore[type-arg]
    y = 0
    for title, panels in rows:
        out.append(RowPanel(title=title, gridPos=GridPos(h=1, w=24, x=0, y=y)))
        y += 1
        for i, (ptitle, unit, targets) in enumerate(panels):
            out.append(
                TimeSeries(
                    title=ptitle,
                    dataSource=DATASOURCE,
                    unit=unit,
                    targets=[
                        Target(expr=expr, legendFormat=legend, refId=chr(65 + j))
                        for j, (expr, legend) in enumerate(targets)
                    ],
                    gridPos=GridPos(h=8, w=12, x=12 * (i % 2), y=y + 8 * (i // 2)),
                )
            )
        y += 8 * ((len(panels) + 1) // 2)
    return out


def _datasource() -> Template:
    return Template(name="datasource", query="prometheus", type="datasource", label="Data source")


def dashboards() -> dict[str, Dashboard]:
    """File name -> dashboard."""
    function_var = Template(
        name="function",
        label="Function",
        query="label_values(galaxy_function_requests_total, function)",
        dataSource=DATASOURCE,
        includeAll=True,
        multi=True,
        default="$__all",
    )
    return {
        "galaxy-control-plane.json": Dashboard(
            title="Galaxy: control plane",
            uid="galaxy-control-plane",
            tags=["galaxy"],
            templating=Templating(list=[_datasource()]),
            panels=_panels(CONTROL_PLANE),
            refresh="30s",
        ).auto_panel_ids(),
        "galaxy-functions.json": Dashboard(
            title="Galaxy: functions",
            uid="galaxy-functions",
            tags=["galaxy"],
            templating=Templating(list=[_datasource(), function_var]),
            panels=_panels(FUNCTION),
            refresh="30s",
        ).auto_panel_ids(),
    }


def render(d: Dashboard) -> str:
    """The dashboard's JSON, stable (sorted keys, fixed indent)."""
    return json.dumps(d.to_json_data(), cls=DashboardEncoder, indent=2, sort_keys=True) + "\n"


def prometheus_rule() -> str:
    """The rule file wrapped in a PrometheusRule (Prometheus Operator)."""
    groups = yaml.safe_load((MONITORING / "galaxy-rules.yaml").read_text())["groups"]
    cr = {
        "apiVersion": "monitoring.coreos.com/v1",
        "kind": "PrometheusRule",
        "metadata": {
            "name": "galaxy",
            "namespace": "galaxy",
            "labels": {"app.kubernetes.io/part-of": "galaxy"},
        },
        "spec": {"groups": groups},
    }
    header = "# Generated from ../galaxy-rules.yaml by scripts/make_dashboards.py: edit that.\n"
    return header + yaml.safe_dump(cr, sort_keys=False, width=100)


def outputs() -> dict[Path, str]:
    """Every generated file and its content."""
    out = {OUT / name: render(d) for name, d in dashboards().items()}
    out[RULE_CR] = prometheus_rule()
    return out


def main() -> int:
    """Write the files, or with --check report stale ones."""
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--check", action="store_true", help="exit 1 if a committed file is stale")
    args = p.parse_args()
    stale = []
    for path, text in outputs().items():
        if args.check:
            if not path.exists() or path.read_text() != text:
                stale.append(path.name)
        else:
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(text)
            print(f"wrote {path}")
    if stale:
        print(f"stale: {', '.join(stale)}; run python scripts/make_dashboards.py", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
