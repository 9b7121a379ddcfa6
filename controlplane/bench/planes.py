"""Control planes a bench run starts, alone or kept up across bench files.

A bench file's run starts one control plane per configuration and stops it
after the configuration's scenarios (``start_control_plane``). The short runs
of many shipped plans (``galaxy bench --quick``, the suite's end-to-end check
that each plan runs) mostly resolve to the same configuration: ``ControlPlanes``
keeps one control plane up per configuration, and one echo server, across
the files, as one file's scenarios already share them. Each file's functions
are deleted after its run, so the next file finds the controller's function
limit and the nodes' capacity as a fresh control plane has them.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from controlplane.bench import plan as pl
from controlplane.bench.echo import EchoProcess
from controlplane.bench.etcd import LocalEtcd
from controlplane.launch.up import Supervisor


@dataclass
class ControlPlane:
    """A started control plane and, for ``state: etcd``, its own etcd."""

    sup: Supervisor
    etcd: LocalEtcd | None
    #: Every process it started (the leak check reads them).
    pids: list[int]

    async def stop(self) -> None:
        """Stop the processes, then the etcd they used."""
        try:
            await self.sup.stop()
        finally:
            if self.etcd is not None:
                await self.etcd.stop()


async def start_control_plane(
    cp: dict[str, Any], run_dir: Path, log: Callable[[str], None]
) -> ControlPlane:
    """Start the control plane a configuration describes and wait for all its
    nodes; RuntimeError (after stopping what started) when they do not come."""
    etcd: LocalEtcd | None = None
    state_url = "memory://"
    if cp["state"] == "etcd":
        etcd = LocalEtcd(run_dir / "etcd-data")
        state_url = await etcd.start()
    elif str(cp["state"]).startswith(("etcd://", "etcds://")):
        state_url = str(cp["state"])
    plane = ControlPlane(Supervisor(pl.up_config(cp, run_dir, state_url)), etcd, [])
    try:
        await plane.sup.start()
        plane.pids += [int(c["pid"]) for c in plane.sup.endpoints()["components"]]
        alive = await plane.sup.wait_nodes_registered()
        if alive < cp["nodes"]:
            raise RuntimeError(f"only {alive} of {cp['nodes']} nodes registered")
    except BaseException:
        await plane.stop()
        raise
    log(f"control plane up in {run_dir} ({cp})")
    return plane


class ControlPlanes:
    """One control plane per configuration and one echo server, kept up
    until ``close`` (see the module's docstring). Not safe for concurrent
    runs: each run deploys and deletes functions on the plane it gets."""

    def __init__(self, run_dir: Path, log: Callable[[str], None]) -> None:
        self.run_dir = run_dir
        self.log = log
        self._planes: dict[str, ControlPlane] = {}
        self._echo: EchoProcess | None = None
        #: Control planes started so far (one per configuration seen).
        self.started = 0

    async def echo(self) -> EchoProcess:
        """The shared echo server, started on first use."""
        if self._echo is None:
            echo = EchoProcess()
            await echo.start()
            self._echo = echo
        return self._echo

    async def get(self, cp: dict[str, Any]) -> ControlPlane:
        """The control plane of this configuration, started on first use."""
        key = json.dumps(cp, sort_keys=True, default=str)
        plane = self._planes.get(key)
        if plane is None:
            where = self.run_dir / f"plane-{self.started}"
            self.started += 1
            plane = await start_control_plane(cp, where, self.log)
            self._planes[key] = plane
        return plane

    async def functions(self) -> list[str]:
        """The names of the functions the control planes hold now."""
        from controlplane.sdk.client import GalaxyClient

        names: list[str] = []
        for plane in self._planes.values():
            async with GalaxyClient(plane.sup.endpoints()["controller"]) as c:
                names += [f.name for f in await c.list_functions()]
        return names

    async def close(self) -> None:
        """Stop every control plane and the echo server."""
        planes, self._planes = list(self._planes.values()), {}
        try:
            for plane in planes:
                await plane.stop()
        finally:
            if self._echo is not None:
                await self._echo.stop()
                self._echo = None
