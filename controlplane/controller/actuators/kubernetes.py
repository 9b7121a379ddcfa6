"""Kubernetes actuator: each control function kind is a Deployment.

The controller owns the replica counts of the Deployments (for example
``galaxy-dispatch``, ``galaxy-schedule``, ``galaxy-clustermgr``) and changes
them through the scale subresource (``PATCH
/apis/apps/v1/namespaces/NS/deployments/NAME/scale``) with the asyncio
client ``kubernetes_asyncio`` (optional extra ``k8s``). Pods must register
with their pod name as instance id (``--id $(POD_NAME)`` from the downward
API): before scaling in, the drained pod is marked with the lowest
``controller.kubernetes.io/pod-deletion-cost`` so that the ReplicaSet
removes that pod and not another one.

Tested against a recorded-contract fake API server
(``tests/controller/fake_k8s_api.py``) because no API server runs here.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Mapping, Sequence
from typing import Any

from controlplane.controller.actuators.base import Actuator, ActuatorError

log = logging.getLogger(__name__)

DELETION_COST = "controller.kubernetes.io/pod-deletion-cost"
DEFAULT_DEPLOYMENTS = {k: f"galaxy-{k}" for k in ("dispatch", "schedule", "clustermgr")}


def _import() -> Any:
    try:
        import kubernetes_asyncio
    except ImportError as e:  # pragma: no cover - depends on the extra
        raise ActuatorError(
            "the Kubernetes actuator needs kubernetes_asyncio: "
            "pip install 'galaxy-controlplane[k8s]'"
        ) from e
    return kubernetes_asyncio


class KubernetesActuator(Actuator):
    """Scales Deployments through the scale subresource.

    api_url: API server URL; None means in-cluster configuration (service
    account token and CA of the pod). token: bearer token for api_url.
    deployments: Deployment name per kind.
    """

    name = "kubernetes"
    external = True

    def __init__(
        self,
        *,
        namespace: str = "default",
        api_url: str | None = None,
        token: str | None = None,
        deployments: Mapping[str, str] | None = None,
        verify_ssl: bool = True,
        timeout_s: float = 10.0,
    ) -> None:
        self.namespace = namespace
        self.api_url = api_url
        self.token = token
        self.deployments = {**DEFAULT_DEPLOYMENTS, **(deployments or {})}
        self.verify_ssl = verify_ssl
        self.timeout_s = timeout_s
        self._client: Any = None

    async def start(self, controller_address: str) -> None:
        """Load the client library and configuration now: importing it takes
        a while, and must not stall the event loop of a leader later."""
        await asyncio.to_thread(_import)
        await self._api()

    async def ensure(self, kind: str, desired: int) -> None:
        """Set the Deployment to desired replicas unless it already is."""
        if await self.replicas(kind) != desired:
            await self._set_replicas(kind, desired)

    async def _api(self) -> Any:
        if self._client is None:
            k8s = _import()
            cfg = k8s.client.Configuration()
            if self.api_url:
                cfg.host = self.api_url.rstrip("/")
                cfg.verify_ssl = self.verify_ssl
                if self.token:
                    cfg.api_key = {"BearerToken": self.token}
                    cfg.api_key_prefix = {"BearerToken": "Bearer"}
            else:
                k8s.config.load_incluster_config(client_configuration=cfg)
            self._client = k8s.client.ApiClient(configuration=cfg)
        return self._client

    def _deployment(self, kind: str) -> str:
        name = self.deployments.get(kind)
        if not name:
            raise ActuatorError(f"no Deployment configured for {kind}")
        return name

    async def replicas(self, kind: str) -> int:
        """The Deployment's desired replica count (spec.replicas of its scale)."""
        k8s = _import()
        apps = k8s.client.AppsV1Api(await self._api())
        try:
            scale = await apps.read_namespaced_deployment_scale(
                self._deployment(kind), self.namespace, _request_timeout=self.timeout_s
            )
        except k8s.client.exceptions.ApiException as e:
            raise ActuatorError(self._describe(kind, e)) from None
        return int(scale.spec.replicas or 0)

    async def _set_replicas(self, kind: str, replicas: int) -> None:
        k8s = _import()
        apps = k8s.client.AppsV1Api(await self._api())
        name = self._deployment(kind)
        try:
            scale = await apps.patch_namespaced_deployment_scale(
                name,
                self.namespace,
                {"spec": {"replicas": replicas}},
                _request_timeout=self.timeout_s,
            )
        except k8s.client.exceptions.ApiException as e:
            raise ActuatorError(self._describe(kind, e)) from None
        log.info("deployment %s/%s scaled to %s", self.namespace, name, scale.spec.replicas)

    def _describe(self, kind: str, e: Any) -> str:
        return (
            f"Kubernetes API {e.status} {e.reason} for deployment "
            f"{self.namespace}/{self.deployments.get(kind)}: {e.body or ''}".strip()
        )

    async def scale_out(self, kind: str, current: int, desired: int) -> list[str]:
        """Set the Deployment to desired replicas; the pods name themselves."""
        await self._set_replicas(kind, desired)
        return []

    def removable(self, kind: str, registered: Sequence[str]) -> list[str]:
        """Every registered pod of the kind, last by name first."""
        return sorted(registered, reverse=True)

    async def scale_in(self, kind: str, instance_id: str, desired: int) -> None:
        """Mark the drained pod cheapest to delete, then lower the replicas."""
        k8s = _import()
        core = k8s.client.CoreV1Api(await self._api())
        body = {"metadata": {"annotations": {DELETION_COST: "-2147483648"}}}
        try:
            await core.patch_namespaced_pod(
                instance_id, self.namespace, body, _request_timeout=self.timeout_s
            )
        except k8s.client.exceptions.ApiException as e:
            # Not a pod name (ids not from the downward API): the ReplicaSet
            # then picks the pod itself; the drained one is only preferred.
            log.warning("cannot mark pod %s for deletion: %s %s", instance_id, e.status, e.reason)
        await self._set_replicas(kind, desired)

    async def close(self) -> None:
        """Close the HTTP session."""
        if self._client is not None:
            await self._client.close()
            self._client = None
