"""The Kubernetes-shaped node agent, run for real next to a `galaxy up`
control plane: the exact arguments of the DaemonSet in
deploy/kubernetes/galaxy.yaml (addresses, paths and the cluster name mapped
to this machine's), as `nobody` (the DaemonSet's UID 10001 stands for any
user that is not root), with only a delegated cgroup subtree writable, its
TLS files copied as the Secret mounts them, and the DaemonSet's Localhost
seccomp profile applied by tests/security/kubelet_standin.py."""

from __future__ import annotations

import os
import pwd
import shutil
import signal
import subprocess
import time
import uuid
from pathlib import Path

import yaml

from tests.integration.upctl import REPO, GalaxyUp
from tests.nodeagent.delegation import SYSTEM_PYTHON, Delegated, agent_env, as_nobody

HERE = Path(__file__).resolve().parent
MANIFEST = REPO / "deploy" / "kubernetes" / "galaxy.yaml"
PROFILE = REPO / "deploy" / "kubernetes" / "node" / "galaxy-nodeagent.json"


def daemonset_container() -> dict:
    """The node agent's container in the DaemonSet."""
    for doc in yaml.safe_load_all(MANIFEST.read_text()):
        if doc and doc["kind"] == "DaemonSet":
            (c,) = doc["spec"]["template"]["spec"]["containers"]
            return c  # type: ignore[no-any-return]
    raise AssertionError("no DaemonSet in the manifest")


def daemonset_args(node: str, controller: str, work: Path, cgroup_root: Path) -> list[str]:
    """The DaemonSet's arguments with this machine's addresses and paths."""
    c = daemonset_container()
    mounts = {m["name"]: m["mountPath"] for m in c["volumeMounts"]}
    paths = {mounts["logs"]: str(work / "logs"), mounts["tls"]: str(work / "tls"),
             "/sys/fs/cgroup": str(cgroup_root)}  # fmt: skip
    out = []
    for a in map(str, c["args"]):
        a = a.replace("$(NODE_NAME)", node).replace("$(POD_IP)", "127.0.0.1")
        if a.startswith("0.0.0.0:"):
            a = "127.0.0.1:0"  # no fixed port: other tests run beside this one
        elif a == "galaxy-controller:7000":
            a = controller
        elif a == "galaxy.internal":
            a = "localhost"  # the name `galaxy up`'s certificates carry
        out.append(paths.get(a, a))
    return out


class K8sShapedUp(GalaxyUp):
    """`galaxy up --nodes 0` plus one Kubernetes-shaped agent (``start_agent``)."""

    agent: subprocess.Popen[bytes] | None = None
    node = ""

    def pids(self) -> list[int]:
        return [*super().pids(), *([self.agent.pid] if self.agent else [])]

    def start_agent(self, user: pwd.struct_passwd, d: Delegated, timeout: float = 90) -> None:
        """Start the agent as user with d's subtree; return once its node is
        registered."""
        tls = d.work / "tls"
        tls.mkdir()
        for name in ("ca.pem", "nodeagent.pem", "nodeagent-key.pem", "lease.key"):
            shutil.copy(self.run_dir / "certs" / name, tls / name)
        for p in (tls, *tls.iterdir()):
            os.chown(p, user.pw_uid, user.pw_gid)
            os.chmod(p, 0o700 if p == tls else 0o400)
        (d.work / "logs").mkdir()
        os.chown(d.work / "logs", user.pw_uid, user.pw_gid)
        self.node = f"k8s-{uuid.uuid4().hex[:8]}"
        args = daemonset_args(self.node, self.controller, d.work, d.root)
        log = open(self.run_dir / "logs" / "agent-0.log", "ab")  # closed below
        self.agent = subprocess.Popen(
            [*as_nobody(user), SYSTEM_PYTHON, str(HERE / "kubelet_standin.py"), str(PROFILE),
             SYSTEM_PYTHON, "-m", "controlplane.tools.cli", *args],
            env={**agent_env(d.work), "NODE_NAME": self.node, "POD_IP": "127.0.0.1"},
            cwd=d.work, stdout=log, stderr=subprocess.STDOUT,
        )  # fmt: skip
        log.close()
        deadline = time.monotonic() + timeout
        # No event to await from outside: ask the controller until the node
        # shows up (each answer is a real status call).
        while time.monotonic() < deadline:
            assert self.agent.poll() is None, (self.run_dir / "logs" / "agent-0.log").read_text()
            r = self.cli("status", "--json", timeout=20)
            if r.returncode == 0 and self.node in r.stdout:
                return
            time.sleep(0.5)
        raise AssertionError(f"node {self.node} did not register: {r.stdout[-2000:]}")

    def stop_agent(self) -> None:
        """SIGTERM the agent (it stops its instances) and wait for it."""
        if self.agent is not None and self.agent.poll() is None:
            self.agent.send_signal(signal.SIGTERM)
            try:
                self.agent.wait(30)
            except subprocess.TimeoutExpired:
                self.agent.kill()
                self.agent.wait(10)
