"""A real Prometheus (Debian package prometheus) scrapes a real `galaxy up`
through the file_sd file it writes, with the shipped rules loaded: every
target is up, a child killed with SIGKILL is scraped again at its new port
after the supervisor restarts it, and every recording rule and every
dashboard panel's expression returns data through Prometheus's HTTP API."""

from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import subprocess
import time
import urllib.parse
import urllib.request
from pathlib import Path

import pytest
import yaml

from controlplane.launch import promsd
from tests.integration.upctl import REPO, GalaxyUp
from tests.monitoring.test_rules import RULES, panel_exprs

pytestmark = [pytest.mark.integration, pytest.mark.slow]

SCRAPE_S = 1.0


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class Prom:
    """A Prometheus process on a free port, with its own data dir."""

    def __init__(self, run_dir: Path, work: Path) -> None:
        binary = shutil.which("prometheus")
        if binary is None:
            if os.environ.get("CI"):
                pytest.fail("prometheus is missing; .ci/run installs it")
            pytest.skip("needs prometheus (Debian package prometheus)")
        work.mkdir(parents=True, exist_ok=True)
        conf = work / "prometheus.yml"
        conf.write_text(promsd.scrape_config(run_dir, SCRAPE_S, rules=RULES))
        self.url = f"http://127.0.0.1:{_free_port()}"
        self.log = open(work / "prometheus.log", "wb")
        self.proc = subprocess.Popen(
            [binary, f"--config.file={conf}", f"--storage.tsdb.path={work / 'data'}",
             f"--web.listen-address={self.url.removeprefix('http://')}"],
            stdout=self.log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
        )  # fmt: skip

    def api(self, path: str, **params: str) -> dict:
        q = urllib.parse.urlencode(params)
        with urllib.request.urlopen(f"{self.url}/api/v1/{path}?{q}", timeout=5) as r:
            body: dict = json.loads(r.read())
        assert body["status"] == "success", body
        return body["data"]

    def targets(self) -> dict[str, dict]:
        """instance label -> active target."""
        return {t["labels"]["instance"]: t for t in self.api("targets")["activeTargets"]}

    def until(self, what: str, check, timeout: float = 60.0):  # type: ignore[no-untyped-def]
        """Poll Prometheus (an external process: polling is how to learn its
        state) until check() returns a truthy value."""
        deadline = time.monotonic() + timeout
        last: object = None
        while time.monotonic() < deadline:
            try:
                got = check()
            except OSError as e:  # not listening yet
                got, last = None, e
            if got:
                return got
            time.sleep(0.2)
        raise AssertionError(f"Prometheus: {what} not within {timeout}s (last: {last})")

    def query(self, expr: str) -> list[dict]:
        return list(self.api("query", query=expr)["result"])

    def stop(self) -> None:
        self.proc.terminate()
        try:
            self.proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait(timeout=10)
        self.log.close()


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    run = tmp_path_factory.mktemp("run")
    g = GalaxyUp(run, "--nodes", "2")
    g.start()
    prom = Prom(run, tmp_path_factory.mktemp("prom"))
    try:
        yield g, prom
    finally:
        prom.stop()
        pids = g.pids()
        g.stop()
        assert not g.kill_leftovers(pids)


def _drive_load(g: GalaxyUp) -> None:
    r = g.cli("deploy", "-f", str(REPO / "examples" / "echo.yaml"))
    assert r.returncode == 0, r.stderr
    gw = g.endpoints["gateway"]
    for i in range(30):
        with urllib.request.urlopen(
            urllib.request.Request(f"http://{gw}/functions/echo", data=f"m{i}".encode()),
            timeout=30,
        ) as resp:
            assert resp.status == 200
    # A request for a function that does not exist: a 4xx series too.
    with pytest.raises(urllib.error.HTTPError):
        urllib.request.urlopen(f"http://{gw}/functions/nosuch", data=b"x", timeout=30)


def test_scraped_through_file_sd_across_a_restart(cluster) -> None:
    g, prom = cluster
    names = {c["name"] for c in g.endpoints["components"]} | {"supervisor"}
    prom.until("every target up", lambda: names <= {
        i for i, t in prom.targets().items() if t["health"] == "up"
    })  # fmt: skip
    kinds = {t["labels"]["kind"] for t in prom.targets().values()}
    assert {"supervisor", "controller", "dispatch", "schedule", "clustermgr", "nodeagent",
            "gateway"} <= kinds  # fmt: skip

    old = next(c for c in g.endpoints["components"] if c["name"] == "dispatch-0")
    killed_at = time.monotonic()
    os.kill(old["pid"], signal.SIGKILL)
    g.wait_line("dispatch-0 restarted")
    g.reload_endpoints()
    new = next(c for c in g.endpoints["components"] if c["name"] == "dispatch-0")
    assert new["metrics"] != old["metrics"]  # a new process on a new port
    targets = json.loads((g.run_dir / promsd.TARGETS_FILE).read_text())
    assert [new["metrics"]] in [t["targets"] for t in targets]

    def scraped_anew() -> bool:
        t = prom.targets().get("dispatch-0")
        return bool(t and new["metrics"] in t["scrapeUrl"] and t["health"] == "up")

    prom.until("dispatch-0 scraped at its new port", scraped_anew, timeout=30)
    gap = time.monotonic() - killed_at
    print(f"dispatch-0: killed to scraped again at its new port: {gap:.1f}s")
    # The series continues under the same instance label: one up{} series.
    ups = prom.query('up{instance="dispatch-0"}')
    assert len(ups) == 1 and ups[0]["value"][1] == "1", ups


def test_every_rule_and_panel_returns_data(cluster) -> None:
    g, prom = cluster
    _drive_load(g)
    records = [
        r["record"]
        for grp in yaml.safe_load(RULES.read_text())["groups"]
        for r in grp["rules"]
        if "record" in r
    ]
    exprs = list(records)
    for name in ("galaxy-control-plane.json", "galaxy-functions.json"):
        dashboard = json.loads((REPO / "deploy/monitoring/dashboards" / name).read_text())
        # The functions dashboard's $function variable: every function.
        exprs += [e.replace("$function", ".*") for e in panel_exprs(dashboard)]
    # Rules run every evaluation interval; wait until each has a sample.
    missing: list[str] = []

    def all_have_data() -> bool:
        missing[:] = [e for e in exprs if not prom.query(e)]
        return not missing

    try:
        prom.until("every rule and panel with data", all_have_data, timeout=60)
    except AssertionError:
        raise AssertionError(f"no data for: {missing}") from None


def test_children_log_json_with_their_identity(cluster) -> None:
    g, _ = cluster
    for c in g.endpoints["components"]:
        lines = Path(c["log"]).read_text().splitlines()
        records = [json.loads(line) for line in lines if line.startswith("{")]
        assert records, c["name"]
        assert {r["instance"] for r in records} == {c["id"]}, c["name"]
        assert {r["component"] for r in records} == {c["kind"]}, c["name"]
    r = g.cli("logs", "dispatch-0", "--since", "10m")
    assert r.returncode == 0 and "serving on" in r.stdout, r.stderr


def test_gateway_metrics_and_access_log_name_the_function(cluster) -> None:
    g, _ = cluster
    _drive_load(g)
    gw = next(c for c in g.endpoints["components"] if c["name"] == "gateway-0")
    r = subprocess.run(["curl", "-sf", f"http://{gw['metrics']}/metrics"],
                       capture_output=True, text=True, timeout=30)  # fmt: skip
    assert r.returncode == 0, r.stderr
    lines = [x for x in r.stdout.splitlines() if x.startswith("galaxy_function_requests_total{")]
    echo = [x for x in lines if 'function="echo"' in x and 'code="200"' in x]
    assert echo and float(echo[0].rsplit(" ", 1)[1]) >= 30, lines
    assert 'namespace="default"' in echo[0] and 'revision="echo-00001"' in echo[0], echo
    access = [
        json.loads(x)
        for x in Path(gw["log"]).read_text().splitlines()
        if x.startswith("{") and '"galaxy.access"' in x
    ]
    mine = [a for a in access if a.get("function") == "echo" and a["status"] == 200]
    assert len(mine) >= 30 and all(a["duration_ms"] > 0 for a in mine)
    assert any(a["status"] == 404 for a in access)  # the unknown function


def test_instances_are_counted_once_and_dispatch_names_the_function(cluster) -> None:
    g, prom = cluster
    _drive_load(g)
    r = g.cli("invoke", "echo", "--data", "via-sdk")  # a dispatch through the SDK
    assert r.returncode == 0, r.stderr
    status = json.loads(g.cli("status", "-o", "json").stdout)
    real = len(status.get("instances", []))
    assert real >= 1

    def counted() -> bool:
        got = prom.query("sum(galaxy_function_instances)")
        agents = prom.query("sum(galaxy_nodeagent_instances)")
        return bool(got and agents) and float(got[0]["value"][1]) == real == float(
            agents[0]["value"][1]
        )

    prom.until(f"sum(galaxy_function_instances) == {real} (and the agents agree)", counted)
    d = next(c for c in g.endpoints["components"] if c["name"] == "dispatch-0")
    r = subprocess.run(["curl", "-sf", f"http://{d['metrics']}/metrics"],
                       capture_output=True, text=True, timeout=30)  # fmt: skip
    assert r.returncode == 0, r.stderr
    ok = [x for x in r.stdout.splitlines()
          if x.startswith("galaxy_dispatch_requests_total{") and 'function="echo"' in x
          and 'code="OK"' in x]  # fmt: skip
    assert ok and 'namespace="default"' in ok[0] and 'revision="echo-00001"' in ok[0], ok
    assert 'galaxy_function_instances{function="echo",namespace="default"' in r.stdout
    assert (
        'galaxy_cold_starts_total{function="echo",namespace="default",revision="echo-00001"}'
        in r.stdout
    )
