"""`galaxy up`: run a whole control plane on this machine, one process per
component, until Ctrl-C; then stop everything (no orphans).

Each child gets a lifeline: its stdin is a pipe from this supervisor, and a
child exits when the pipe closes, so even a SIGKILLed supervisor leaves no
processes behind.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import os
import shlex
import shutil
import socket
import subprocess
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from controlplane.controller.config import ControllerConfig
from controlplane.launch import agentcache, etcd, promsd
from controlplane.launch.endpoints import ENDPOINTS_FILE
from controlplane.launch.upconfig import UpConfig
from controlplane.nodeagent.config import NodeAgentConfig
from controlplane.runtime import config, credentials, netaddr, procs, tls, tlsfiles, version
from controlplane.runtime.config import RpcConfig
from controlplane.runtime.host import READY_PREFIX, serve_command
from controlplane.runtime.tls import TlsConfig
from functions.dispatch.config import DispatchConfig
from functions.schedule.config import ScheduleConfig

log = logging.getLogger(__name__)

READY_TIMEOUT_S = 60.0


@dataclass
class Child:
    """One supervised process."""

    name: str
    proc: procs.Spawned
    log_path: Path
    ready: dict[str, Any] = field(default_factory=dict)
    cgroup: Path | None = None
    #: the command that started it (a restart runs it again)
    cmd: list[str] = field(default_factory=list)


class Supervisor:
    """Starts, watches and stops the processes of one control plane."""

    def __init__(self, cfg: UpConfig) -> None:
        self.cfg = cfg
        self.children: list[Child] = []
        #: Names of the serving runtimes registered at start.
        self.runtimes: list[str] = []
        self.log_dir = cfg.run_dir / "logs"
        #: The supervisor's own /metrics (host:port), set by whoever serves it.
        self.supervisor_metrics = ""
        #: A local Prometheus's web address (`galaxy up --prometheus`).
        self.prometheus = ""
        #: Fixed metrics ports by child name (``metrics_port_base``): a
        #: restarted child keeps its port.
        self._metrics_ports: dict[str, int] = {}

    def metrics_port(self, name: str) -> int:
        """The /metrics port of the process called name: 0 (any free port)
        unless ``metrics_port_base`` is set, then base + its start order
        (the supervisor is base + 0)."""
        base = self.cfg.metrics_port_base
        if not base:
            return 0
        if name not in self._metrics_ports:
            self._metrics_ports[name] = base + len(self._metrics_ports)
        return self._metrics_ports[name]

    def write_run_files(self) -> None:
        """endpoints.json and the Prometheus file_sd targets, both current."""
        endpoints = self.endpoints()
        (self.cfg.run_dir / ENDPOINTS_FILE).write_text(json.dumps(endpoints, indent=2))
        promsd.write_targets(self.cfg.run_dir, endpoints)

    @property
    def tls_dir(self) -> Path | None:
        """Where the certificates are, when TLS is on."""
        return self.cfg.run_dir / "certs" if self.cfg.tls else None

    def client_tls(self) -> TlsConfig | None:
        """The admin client's TLS config (None: plaintext)."""
        return tlsfiles.client_tls(self.tls_dir)

    @property
    def token_file(self) -> Path | None:
        """The admin token's file, when tokens are on (with TLS)."""
        on = self.cfg.tls and self.cfg.tokens
        return self.cfg.run_dir / credentials.TOKEN_FILE if on else None

    def client_token(self) -> str | None:
        """The admin token (None: tokens are off)."""
        path = self.token_file
        return credentials.read_token_file(path) if path is not None else None

    def _serve_cmd(self, kind: str, instance_id: str, *extra: str) -> list[str]:
        cmd = serve_command(kind, instance_id, self.cfg.host, *tlsfiles.flags(self.tls_dir))
        return cmd + self._rpc_flags() + list(extra) + self.cfg.extra.get(kind, [])

    def _controller_args(self, ha: bool = False) -> list[str]:
        """The controller's flags (``ControllerConfig``, with the scaling
        settings `galaxy up` passes on), then the caller's own. With control
        scaling it starts extra instances with the same flags as the ones
        started here, and never removes those (the minimum of each kind is
        what `galaxy up` starts)."""
        cfg = self.cfg
        ctl = ControllerConfig(state=cfg.state, ha=ha, **cfg.controller_settings())
        if cfg.autoscale_control:
            # TLS: the controller gives its own choice to the instances it starts.
            common = self._rpc_flags()
            per_kind = {
                "dispatch": ["--state", cfg.state, *self._credit_flags()],
                "clustermgr": ["--state", cfg.state],
                "schedule": self._schedule_flags(),
            }
            instance_args, mins = [], []
            for kind, flags in per_kind.items():
                extra = common + flags + cfg.extra.get(kind, [])
                if extra:
                    instance_args.append(f"{kind}={shlex.join(extra)}")
                mins.append(f"{kind}={max(1, getattr(cfg, kind))}")
            ctl = ctl.replace(
                autoscale_control=True,
                instance_log_dir=str(self.log_dir),
                instance_host=cfg.host,
                instance_cpu_limit=[f"{k}={c}" for k, c in cfg.control_cpu_limits.items()],
                instance_args=instance_args,
                min_instances=mins,
            )
        if self.token_file is not None:  # makes the admin token valid
            ctl = ctl.replace(bootstrap_token_file=str(self.token_file))
        return config.to_flags(ctl) + list(cfg.controller_args)

    def _env(self) -> dict[str, str] | None:
        """The children's environment: ours, with tokens turned off when
        asked (through the environment, so the instances the controller
        starts itself get the same choice)."""
        if self.cfg.tls and not self.cfg.tokens:
            return {**os.environ, "GALAXY_AUTH": "none"}
        return None

    def _with_log_file(self, cmd: list[str], log_path: Path) -> list[str]:
        """A `galaxy` child logs to log_path itself, rotated by size (its
        stderr follows the current file); other children (etcd) only have
        their stderr there."""
        cli = "controlplane.tools.cli"
        if cli not in cmd or "--log-file" in cmd:
            return cmd
        i = cmd.index(cli) + 1
        flags = [
            "--log-file", str(log_path),
            "--log-max-bytes", str(self.cfg.log_max_bytes),
            "--log-backups", str(self.cfg.log_backups),
        ]  # fmt: skip
        return [*cmd[:i], *flags, *cmd[i:]]

    async def spawn(self, name: str, cmd: list[str]) -> Child:
        """Start one supervised child from its command line and wait for its
        ready line (raises RuntimeError naming the log if it never comes).

        The command may wrap ``galaxy serve`` (e.g. ``ip netns exec NS ...``,
        which execs it, so the PID is the component's own)."""
        self.log_dir.mkdir(parents=True, exist_ok=True)
        log_path = self.log_dir / f"{name}.log"
        cmd = self._with_log_file(cmd, log_path)
        if "--metrics-listen" in cmd and self.cfg.metrics_port_base:
            i = cmd.index("--metrics-listen") + 1
            host, _ = netaddr.split_host_port(cmd[i])
            cmd = [*cmd[:i], netaddr.join_host_port(host, self.metrics_port(name)), *cmd[i + 1 :]]
        # Opening a local log file does not block the loop in any way that matters.
        with open(log_path, "ab") as logf:  # noqa: ASYNC230
            proc = await procs.spawn(
                *cmd,
                env=self._env(),
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                stderr=logf,
            )
        child = Child(name, proc, log_path, cmd=list(cmd))
        self.children.append(child)
        cpus = self.cfg.control_cpu_limits.get(name.split("-")[0])
        if cpus:
            from controlplane.controller.actuators import cpulimit

            try:
                child.cgroup = cpulimit.limit_process(proc.pid, cpus, name)
            except cpulimit.CpuLimitError as e:
                raise RuntimeError(str(e)) from e
        assert proc.stdout is not None
        try:
            while True:
                line = await asyncio.wait_for(proc.stdout.readline(), READY_TIMEOUT_S)
                if not line:
                    raise RuntimeError(
                        f"{name} exited with code {await proc.wait()} before it was ready; "
                        f"see {log_path}:\n{_tail(log_path)}"
                    )
                text = line.decode(errors="replace").strip()
                if text.startswith(READY_PREFIX):
                    child.ready = json.loads(text[len(READY_PREFIX) :])
                    break
        except TimeoutError:
            raise RuntimeError(
                f"{name} was not ready within {READY_TIMEOUT_S:.0f}s; see {log_path}"
            ) from None
        # Keep draining stdout so a chatty child never blocks on a full pipe.
        asyncio.get_running_loop().create_task(_drain(proc.stdout))
        return child

    async def start(self) -> dict[str, Any]:
        """Start everything; returns the endpoints (also written to endpoints.json)."""
        cfg = self.cfg
        cfg.run_dir.mkdir(parents=True, exist_ok=True)
        if cfg.sandbox != "emulated":
            await asyncio.to_thread(agentcache.claim, cfg.run_dir)
        if self.tls_dir is not None:
            # Every component dials others by their advertised host: it must
            # be in the certificates (ensure adds it and keeps older hosts).
            hosts = {netaddr.advertised_host(cfg.host), "localhost", "127.0.0.1", "::1"}
            await asyncio.to_thread(tls.ensure, self.tls_dir, hosts=sorted(hosts))
        if self.token_file is not None:
            # The first admin's token: the controller stores only its hash.
            await asyncio.to_thread(credentials.ensure_token_file, self.token_file)
        if cfg.gateway_port > 0:
            # Before anything starts: a taken port is the user's to fix.
            gateway_port_free(cfg.host, cfg.gateway_port)
        caddr = await self._start_controllers()
        # With --ha and memory:// the controllers' etcd replaced the state:
        # Dispatch and ClusterMgr share it (a restarted one recovers from it).
        cfg = self.cfg
        # Before anything else starts, so no one can deploy without them.
        self.runtimes = await self.register_runtimes()
        jobs = []
        for kind, n in (
            ("clustermgr", cfg.clustermgr),
            ("schedule", cfg.schedule),
            ("dispatch", cfg.dispatch),
        ):
            for i in range(n):
                extra = ["--controller", caddr]
                if kind == "schedule":
                    extra += self._schedule_flags()
                if kind in ("dispatch", "clustermgr"):
                    extra += ["--state", cfg.state]
                if kind == "dispatch":
                    extra += self._credit_flags()
                jobs.append(self.spawn(f"{kind}-{i}", self._serve_cmd(kind, f"{kind}-{i}", *extra)))
        await asyncio.gather(*jobs)
        per = cfg.nodes_per_agent or (105 if cfg.sandbox == "emulated" else 1)
        jobs = []
        for a, first in enumerate(range(0, cfg.nodes, per)):
            agent = NodeAgentConfig(
                nodes=min(per, cfg.nodes - first),
                node_index_start=first,
                sandbox=cfg.sandbox,
                cpu_millis=cfg.node_cpu_millis,
                memory_mib=cfg.node_memory_mib,
                gpus=cfg.node_gpus,
                start_delay_ms=cfg.start_delay_ms,
                log_dir=str(self.log_dir / "instances"),
                **agentcache.model_cache_settings(cfg, f"agent-{a}"),
            )
            flags = ["--controller", caddr, *config.to_flags(agent), *cfg.agent_args]
            jobs.append(
                self.spawn(f"agent-{a}", self._serve_cmd("nodeagent", f"agent-{a}", *flags))
            )
        await asyncio.gather(*jobs)
        if cfg.gateway_port >= 0:
            graphs = ("--graphs-dir", cfg.graphs_dir) if cfg.graphs_dir else ()
            cmd = self._serve_cmd("gateway", "gateway-0", "--controller", caddr, *graphs)
            # serve_command listens on any port; the gateway has a known one.
            cmd[cmd.index("--listen") + 1] = f"{cfg.host}:{cfg.gateway_port}"
            await self.spawn("gateway-0", cmd)
        self.write_run_files()
        return self.endpoints()

    def _schedule_flags(self) -> list[str]:
        """Ablation switches of the Schedule instances."""
        sched = ScheduleConfig(
            probe_cache=self.cfg.probe_cache,
            exact_partition=self.cfg.exact_partition,
            credits=self.cfg.credits,
            scoring="model_locality" if self.cfg.locality else "least_loaded",
        )
        return config.to_flags(sched)

    def _credit_flags(self) -> list[str]:
        """Capacity credits off (Schedule and Dispatch take the same flag)."""
        return config.to_flags(DispatchConfig(credits=self.cfg.credits))

    def _rpc_flags(self) -> list[str]:
        """The connection cache switch every component takes (``RpcConfig``)."""
        return config.to_flags(
            RpcConfig(
                connection_cache=self.cfg.connection_cache,
                agent_streams=self.cfg.agent_streams,
                stream_batches=self.cfg.stream_batches,
                heartbeat_batches=self.cfg.heartbeat_batches,
            )
        )

    async def _start_controllers(self) -> str:
        """The controller, or with ``ha`` two of them (and etcd if needed);
        returns the address(es) to give the other components."""
        cfg = self.cfg
        if not cfg.ha:
            ctl = await self.spawn(
                "controller",
                self._serve_cmd("controller", "controller-0", *self._controller_args()),
            )
            return str(ctl.ready["address"])
        if cfg.state.startswith("memory"):
            if etcd.etcd_binary() is None:
                raise RuntimeError(
                    "--ha needs shared state: pass --state etcd://HOST:PORT "
                    "(or install etcd to get a local one)"
                )
            data = cfg.run_dir / "etcd"
            host = "127.0.0.1"  # etcd serves only this machine's controllers
            cmd = etcd.child_command(data, host, etcd.free_port(host), etcd.free_port(host))
            state = (await self.spawn("etcd", cmd)).ready["state"]
            self.cfg = cfg = cfg.replace(state=state)
        elif not cfg.state.startswith(("etcd://", "etcds://")):
            raise RuntimeError("--ha needs shared state: --state etcd://HOST:PORT (or etcds://)")
        ctls = await asyncio.gather(
            *(
                self.spawn(
                    f"controller-{i}",
                    self._serve_cmd(
                        "controller", f"controller-{i}", *self._controller_args(ha=True)
                    ),
                )
                for i in range(2)
            )
        )
        return ",".join(str(c.ready["address"]) for c in ctls)

    def endpoints(self) -> dict[str, Any]:
        """Addresses of every component, as written to endpoints.json.

        ``controller`` is one address, or with ``ha`` the controllers'
        comma-separated (any of them answers); ``controllers`` lists them.
        """
        out: dict[str, Any] = {
            "controller": "",
            "components": [],
            "supervisor_pid": os.getpid(),
            "version": version.version(),
        }
        if self.supervisor_metrics:
            out["supervisor_metrics"] = self.supervisor_metrics
        out["prometheus_targets"] = str(self.cfg.run_dir / promsd.TARGETS_FILE)
        if self.prometheus:
            out["prometheus"] = self.prometheus
        if self.tls_dir is not None:
            out["tls_dir"] = str(self.tls_dir)
        if self.token_file is not None:
            out["token_file"] = str(self.token_file)
        if self.runtimes:
            out["runtimes"] = self.runtimes
        # By name: a restarted controller is listed where it was.
        ctls = [
            c.ready["address"]
            for c in sorted(self.children, key=lambda c: c.name)
            if is_controller(c.name)
        ]
        out["controller"] = ",".join(ctls)
        out["controllers"] = ctls
        for c in self.children:
            if c.ready.get("kind") == "gateway":
                out.setdefault("gateway", c.ready["address"])
            out["components"].append({"name": c.name, **c.ready, "log": str(c.log_path)})
        return out

    async def register_runtimes(self) -> list[str]:
        """Register cfg.runtimes through the controller's API (PutRuntime:
        an unchanged runtime writes nothing); their names. RuntimeError
        naming the file on a bad one."""
        if self.cfg.runtimes is None:
            return []
        from controlplane.runtime import runtimefiles
        from controlplane.runtime.errors import GalaxyError
        from controlplane.sdk.client import GalaxyClient

        try:
            runtimes = runtimefiles.load_dir(self.cfg.runtimes)
            async with GalaxyClient(
                self.endpoints()["controller"],
                timeout=10.0,
                tls=self.client_tls(),
                token=self.client_token(),
            ) as c:
                return [(await c.put_runtime(rt)).name for rt in runtimes]
        except GalaxyError as e:
            raise RuntimeError(f"runtimes in {self.cfg.runtimes}: {e.message}") from None

    async def wait_nodes_registered(self, timeout_s: float = 60.0, count: int | None = None) -> int:
        """Wait until ClusterMgr reports count nodes alive (default: every
        node this supervisor started); returns the number alive."""
        from controlplane.sdk.client import GalaxyClient

        loop = asyncio.get_running_loop()
        end = loop.time() + timeout_s
        async with GalaxyClient(
            self.endpoints()["controller"],
            timeout=5.0,
            tls=self.client_tls(),
            token=self.client_token(),
        ) as c:
            while True:
                st = await c.status()
                alive = sum(1 for n in st.nodes if n.alive)
                if alive >= (self.cfg.nodes if count is None else count) or loop.time() > end:
                    return alive
                # Registration happens in other processes; poll a few times a second.
                await asyncio.sleep(0.1)

    async def stop(self, grace_s: float = 5.0) -> None:
        """Stop children, node agents first and the controller last."""
        with contextlib.suppress(OSError):
            (self.cfg.run_dir / ENDPOINTS_FILE).unlink()
        for group in (0, 1, 2, 3):
            members = [c for c in self.children if _stop_group(c.name) == group]
            await asyncio.gather(*(_terminate(c.proc, grace_s) for c in members))
        for c in self.children:
            if c.cgroup is not None:
                from controlplane.controller.actuators import cpulimit

                cpulimit.release(c.cgroup)
        self.children.clear()
        shm = agentcache.shm_dir(self.cfg.run_dir)
        if shm is not None:  # the memory tier lives as long as the agents
            shutil.rmtree(shm, ignore_errors=True)


def is_controller(name: str) -> bool:
    """True for the name of a controller child ("controller", "controller-1")."""
    return name == "controller" or name.startswith("controller-")


def _stop_group(name: str) -> int:
    # Agents first (nothing new is placed), the controllers after their
    # instances deregistered, etcd last (the controllers resign through it).
    if name.startswith("agent"):
        return 0
    if is_controller(name):
        return 2
    return 3 if name == "etcd" else 1


async def _terminate(proc: procs.Spawned, grace_s: float) -> None:
    await procs.terminate(proc, grace_s)
    if proc.stdin is not None:
        proc.stdin.close()


async def _drain(stream: asyncio.StreamReader) -> None:
    while await stream.read(65536):
        pass


def _tail(path: Path, lines: int = 15) -> str:
    try:
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])
    except OSError:
        return ""


def gateway_port_free(host: str, port: int) -> None:
    """RuntimeError with the way out when host:port cannot be listened on
    (bound as the gateway binds it, SO_REUSEADDR set, then closed again)."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    with socket.socket(family, socket.SOCK_STREAM) as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind((host, port))
        except OSError as e:
            raise RuntimeError(
                f"--gateway-port {port}: cannot listen on {netaddr.join_host_port(host, port)} "
                f"({e.strerror or e}); pass --gateway-port 0 for any free port "
                "(or -1 for no gateway)"
            ) from None
