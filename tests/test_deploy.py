"""deploy/ stays in step with the code: every container's arguments parse with
the real `galaxy` CLI, and the image copies only paths that exist. (No
Kubernetes API server or Docker engine runs here; this is what can be checked.)

The hardening of docs/security.md ("Kubernetes hardening") is checked three
ways: every document against the Kubernetes 1.30 OpenAPI schema
(kubernetes-validate, strict: unknown fields fail), checkov over the
manifests and the Dockerfile (any finding not in ALLOWED fails, and so does
an ALLOWED entry that no longer occurs), and structural assertions that name
the rule a change breaks.
"""

import fnmatch
import importlib
import json
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml

from controlplane.tools.cli import build_parser

REPO = Path(__file__).resolve().parents[1]
DEPLOY = REPO / "deploy"
K8S = DEPLOY / "kubernetes"
DOCKERFILE = DEPLOY / "Dockerfile"
ACTUATOR = REPO / "controlplane" / "controller" / "actuators" / "kubernetes.py"

# The oldest Kubernetes the manifests target (grpc probes: GA in 1.27;
# NetworkPolicy endPort: GA in 1.25; PDB policy/v1: 1.21).
K8S_VERSION = "1.30"
UID = 10001
WORKLOADS = {"Deployment", "DaemonSet", "StatefulSet"}
CONTROL_FUNCTIONS = {"galaxy-dispatch", "galaxy-schedule", "galaxy-clustermgr"}

# checkov findings we keep, as (check id, resource glob) -> one-line reason.
# docs/security.md ("Kubernetes hardening") lists the same, at more length.
ALLOWED = {
    ("CKV_K8S_43", "*"): "image by tag: the release pipeline pins the digest it built "
    "(kustomize `images:`); a digest cannot be written before the image exists",
    ("CKV_K8S_15", "*"): "imagePullPolicy IfNotPresent: the tag is immutable per release, "
    "and images loaded into kind/minikube have no registry to pull from",
    ("CKV_K8S_38", "Deployment.galaxy.galaxy-controller"): "the Kubernetes actuator needs "
    "the token (in-cluster config); every other pod runs without one",
    ("CKV_DOCKER_2", "*"): "no HEALTHCHECK: one image serves six components on different "
    "ports, Kubernetes ignores HEALTHCHECK and the manifests define the probes",
}

# Kubernetes API calls the actuator may make (kubernetes_asyncio method ->
# the RBAC rule it needs). A new call fails test_role_grants_exactly_what_
# the_actuator_calls until it is added here and to the Role.
API_CALLS = {
    "read_namespaced_deployment_scale": ("apps", "deployments/scale", "get"),
    "patch_namespaced_deployment_scale": ("apps", "deployments/scale", "patch"),
    "patch_namespaced_pod": ("", "pods", "patch"),
}


def _load_all(f: Path) -> list[Any]:
    # libyaml's safe loader: the manifests are parsed for several
    # parametrizations while every test worker collects (pure Python took
    # 1.2 s of each worker's collection, 2026-11-29).
    return list(yaml.load_all(f.read_text(), Loader=yaml.CSafeLoader))


def documents() -> list[dict]:
    docs = []
    for f in sorted(K8S.glob("*.yaml")):
        docs += [d for d in _load_all(f) if d]
    return docs


def by_kind(kind: str) -> list[dict]:
    return [d for d in documents() if d["kind"] == kind]


def workloads() -> list[dict]:
    return [d for d in documents() if d["kind"] in WORKLOADS]


def containers():
    for f in sorted((DEPLOY / "kubernetes").glob("*.yaml")):
        for doc in _load_all(f):
            spec = (doc or {}).get("spec", {}).get("template", {}).get("spec", {})
            for c in spec.get("containers", []):
                yield f"{doc['metadata']['name']}/{c['name']}", c


def pod_specs():
    for w in workloads():
        yield w["metadata"]["name"], w["spec"]["template"]["spec"]


def parsed_args(container: dict):
    env = {e["name"]: f"x-{e['name'].lower()}" for e in container.get("env", [])}
    args = [str(a) for a in container["args"]]
    for k, v in env.items():
        args = [a.replace(f"$({k})", v) for a in args]
    assert not [a for a in args if "$(" in a], f"undefined variable in {args}"
    return build_parser().parse_args(args)  # SystemExit (a failure) on a bad flag


@pytest.mark.parametrize("name, container", list(containers()))
def test_container_args_parse_with_the_real_cli(name, container):
    parsed = parsed_args(container)
    assert parsed.command == "serve"
    port = int(parsed.listen.rsplit(":", 1)[1])
    assert port in {p["containerPort"] for p in container["ports"]}, name
    for kind in ("readinessProbe", "livenessProbe", "startupProbe"):
        probe = container[kind]
        if parsed.kind == "gateway":  # HTTP, not a gRPC component
            assert probe["httpGet"]["port"] == port, f"{name}: {kind} must hit the HTTP port"
            assert probe["httpGet"]["path"] in ("/v2/health/live", "/v2/health/ready")
        else:
            # The gRPC port requires mutual TLS, which a kubelet probe cannot
            # do: probes hit the plaintext health-only port (--health-listen).
            health = int(parsed.health_listen.rsplit(":", 1)[1])
            assert health in {p["containerPort"] for p in container["ports"]}, name
            assert probe["grpc"]["port"] == health, f"{name}: {kind} must hit --health-listen"


@pytest.mark.parametrize("name, container", list(containers()))
def test_every_component_serves_mutual_tls_from_its_own_secret_files(name, container):
    parsed = parsed_args(container)
    assert not parsed.insecure, name
    assert parsed.tls_dir and parsed.tls_server_name, name
    spec = next(s for n, s in pod_specs() if n == name.split("/")[0])
    mount = next(m for m in container["volumeMounts"] if m["mountPath"] == parsed.tls_dir)
    assert mount.get("readOnly") is True, name
    volume = next(v for v in spec["volumes"] if v["name"] == mount["name"])
    files = {i["path"] for i in volume["secret"]["items"]}
    kind = parsed.kind
    # Its own pair and the CA only: never the CA key or another identity's key;
    # and the lease key where leases are signed (Dispatch) or checked (the
    # node agent's entry, which without it would let every request in).
    lease = {"lease.key"} if kind in ("dispatch", "nodeagent") else set()
    assert files == {"ca.pem", f"{kind}.pem", f"{kind}-key.pem", *lease}, name


@pytest.mark.parametrize("name, container", list(containers()))
def test_the_public_api_takes_tokens_and_the_controller_bootstraps_an_admin(name, container):
    parsed = parsed_args(container)
    if parsed.kind in ("controller", "dispatch", "gateway"):
        # auto with TLS = tokens; nothing turns them off.
        assert parsed.auth in ("auto", "tokens"), name
    if parsed.kind != "controller":
        return
    path = parsed.bootstrap_token_file
    assert path, "the controller must register the first admin's token"
    spec = next(s for n, s in pod_specs() if n == name.split("/")[0])
    mount = next(m for m in container["volumeMounts"] if path.startswith(m["mountPath"] + "/"))
    volume = next(v for v in spec["volumes"] if v["name"] == mount["name"])
    assert mount.get("readOnly") is True
    assert volume["secret"]["secretName"] == "galaxy-admin-token"
    assert {i["path"] for i in volume["secret"]["items"]} == {path.rsplit("/", 1)[1]}


def test_every_control_function_has_a_deployment_the_actuator_can_scale():
    names = {n.split("/")[0] for n, _ in containers()}
    assert {"galaxy-dispatch", "galaxy-schedule", "galaxy-clustermgr"} <= names


def test_dockerfile_copies_existing_paths():
    for line in (DEPLOY / "Dockerfile").read_text().splitlines():
        if line.startswith("COPY ") and "--from=" not in line:
            for src in line.split()[1:-1]:
                assert (REPO / src).exists(), src


def _require(module: str):
    """The scanners are in the dev extra: missing is a failure, not a skip."""
    try:
        return importlib.import_module(module)
    except ImportError:
        pytest.fail(f"{module} is not installed: pip install -e '.[dev]'")


# -- schema -------------------------------------------------------------------


@pytest.mark.parametrize("doc", documents(), ids=lambda d: f"{d['kind']}/{d['metadata']['name']}")
def test_manifest_validates_against_the_kubernetes_schema(doc):
    kubernetes_validate = _require("kubernetes_validate")
    try:
        kubernetes_validate.validate(doc, K8S_VERSION, strict=True)
    except kubernetes_validate.ValidationError as e:
        pytest.fail(f"{doc['kind']}/{doc['metadata']['name']}: {e.message} at {list(e.path)}")


# -- checkov ------------------------------------------------------------------


def checkov_findings() -> set[tuple[str, str]]:
    _require("checkov")
    cmd = [sys.executable, "-m", "checkov.main", "-d", str(DEPLOY), "--framework",
           "kubernetes", "dockerfile", "-o", "json", "--quiet", "--compact",
           "--skip-download"]  # fmt: skip
    r = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True, timeout=300)
    assert r.stdout.strip(), f"checkov gave no report (rc {r.returncode}): {r.stderr[-2000:]}"
    reports = json.loads(r.stdout)
    reports = reports if isinstance(reports, list) else [reports]
    assert {rep["check_type"] for rep in reports} == {"kubernetes", "dockerfile"}, reports
    found = set()
    for rep in reports:
        assert rep["summary"]["parsing_errors"] == 0, rep["summary"]
        found |= {(f["check_id"], f["resource"]) for f in rep["results"]["failed_checks"]}
    return found


def _allowed(finding: tuple[str, str]) -> bool:
    return any(finding[0] == c and fnmatch.fnmatch(finding[1], g) for c, g in ALLOWED)


@pytest.fixture(scope="module")
def findings() -> set[tuple[str, str]]:
    return checkov_findings()


@pytest.mark.checkov
def test_checkov_finds_nothing_outside_the_allow_list(findings):
    new = sorted(f for f in findings if not _allowed(f))
    assert not new, "checkov findings not in ALLOWED (fix them or allow with a reason):\n" + (
        "\n".join(f"  {c} {r}" for c, r in new)
    )


@pytest.mark.checkov
def test_every_allowed_checkov_finding_still_occurs(findings):
    def occurs(check: str, glob: str) -> bool:
        return any(f[0] == check and fnmatch.fnmatch(f[1], glob) for f in findings)

    stale = [k for k in ALLOWED if not occurs(*k)]
    assert not stale, f"ALLOWED entries checkov no longer reports (remove them): {stale}"


def test_every_allowed_finding_is_in_the_security_doc():
    text = (REPO / "docs" / "security.md").read_text()
    for check, _ in ALLOWED:
        assert check in text, f"{check} is allowed but not explained in docs/security.md"


# -- structure ----------------------------------------------------------------

CONTAINER_CONTEXT = {
    "runAsNonRoot": True,
    "runAsUser": UID,
    "runAsGroup": UID,
    "readOnlyRootFilesystem": True,
    "allowPrivilegeEscalation": False,
    "privileged": False,
    "capabilities": {"drop": ["ALL"]},
    "seccompProfile": {"type": "RuntimeDefault"},
}
POD_CONTEXT = {
    "runAsNonRoot": True,
    "runAsUser": UID,
    "runAsGroup": UID,
    "fsGroup": UID,
    "seccompProfile": {"type": "RuntimeDefault"},
}


# The one exception (docs/security.md, "The node agent on Kubernetes"): the
# node agent builds a bubblewrap sandbox per instance, which needs new
# namespaces and mounts (a Localhost seccomp profile that allows them, shipped
# in deploy/kubernetes/node/) and a fresh /proc per PID namespace (procMount
# Unmasked, which the restricted standard admits only in a pod user
# namespace: hostUsers false). Still no capability, no hostPath.
NODEAGENT_CONTEXT = {
    **CONTAINER_CONTEXT,
    "procMount": "Unmasked",
    "seccompProfile": {"type": "Localhost", "localhostProfile": "galaxy-nodeagent.json"},
}


@pytest.mark.parametrize("name, spec", list(pod_specs()))
def test_pod_security_context(name, spec):
    assert spec.get("securityContext") == POD_CONTEXT, name
    assert not spec.get("hostNetwork") and not spec.get("hostPID") and not spec.get("hostIPC")
    assert not [v for v in spec.get("volumes", []) if "hostPath" in v], f"{name}: hostPath"
    nodeagent = name == "galaxy-nodeagent"
    assert spec.get("hostUsers") is (False if nodeagent else None), name
    for c in spec["containers"] + spec.get("initContainers", []):
        want = NODEAGENT_CONTEXT if nodeagent else CONTAINER_CONTEXT
        assert c.get("securityContext") == want, f"{name}/{c['name']}"


@pytest.mark.parametrize("name, spec", list(pod_specs()))
def test_writable_paths_are_bounded_empty_dirs(name, spec):
    volumes = {v["name"]: v for v in spec.get("volumes", [])}
    for c in spec["containers"]:
        mounts = {m["mountPath"]: m["name"] for m in c.get("volumeMounts", [])}
        assert "/tmp" in mounts, f"{name}: /tmp must be writable (read-only root)"
        read_only = {m["mountPath"] for m in c.get("volumeMounts", []) if m.get("readOnly")}
        for path, vol in mounts.items():
            if path in read_only:
                continue  # e.g. the TLS secret: not a writable path
            assert "sizeLimit" in volumes[vol].get("emptyDir", {}), f"{name}: {path}"
        if parsed_args(c).kind == "nodeagent":
            log_dir = parsed_args(c).log_dir
            assert log_dir in mounts, f"{name}: --log-dir {log_dir} must be a mounted volume"


@pytest.mark.parametrize("name, spec", list(pod_specs()))
def test_only_the_controller_mounts_a_service_account_token(name, spec):
    want = name == "galaxy-controller"
    assert spec.get("automountServiceAccountToken") is want, name
    if want:
        assert spec["serviceAccountName"] == "galaxy-controller"
    for sa in by_kind("ServiceAccount"):
        assert sa.get("automountServiceAccountToken") is False, sa["metadata"]["name"]


@pytest.mark.parametrize("name, container", list(containers()))
def test_resources_and_probes(name, container):
    res = container["resources"]
    for key in ("cpu", "memory"):
        assert key in res["requests"] and key in res["limits"], f"{name}: {key}"
    for kind in ("readinessProbe", "livenessProbe", "startupProbe"):
        assert kind in container, f"{name}: no {kind}"


def _cpu_millis(q: str) -> int:
    return int(q[:-1]) if q.endswith("m") else int(float(q) * 1000)


def _mib(q: str) -> int:
    units = {"Mi": 1, "Gi": 1024}
    return int(q[:-2]) * units[q[-2:]]


def test_node_agent_limits_cover_the_capacity_it_advertises():
    """Instances run inside the agent's container: its limits bound them all,
    so they must hold what the agent offers ClusterMgr, plus the agent."""
    ((name, c),) = [(n, c) for n, c in containers() if n.startswith("galaxy-nodeagent/")]
    args = parsed_args(c)
    limits, requests = c["resources"]["limits"], c["resources"]["requests"]
    assert _cpu_millis(limits["cpu"]) >= args.cpu_millis * args.nodes + 250, name
    assert _mib(limits["memory"]) >= args.memory_mib * args.nodes + 256, name
    assert requests["cpu"] == limits["cpu"] and requests["memory"] == limits["memory"]


def test_pod_security_admission_restricted():
    (ns,) = by_kind("Namespace")
    assert ns["metadata"]["labels"]["pod-security.kubernetes.io/enforce"] == "restricted"
    for d in documents():
        if d["kind"] != "Namespace":
            assert d["metadata"].get("namespace") == ns["metadata"]["name"], d["metadata"]


def test_every_deployment_has_a_disruption_budget():
    pdbs = {p["spec"]["selector"]["matchLabels"]["app"]: p for p in by_kind("PodDisruptionBudget")}
    for d in by_kind("Deployment"):
        app = d["spec"]["template"]["metadata"]["labels"]["app"]
        assert app in pdbs, f"{d['metadata']['name']}: no PodDisruptionBudget"
        spec = pdbs[app]["spec"]
        if app in CONTROL_FUNCTIONS:  # the controller may scale them to 1
            assert spec.get("maxUnavailable") == 1 and "minAvailable" not in spec, app


def test_controller_replicas_spread_over_nodes():
    (d,) = [d for d in by_kind("Deployment") if d["metadata"]["name"] == "galaxy-controller"]
    assert d["spec"]["replicas"] >= 2
    spread = d["spec"]["template"]["spec"]["topologySpreadConstraints"]
    hard = [s for s in spread if s["whenUnsatisfiable"] == "DoNotSchedule"]
    assert [s["topologyKey"] for s in hard] == ["kubernetes.io/hostname"]


def _ingress_sources(app: str, port: int) -> set[str]:
    """Apps allowed to reach app:port (names; 'clients' for the client
    namespaces, '*' for anyone)."""
    out: set[str] = set()
    for p in by_kind("NetworkPolicy"):
        sel = p["spec"]["podSelector"]
        selected = sel.get("matchLabels", {}).get("app") == app or any(
            e["key"] == "app" and app in e["values"] for e in sel.get("matchExpressions", [])
        )
        if not selected:
            continue
        for rule in p["spec"].get("ingress", []):
            ports = rule.get("ports", [])
            if not any(pp["port"] <= port <= pp.get("endPort", pp["port"]) for pp in ports):
                continue
            if "from" not in rule:
                out.add("*")
            for peer in rule.get("from", []):
                ns = peer.get("namespaceSelector", {}).get("matchLabels", {})
                if ns.get("galaxy.io/client") == "true":
                    out.add("clients")
                elif ns:
                    out.add("other-namespace")
                pod = peer.get("podSelector", {})
                if pod and not ns:
                    out.add(pod.get("matchLabels", {}).get("app", ""))
                    for e in pod.get("matchExpressions", []):
                        out |= set(e["values"])
    out.discard("")
    return out


def test_network_policies_default_deny_and_the_call_graph():
    deny = [
        p
        for p in by_kind("NetworkPolicy")
        if p["spec"]["podSelector"] == {} and not p["spec"].get("ingress")
    ]
    assert deny and deny[0]["spec"]["policyTypes"] == ["Ingress"], "no default deny"
    g = {f"galaxy-{k}" for k in ("controller", "dispatch", "schedule", "clustermgr")}
    agents, gw = "galaxy-nodeagent", "galaxy-gateway"
    # Who calls whom, from the *Stub call sites (see the policies' comments).
    assert _ingress_sources("galaxy-controller", 7000) == g | {agents, gw, "clients"}
    assert _ingress_sources("galaxy-dispatch", 7001) == {
        "galaxy-controller", "galaxy-dispatch", "galaxy-clustermgr", agents, gw, "clients",
    }  # fmt: skip
    assert _ingress_sources("galaxy-schedule", 7002) == {
        "galaxy-controller",
        "galaxy-clustermgr",
        "galaxy-dispatch",
    }
    assert _ingress_sources("galaxy-clustermgr", 7003) == {"galaxy-controller", agents}
    assert _ingress_sources(agents, 7004) == {"galaxy-schedule", "galaxy-dispatch"}
    # Function instances (process sandbox ports) from the data path.
    for port in (10000, 32767):
        assert _ingress_sources(agents, port) == {gw, agents, "clients"}
    assert _ingress_sources(gw, 8080) == {"*"}
    for app in g | {agents, gw}:
        assert _ingress_sources(app, 9090) == {"other-namespace"}, app  # Prometheus only


def test_role_grants_exactly_what_the_actuator_calls():
    called = set(re.findall(r"\.((?:read|patch|create|delete|list|replace)_namespaced_\w+)\(",
                            ACTUATOR.read_text()))  # fmt: skip
    assert called, "no Kubernetes API call found in the actuator"
    unknown = called - set(API_CALLS)
    assert not unknown, f"add {unknown} to API_CALLS (and the Role)"
    need = {API_CALLS[c] for c in called}
    (role,) = by_kind("Role")
    granted = {
        (g, r, v)
        for rule in role["rules"]
        for g in rule["apiGroups"]
        for r in rule["resources"]
        for v in rule["verbs"]
    }
    assert granted == need
    assert not by_kind("ClusterRole") and not by_kind("ClusterRoleBinding")


def test_dockerfile_is_multi_stage_and_runs_as_the_manifests_uid():
    text = DOCKERFILE.read_text()
    stages = re.split(r"^FROM ", text, flags=re.M)[1:]
    assert len(stages) >= 2, "build and runtime stages"
    final = stages[-1]
    assert re.match(r"python:3\.11-slim", final), "slim runtime stage"
    assert f"USER {UID}:{UID}" in final
    assert "COPY --from=build" in final
    for tool in ("gcc", "build-essential", "pip install", "-dev "):
        assert tool not in final, f"{tool!r} in the runtime stage"


def test_the_image_runtime_admits_the_examples_where_the_image_puts_them():
    """deploy/runtimes/python.yaml is what an admin applies on a cluster: it
    must be a valid runtime whose artifact prefix is where the Dockerfile
    copies the examples, so the echo example deploys from the image."""
    from controlplane.runtime import runtimefiles, servingruntime
    from controlplane.runtime.errors import InvalidArgument
    from galaxy.v1 import common_pb2

    rt = runtimefiles.load_file(DEPLOY / "runtimes" / "python.yaml")
    servingruntime.check_runtime(rt)
    text = DOCKERFILE.read_text()
    workdir = [ln.split()[1] for ln in text.splitlines() if ln.startswith("WORKDIR ")][-1]
    assert "COPY examples ./examples" in text
    assert list(rt.artifact.prefixes) == [f"{workdir}/examples"]
    spec = common_pb2.FunctionSpec(
        name="echo", runtime="python", artifact=f"{workdir}/examples/echo_server.py"
    )
    resolved = servingruntime.resolve(spec, rt)
    assert resolved.command[:2] == ["python3", "-u"] and resolved.command[2].endswith(".py")
    outside = common_pb2.FunctionSpec(name="x", runtime="python", artifact="/tmp/x.py")
    with pytest.raises(InvalidArgument, match=r"^artifact:"):
        servingruntime.resolve(outside, rt)
