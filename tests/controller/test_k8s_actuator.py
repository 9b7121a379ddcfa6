"""The Kubernetes actuator against a recorded-contract fake API server
(tests/controller/fake_k8s_api.py): no Kubernetes API server runs here."""

from __future__ import annotations

import asyncio
import contextlib

import pytest

pytest.importorskip("kubernetes_asyncio")
pytest.importorskip("aiohttp")

from controlplane.controller.actuators.base import ActuatorError
from controlplane.controller.actuators.kubernetes import DELETION_COST, KubernetesActuator
from galaxy.v1 import (
    common_pb2,
    controller_pb2,
    controller_pb2_grpc,
    schedule_pb2_grpc,
)
from tests.controller.conftest import Controller, ScheduleStandIn, serve
from tests.controller.fake_k8s_api import FakeKubernetesAPI

S = common_pb2.CONTROL_KIND_SCHEDULE
pytestmark = pytest.mark.timeout(60)


@pytest.fixture
async def api():
    fake = FakeKubernetesAPI(token="t0k3n")
    fake.add_deployment("galaxy", "galaxy-schedule", 1)
    await fake.start()
    yield fake
    await fake.stop()


def actuator(api, token="t0k3n"):
    return KubernetesActuator(namespace="galaxy", api_url=api.url, token=token)


async def test_scale_out_patches_the_scale_subresource(api):
    act = actuator(api)
    try:
        assert await act.replicas("schedule") == 1
        assert await act.scale_out("schedule", 1, 3) == []  # the pods name themselves
        assert await act.replicas("schedule") == 3
        (patch,) = api.scale_patches()
        assert patch["path"] == "/apis/apps/v1/namespaces/galaxy/deployments/galaxy-schedule/scale"
        assert patch["content_type"].startswith("application/strategic-merge-patch+json")
        assert patch["body"] == {"spec": {"replicas": 3}}
        assert sorted(api.deployments[("galaxy", "galaxy-schedule")].pods) == [
            "galaxy-schedule-0",
            "galaxy-schedule-1",
            "galaxy-schedule-2",
        ]
    finally:
        await act.close()


async def test_scale_in_marks_the_drained_pod_so_exactly_it_is_removed(api):
    act = actuator(api)
    try:
        await act.scale_out("schedule", 1, 3)
        await act.scale_in("schedule", "galaxy-schedule-1", 2)
        pods = api.deployments[("galaxy", "galaxy-schedule")].pods
        assert sorted(pods) == ["galaxy-schedule-0", "galaxy-schedule-2"]
        pod_patch = next(r for r in api.requests if "/pods/" in r["path"])
        assert pod_patch["body"]["metadata"]["annotations"][DELETION_COST] == "-2147483648"
        # An id that is not a pod: still scales (the ReplicaSet picks a pod).
        await act.scale_in("schedule", "not-a-pod", 1)
        assert await act.replicas("schedule") == 1
    finally:
        await act.close()


async def test_errors_are_clear(api):
    act = actuator(api)
    bad_token = actuator(api, token="wrong")
    try:
        with pytest.raises(ActuatorError, match=r"404 .*galaxy/galaxy-dispatch"):
            await act.scale_out("dispatch", 1, 2)  # no such Deployment
        with pytest.raises(ActuatorError, match="401"):
            await bad_token.scale_out("schedule", 1, 2)
        assert api.deployments[("galaxy", "galaxy-schedule")].replicas == 1
    finally:
        await act.close()
        await bad_token.close()


@pytest.mark.slow
async def test_reconciler_scales_a_deployment_and_drains_before_scale_in(api):
    """The fake plays the kubelet: each new pod registers with the controller
    under its pod name; a deleted pod deregisters."""
    act = actuator(api)
    ctl = await Controller(act, t_sf=100.0, max_step_out=1, scale_out_cooldown_s=600.0).start()
    servers: dict[str, tuple] = {}
    loads: dict[str, float] = {}
    tasks: set[asyncio.Task] = set()

    async def pod_started(name: str) -> None:
        server, addr = await serve(
            schedule_pb2_grpc.add_ScheduleServicer_to_server,
            ScheduleStandIn(name),
            "galaxy.v1.Schedule",
        )
        servers[name] = (server, addr)
        async with ctl.pool.stub(ctl.address, controller_pb2_grpc.ControllerStub) as s:
            await s.RegisterInstance(common_pb2.ControlInstance(id=name, kind=S, address=addr))

    async def pod_deleted(name: str) -> None:
        server, addr = servers.pop(name)
        async with ctl.pool.stub(ctl.address, controller_pb2_grpc.ControllerStub) as s:
            await s.DeregisterInstance(common_pb2.ControlInstance(id=name, kind=S, address=addr))
        await server.stop(None)

    def on_pods(dep, names):
        for n in names:
            if n not in servers and n not in loads:
                loads[n] = 0.0
                tasks.add(asyncio.ensure_future(pod_started(n)))
        for n in list(servers):
            if n not in names:
                loads.pop(n, None)
                tasks.add(asyncio.ensure_future(pod_deleted(n)))

    async def report_forever():
        while True:
            for name, (_, addr) in list(servers.items()):
                me = common_pb2.ControlInstance(id=name, kind=S, address=addr)
                async with ctl.pool.stub(ctl.address, controller_pb2_grpc.ControllerStub) as s:
                    await s.ReportLoad(
                        controller_pb2.LoadReport(
                            instance=me, ops_per_second={"schedule": loads.get(name, 0.0)}
                        )
                    )
            await asyncio.sleep(0.1)  # periodic, like the host's reporter

    reporter = None
    try:
        await act.start(ctl.address)
        api.on_pods = on_pods
        on_pods(None, ["galaxy-schedule-0"])  # the existing pod registers
        await asyncio.gather(*tasks)
        reporter = asyncio.create_task(report_forever())
        loads["galaxy-schedule-0"] = 250.0
        ctl.reconciler.start()
        assert await ctl.changes.wait_for(lambda: len(ctl.registry.membership().instances) == 2, 20)
        await ctl.reconciler.wait_idle()
        assert ctl.reconciler.history[0].outcome == "done"
        assert [p["body"] for p in api.scale_patches()] == [{"spec": {"replicas": 2}}]
        # Load falls: galaxy-schedule-1 is drained, marked, and then removed.
        loads["galaxy-schedule-0"] = 0.0
        assert await ctl.changes.wait_for(lambda: "galaxy-schedule-1" not in servers, 30)
        await ctl.reconciler.wait_idle()
        assert sorted(api.deployments[("galaxy", "galaxy-schedule")].pods) == ["galaxy-schedule-0"]
        assert [p["body"] for p in api.scale_patches()][-1] == {"spec": {"replicas": 1}}
        assert ctl.reconciler.history[0].decision.code == "underload"
    finally:
        if reporter is not None:
            reporter.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await reporter
        await asyncio.gather(*tasks, return_exceptions=True)
        for server, _ in servers.values():
            await server.stop(None)
        await act.close()
        await ctl.stop()
