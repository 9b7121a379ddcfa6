"""A real `galaxy up` for the LLM bench: started as a subprocess with its own
run dir, a function deployed at a fixed number of instances, and stopped.

The bench measures what a user sees: requests enter through the gateway's
OpenAI routes, Dispatch picks the instance, the node agent runs the real
server process (emulated or a real model), exactly as in production.
"""

from __future__ import annotations

import asyncio
import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import yaml

from controlplane.runtime import procs

READY_LINE = "Press Ctrl-C to stop."
START_TIMEOUT_S = 120.0


class UpError(RuntimeError):
    """The control plane or the deployment did not come up; says why."""


class Up:
    """``galaxy up --nodes N`` in ``run_dir``, with the CLI pointed at it."""

    def __init__(
        self,
        run_dir: Path,
        nodes: int,
        env: dict[str, str] | None = None,
        args: tuple[str, ...] = (),
    ) -> None:
        #: more flags of `galaxy up` (e.g. ``--sandbox process``)
        self.args = args
        self.run_dir, self.nodes = run_dir, nodes
        self.env = {**os.environ, **(env or {})}
        self.proc: procs.Spawned | None = None
        self.gateway = self.gateway_metrics = ""
        self.token = ""

    @classmethod
    def processes(cls, run_dir: Path, nodes: int) -> Up:
        """A ``--sandbox process`` control plane whose instances run this
        interpreter's ``python3`` (its packages): instances reach each other,
        directly (in the default sandbox a prefill instance's cache goes
        through its node agent's KV relay instead)."""
        path = f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}"
        return cls(run_dir, nodes, {"PATH": path}, ("--sandbox", "process"))

    async def __aenter__(self) -> Up:
        await self.start()
        return self

    async def __aexit__(self, *_exc: object) -> None:
        await self.stop()

    def _cli(self, *args: str) -> list[str]:
        cli = [sys.executable, "-m", "controlplane.tools.cli", "--run-dir", str(self.run_dir)]
        return [*cli, *args]

    async def start(self) -> None:
        """Start and wait for the ready line (bounded)."""
        self.run_dir.mkdir(parents=True, exist_ok=True)
        args = self._cli("up", "--gateway-port", "0", "--nodes", str(self.nodes), *self.args)
        self.proc = await procs.spawn(
            *args,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            env=self.env,
            start_new_session=True,
        )
        assert self.proc.stdout is not None
        seen: list[str] = []
        try:
            async with asyncio.timeout(START_TIMEOUT_S):
                while READY_LINE not in (line := (await self.proc.stdout.readline()).decode()):
                    if not line:
                        raise UpError("galaxy up exited:\n" + "".join(seen[-20:]))
                    seen.append(line)
        except TimeoutError:
            await self.stop()
            raise UpError("galaxy up not ready:\n" + "".join(seen[-20:])) from None
        # Keep draining its output so a full pipe never blocks it.
        self._drain = asyncio.create_task(self._discard(self.proc.stdout))
        ep = json.loads((self.run_dir / "endpoints.json").read_text())
        self.gateway = ep["gateway"]
        self.gateway_metrics = next(
            (c["metrics"] for c in ep.get("components", []) if c.get("kind") == "gateway"), ""
        )
        self.token = (self.run_dir / "token").read_text().strip()

    @staticmethod
    async def _discard(stream: asyncio.StreamReader) -> None:
        while await stream.readline():
            pass

    async def cli(self, *args: str, limit_s: float = 60.0) -> str:
        """Run a CLI command against this control plane; its stdout."""
        # subprocess.run on a thread: Popen, not the loop's subprocess
        # support (controlplane.runtime.procs says why).
        try:
            p = await asyncio.to_thread(
                subprocess.run, self._cli(*args), capture_output=True, env=self.env,
                timeout=limit_s,
            )  # fmt: skip
        except subprocess.TimeoutExpired:
            raise UpError(f"galaxy {args[0]}: no answer within {limit_s:.0f}s") from None
        if p.returncode:
            raise UpError(f"galaxy {args[0]}: {p.stderr.decode().strip()[-500:]}")
        return str(p.stdout.decode())

    async def deploy(
        self, spec_file: Path, instances: int, out_dir: Path, *, cold: bool = False
    ) -> str:
        """Deploy a spec with min_scale = max_scale = instances (``cold``: min
        0, so the first request starts the instance); returns the function's
        name once the minimum is ready."""
        spec = scaled_spec(spec_file, instances)
        if cold:
            spec["min_scale"] = 0
        path = out_dir / f"{spec['name']}-x{instances}.yaml"
        write_text(path, yaml.safe_dump(spec))
        said = await self.cli("deploy", "-f", str(path))
        # Instances carry the revision's name ("NAME-00002"): count the new
        # revision's only, not the previous deployment's draining ones.
        m = re.search(r"revision (\d+)", said)
        rev = f"{spec['name']}-{int(m.group(1)):05d}" if m else str(spec["name"])
        # A runtime that starts slowly (vLLM: minutes on a loaded machine)
        # says so in its startup timeout; wait at least that long.
        limit_s = max(300.0, int(spec.get("startup_timeout_ms") or 0) / 1000 + 60)
        await self.wait_instances(rev, spec["min_scale"], limit_s)
        return str(spec["name"])

    async def wait_instances(self, name: str, n: int, limit_s: float = 300.0) -> None:
        """Poll status until ``n`` instances of revision ``name`` are up (bounded)."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + limit_s
        have = 0
        while loop.time() < deadline:
            st = json.loads(await self.cli("status", "-o", "json"))
            have = sum(
                1 for i in st.get("instances", []) if i.get("instance", {}).get("function") == name
            )
            if have >= n:
                return
            await asyncio.sleep(0.5)  # polling a status the CLI cannot wait on
        raise UpError(f"{name}: {have} of {n} instances up after {limit_s:.0f}s")

    async def stop(self) -> None:
        """SIGINT (its Ctrl-C path), then SIGKILL after 30 s."""
        p = self.proc
        if p is None or p.returncode is not None:
            return
        p.send_signal(signal.SIGINT)
        try:
            async with asyncio.timeout(30):
                await p.wait()
        except TimeoutError:
            os.killpg(p.pid, signal.SIGKILL)
            await p.wait()


def scaled_spec(spec_file: Path, instances: int) -> dict[str, Any]:
    """The spec at ``instances`` (min = max scale), its relative paths made
    absolute against the original spec's directory as `galaxy deploy` does."""
    spec: dict[str, Any] = yaml.safe_load(spec_file.read_text())
    spec["min_scale"] = spec["max_scale"] = instances
    model = spec.get("model")
    if isinstance(model, dict) and "://" not in str(model.get("uri", "")):
        model["uri"] = str((spec_file.parent / model["uri"]).resolve())
    art = str(spec.get("artifact", ""))
    if art and "://" not in art:
        spec["artifact"] = str((spec_file.parent / art).resolve())
    return spec


def write_text(path: Path, text: str) -> None:
    """Write a small local file, making its directory."""
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)


def write_results(out: Path, args: object, results: list[dict[str, Any]], report: str) -> None:
    """A bench run's ``results.json`` (its command, end time, arguments and
    results: what reproduces and checks it) and ``report.md`` in out."""
    doc = {
        "command": " ".join(sys.argv),
        "finished": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "args": vars(args),
        "results": results,
    }
    write_text(out / "results.json", json.dumps(doc, indent=1))
    write_text(out / "report.md", report + "\n")
