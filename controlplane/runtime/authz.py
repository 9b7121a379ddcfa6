"""Who may call which RPC, by the identity in the caller's certificate (pure).

With mutual TLS every caller presents a certificate whose identity is
``spiffe://galaxy/ID`` (``controlplane.runtime.tls``): a component (its kind)
or a client (``client/NAME``). Internal RPCs (the ones that start or kill
instances, change membership or routing tables) accept components only, so
no client certificate can call ``NodeAgent.CreateInstance``,
``Dispatch.ModInstance`` or ``Controller.RegisterInstance``. The public API
(deploy, invoke, status) accepts any certificate of the cluster's CA;
with tokens on, the caller's role then decides (controlplane.runtime.access).
"""

from __future__ import annotations

from controlplane.runtime.tls import COMPONENTS

#: Methods any holder of a cluster certificate may call, by service.
PUBLIC: dict[str, frozenset[str]] = {
    "galaxy.v1.Controller": frozenset(
        {
            "DeployFunction",
            "GetFunction",
            "ListFunctions",
            "DeleteFunction",
            "GetClusterStatus",
            "GetMembership",
            "ListRevisions",
            "SetTraffic",
            "CreateToken",
            "ListTokens",
            "DeleteToken",
            "PutRuntime",
            "GetRuntime",
            "ListRuntimes",
            "DeleteRuntime",
            "ApplyGraph",
            "GetGraph",
            "ListGraphs",
            "DeleteGraph",
        }
    ),
    # ListInstances is read-only: what `galaxy status` shows anyway.
    "galaxy.v1.Dispatch": frozenset({"Dispatch", "DispatchStream", "Release", "ListInstances"}),
    # Warm-up (`galaxy models warm`): fills a node's model cache as a start
    # would; admins only (controlplane.runtime.access).
    "galaxy.v1.NodeAgent": frozenset({"WarmModel"}),
    # Standard services: probes and tooling (grpcurl) need them.
    "grpc.health.v1.Health": frozenset({"Check", "Watch"}),
    "grpc.reflection.v1alpha.ServerReflection": frozenset({"ServerReflectionInfo"}),
    "grpc.reflection.v1.ServerReflection": frozenset({"ServerReflectionInfo"}),
}

_COMPONENTS = frozenset(COMPONENTS)


def split_method(method: str) -> tuple[str, str]:
    """("galaxy.v1.Dispatch", "Dispatch") from "/galaxy.v1.Dispatch/Dispatch"."""
    service, _, name = method.lstrip("/").partition("/")
    return service, name


def is_component(identity: str | None) -> bool:
    """True for a control plane component's certificate."""
    return identity in _COMPONENTS


def allowed(method: str, identity: str | None) -> bool:
    """May identity call method? Components may call everything; others
    only the public methods. No identity (no verified certificate) may call
    nothing: with TLS on the handshake already refused such a caller."""
    if identity is None:
        return False
    if is_component(identity):
        return True
    service, name = split_method(method)
    return name in PUBLIC.get(service, frozenset())
