"""A recorded-contract fake of the Kubernetes API server.

No Kubernetes API server can run here, so the Kubernetes actuator is tested
against this fake. It is NOT a Kubernetes implementation: it serves only the
endpoints the actuator uses, with the request and response shapes recorded
from the real API (apps/v1 Deployment scale subresource, autoscaling/v1
Scale, core/v1 Pod metadata patch, meta/v1 Status errors):

* ``GET   /apis/apps/v1/namespaces/{ns}/deployments/{name}/scale``
* ``PATCH /apis/apps/v1/namespaces/{ns}/deployments/{name}/scale``
  (``application/strategic-merge-patch+json``, ``application/merge-patch+json``
  or ``application/json-patch+json``)
* ``PATCH /api/v1/namespaces/{ns}/pods/{name}`` (annotations only)

It behaves like the ReplicaSet controller in the one way the tests need:
scaling a Deployment up creates pods named ``{deployment}-{n}``, scaling down
deletes the pods with the lowest ``controller.kubernetes.io/pod-deletion-cost``
first. Every request is recorded in ``requests`` for assertions.
"""

from __future__ import annotations

import json
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from aiohttp import web

DELETION_COST = "controller.kubernetes.io/pod-deletion-cost"
PATCH_TYPES = (
    "application/strategic-merge-patch+json",
    "application/merge-patch+json",
    "application/json-patch+json",
)


@dataclass
class Deployment:
    namespace: str
    name: str
    replicas: int
    uid: str = field(default_factory=lambda: str(uuid.uuid4()))
    resource_version: int = 1
    pods: dict[str, dict[str, str]] = field(default_factory=dict)  # name -> annotations
    next_pod: int = 0


def _status(code: int, reason: str, message: str, details: dict[str, Any] | None = None):
    """A meta/v1 Status body, as the API server sends for errors."""
    body = {
        "kind": "Status",
        "apiVersion": "v1",
        "metadata": {},
        "status": "Failure",
        "message": message,
        "reason": reason,
        "code": code,
    }
    if details:
        body["details"] = details
    return web.json_response(body, status=code)


class FakeKubernetesAPI:
    """See the module docstring. on_pods(deployment, pod_names) is called
    after every change of a Deployment's pods."""

    def __init__(self, token: str | None = None) -> None:
        self.token = token
        self.deployments: dict[tuple[str, str], Deployment] = {}
        self.requests: list[dict[str, Any]] = []
        self.on_pods: Callable[[Deployment, list[str]], None] | None = None
        self._runner: web.AppRunner | None = None
        self.url = ""

    def add_deployment(self, namespace: str, name: str, replicas: int) -> Deployment:
        d = Deployment(namespace, name, 0)
        self.deployments[(namespace, name)] = d
        self._set_replicas(d, replicas)
        return d

    def scale_patches(self) -> list[dict[str, Any]]:
        """The recorded PATCH requests of scale subresources."""
        return [r for r in self.requests if r["method"] == "PATCH" and r["path"].endswith("/scale")]

    # -- server -------------------------------------------------------------

    async def start(self) -> str:
        app = web.Application(middlewares=[self._record])
        base = "/apis/apps/v1/namespaces/{ns}/deployments/{name}/scale"
        app.router.add_get(base, self._get_scale)
        app.router.add_patch(base, self._patch_scale)
        app.router.add_patch("/api/v1/namespaces/{ns}/pods/{name}", self._patch_pod)
        self._runner = web.AppRunner(app)
        await self._runner.setup()
        site = web.TCPSite(self._runner, "127.0.0.1", 0)
        await site.start()
        port = self._runner.addresses[0][1]
        self.url = f"http://127.0.0.1:{port}"
        return self.url

    async def stop(self) -> None:
        if self._runner is not None:
            await self._runner.cleanup()

    @web.middleware
    async def _record(self, request: web.Request, handler: Any) -> web.StreamResponse:
        body = await request.read()
        self.requests.append(
            {
                "method": request.method,
                "path": request.path,
                "content_type": request.headers.get("Content-Type", ""),
                "body": json.loads(body) if body else None,
            }
        )
        if (
            self.token is not None
            and request.headers.get("Authorization") != f"Bearer {self.token}"
        ):
            return _status(401, "Unauthorized", "Unauthorized")
        return await handler(request)  # type: ignore[no-any-return]

    # -- handlers -----------------------------------------------------------

    def _find(self, request: web.Request) -> Deployment | web.Response:
        ns, name = request.match_info["ns"], request.match_info["name"]
        d = self.deployments.get((ns, name))
        if d is None:
            return _status(
                404,
                "NotFound",
                f'deployments.apps "{name}" not found',
                {"name": name, "group": "apps", "kind": "deployments"},
            )
        return d

    @staticmethod
    def _scale(d: Deployment) -> dict[str, Any]:
        """An autoscaling/v1 Scale object."""
        return {
            "kind": "Scale",
            "apiVersion": "autoscaling/v1",
            "metadata": {
                "name": d.name,
                "namespace": d.namespace,
                "uid": d.uid,
                "resourceVersion": str(d.resource_version),
                "creationTimestamp": "2026-01-01T00:00:00Z",
            },
            "spec": {"replicas": d.replicas},
            "status": {"replicas": len(d.pods), "selector": f"app={d.name}"},
        }

    async def _get_scale(self, request: web.Request) -> web.Response:
        d = self._find(request)
        if isinstance(d, web.Response):
            return d
        return web.json_response(self._scale(d))

    async def _patch_scale(self, request: web.Request) -> web.Response:
        ctype = request.headers.get("Content-Type", "").split(";")[0].strip()
        if ctype not in PATCH_TYPES:
            return _status(
                415,
                "UnsupportedMediaType",
                "the body of the request was in an unknown format - accepted media types "
                f"include: {', '.join(PATCH_TYPES)}",
            )
        d = self._find(request)
        if isinstance(d, web.Response):
            return d
        body = await request.json()
        replicas: Any = None
        if ctype == "application/json-patch+json":
            for op in body:
                if op.get("path") == "/spec/replicas" and op.get("op") in ("replace", "add"):
                    replicas = op.get("value")
        else:
            replicas = (body.get("spec") or {}).get("replicas")
        if not isinstance(replicas, int) or replicas < 0:
            return _status(
                422,
                "Invalid",
                f'Scale.autoscaling "{d.name}" is invalid: spec.replicas: Invalid value: '
                f"{replicas!r}: must be greater than or equal to 0",
            )
        self._set_replicas(d, replicas)
        return web.json_response(self._scale(d))

    async def _patch_pod(self, request: web.Request) -> web.Response:
        ns, name = request.match_info["ns"], request.match_info["name"]
        for d in self.deployments.values():
            if d.namespace == ns and name in d.pods:
                body = await request.json()
                ann = ((body.get("metadata") or {}).get("annotations")) or {}
                d.pods[name].update({k: str(v) for k, v in ann.items()})
                return web.json_response(
                    {
                        "kind": "Pod",
                        "apiVersion": "v1",
                        "metadata": {"name": name, "namespace": ns, "annotations": d.pods[name]},
                    }
                )
        return _status(404, "NotFound", f'pods "{name}" not found', {"name": name, "kind": "pods"})

    def _set_replicas(self, d: Deployment, replicas: int) -> None:
        d.replicas = replicas
        d.resource_version += 1
        while len(d.pods) < replicas:
            d.pods[f"{d.name}-{d.next_pod}"] = {}
            d.next_pod += 1
        while len(d.pods) > replicas:
            # The ReplicaSet controller deletes the lowest deletion cost first.
            victim = min(d.pods, key=lambda p: int(d.pods[p].get(DELETION_COST, "0")))
            del d.pods[victim]
        if self.on_pods is not None:
            self.on_pods(d, list(d.pods))
