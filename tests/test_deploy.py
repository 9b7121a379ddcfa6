"""deploy/ stays in step with the code: every container's arguments parse with
the real `galaxy` CLI, and the image copies only paths that exist. (No
Kubernetes API server or Docker engine runs here; this is what can be checked.)"""

from pathlib import Path

import pytest
import yaml

from controlplane.tools.cli import build_parser

REPO = Path(__file__).resolve().parents[1]
DEPLOY = REPO / "deploy"


def containers():
    for f in sorted((DEPLOY / "kubernetes").glob("*.yaml")):
        for doc in yaml.safe_load_all(f.read_text()):
            spec = (doc or {}).get("spec", {}).get("template", {}).get("spec", {})
            for c in spec.get("containers", []):
                yield f"{doc['metadata']['name']}/{c['name']}", c


@pytest.mark.parametrize("name, container", list(containers()))
def test_container_args_parse_with_the_real_cli(name, container):
    env = {e["name"]: f"x-{e['name'].lower()}" for e in container.get("env", [])}
    args = [str(a) for a in container["args"]]
    for k, v in env.items():
        args = [a.replace(f"$({k})", v) for a in args]
    assert not [a for a in args if "$(" in a], f"{name}: undefined variable in {args}"
    parsed = build_parser().parse_args(args)  # SystemExit (a failure) on a bad flag
    assert parsed.command == "serve"
    port = int(parsed.listen.rsplit(":", 1)[1])
    assert port in {p["containerPort"] for p in container["ports"]}, name
    probe = container["readinessProbe"]["grpc"]["port"]
    assert probe == port, f"{name}: the gRPC probe must hit the gRPC port"


def test_every_control_function_has_a_deployment_the_actuator_can_scale():
    names = {n.split("/")[0] for n, _ in containers()}
    assert {"galaxy-dispatch", "galaxy-schedule", "galaxy-clustermgr"} <= names


def test_dockerfile_copies_existing_paths():
    for line in (DEPLOY / "Dockerfile").read_text().splitlines():
        if line.startswith("COPY "):
            for src in line.split()[1:-1]:
                assert (REPO / src).exists(), src
