"""The node agent's Kubernetes setup outside its manifest: the Localhost
seccomp profile shipped in deploy/kubernetes/node/ stays the one generated
from the instances' filter (sandbox/seccomp.py), and the RuntimeClass the
DaemonSet names is valid and is the one it names."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from controlplane.nodeagent.sandbox import seccomp

REPO = Path(__file__).resolve().parents[2]
NODE = REPO / "deploy" / "kubernetes" / "node"
PROFILE = NODE / seccomp.AGENT_PROFILE
STANDIN = Path(__file__).resolve().parent / "kubelet_standin.py"


def daemonset() -> dict:
    docs = yaml.safe_load_all((REPO / "deploy" / "kubernetes" / "galaxy.yaml").read_text())
    return next(d for d in docs if d and d["kind"] == "DaemonSet")


def test_the_shipped_profile_is_the_generated_one():
    """Regenerate with: python -m controlplane.nodeagent.sandbox.seccomp >
    deploy/kubernetes/node/galaxy-nodeagent.json"""
    assert json.loads(PROFILE.read_text()) == seccomp.agent_profile()


def test_the_profile_gives_the_agent_only_what_bubblewrap_needs():
    (denied, *_) = seccomp.agent_profile()["syscalls"]
    allowed_extra = set(seccomp.DENIED) - set(denied["names"])
    assert allowed_extra == set(seccomp.BWRAP_NEEDS) & set(seccomp.DENIED)
    assert {"ptrace", "bpf", "keyctl", "setns", "open_by_handle_at"} <= set(denied["names"])


def test_the_daemonset_names_the_profile_and_the_runtime_class():
    spec = daemonset()["spec"]["template"]["spec"]
    (c,) = spec["containers"]
    assert c["securityContext"]["seccompProfile"]["localhostProfile"] == PROFILE.name
    (rc,) = list(yaml.safe_load_all((NODE / "runtimeclass.yaml").read_text()))
    assert spec["runtimeClassName"] == rc["metadata"]["name"]
    kubernetes_validate = pytest.importorskip("kubernetes_validate")
    kubernetes_validate.validate(rc, "1.30", strict=True)


@pytest.mark.slow  # starts processes
@pytest.mark.skipif(shutil.which("unshare") is None, reason="needs util-linux unshare")
def test_the_kubelet_stand_in_applies_the_profile(tmp_path):
    """Under the shipped profile a process may make a user namespace (what
    bwrap does first); under the same profile with unshare refused (as
    RuntimeDefault does) it may not: the stand-in really applies it."""
    strict = seccomp.agent_profile()
    strict["syscalls"][0]["names"].append("unshare")
    (tmp_path / "strict.json").write_text(json.dumps(strict))
    cmd = ["unshare", "--user", "--map-root-user", "true"]
    ok = subprocess.run([sys.executable, str(STANDIN), str(PROFILE), *cmd], capture_output=True)
    refused = subprocess.run(
        [sys.executable, str(STANDIN), str(tmp_path / "strict.json"), *cmd], capture_output=True
    )
    assert ok.returncode == 0, ok.stderr
    assert refused.returncode != 0 and b"Operation not permitted" in refused.stderr


def test_the_image_has_what_the_daemonsets_sandbox_runs():
    """--sandbox bwrap needs bubblewrap, setpriv and libseccomp in the
    runtime stage of the image (the last FROM)."""
    runtime = (REPO / "deploy" / "Dockerfile").read_text().rsplit("\nFROM ", 1)[1]
    args = daemonset()["spec"]["template"]["spec"]["containers"][0]["args"]
    assert args[args.index("--sandbox") + 1] == "bwrap"
    for package in ("bubblewrap", "util-linux", "libseccomp2"):
        assert package in runtime, package
