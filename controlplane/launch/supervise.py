"""`galaxy up` keeps its children running: a child that dies is started
again (``RestartPolicy``: backoff, restart budget), logged and counted in
``galaxy_supervisor_restarts_total``; only a deliberate stop (Ctrl-C,
SIGTERM) or a spent budget ends the run.

A restarted controller keeps its port (every other component was told its
address; under `--ha` both controllers' addresses); the others take any
free port and re-register with the controller, which repartitions.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time

from prometheus_client import Counter

from controlplane.launch.restart import RestartPolicy
from controlplane.launch.up import Child, Supervisor, is_controller
from controlplane.runtime import netaddr

log = logging.getLogger(__name__)

RESTARTS = Counter(
    "galaxy_supervisor_restarts_total", "Children of `galaxy up` restarted, by kind", ["kind"]
)


def _pinned(child: Child) -> list[str]:
    """The child's command, listening on the port it had when that matters."""
    cmd = list(child.cmd)
    if is_controller(child.name) and "--listen" in cmd and child.ready.get("address"):
        i = cmd.index("--listen") + 1
        host, _ = netaddr.split_host_port(cmd[i])
        cmd[i] = netaddr.join_host_port(host, netaddr.split_host_port(child.ready["address"])[1])
    return cmd


async def supervise(sup: Supervisor, stop: asyncio.Event, policy: RestartPolicy) -> str | None:
    """Run until ``stop`` is set (returns None) or a child's restart budget
    is spent (returns why)."""
    now = time.monotonic()
    for c in sup.children:
        policy.started(c.name, now)
    while True:
        waits = {asyncio.ensure_future(c.proc.wait()): c for c in sup.children}
        stopper = asyncio.ensure_future(stop.wait())
        done, _ = await asyncio.wait([stopper, *waits], return_when=asyncio.FIRST_COMPLETED)
        for w in waits:
            w.cancel()
        stopper.cancel()
        if stop.is_set():
            return None
        for fut in done:
            child = waits.get(fut)
            if child is None:
                continue
            code = child.proc.returncode
            delay = policy.on_exit(child.name, time.monotonic())
            if delay is None:
                return (
                    f"{child.name} exited with code {code} and was restarted "
                    f"{policy.restarts(child.name)} times within {policy.window_s:.0f}s; "
                    f"see {child.log_path}"
                )
            log.warning(
                "%s exited with code %s; restarting in %.1fs (restart %d of %d within %.0fs)",
                child.name, code, delay, policy.restarts(child.name), policy.budget,
                policy.window_s,
            )  # fmt: skip
            print(f"{child.name} exited with code {code}; restarting in {delay:.1f}s", flush=True)
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stop.wait(), delay)
            if stop.is_set():
                return None
            sup.children.remove(child)
            try:
                new = await sup.spawn(child.name, _pinned(child))
            except RuntimeError as e:
                log.warning("%s did not come back: %s", child.name, e)
                # Counts as a quick death: the next round backs off further.
                sup.children = [c for c in sup.children if c.name != child.name]
                sup.children.append(child)
                continue
            RESTARTS.labels(child.name.split("-")[0]).inc()
            if new.name == "controller":
                # With memory:// state a new controller starts empty.
                try:
                    await sup.register_runtimes()
                except RuntimeError as e:
                    log.warning("serving runtimes not registered again: %s", e)
            policy.started(new.name, time.monotonic())
            sup.write_run_files()  # endpoints.json and Prometheus targets
            print(f"{new.name} restarted (pid {new.ready.get('pid')})", flush=True)
