"""gRPC server reflection under both service names clients ask for:
``grpc.reflection.v1`` (grpcurl and current clients try it first) and
``grpc.reflection.v1alpha`` (older clients).

grpcio-reflection ships only the v1alpha servicer. The v1 protocol is the
same messages under another package (grpc/reflection/v1/reflection.proto
renamed the package and nothing else), so the one servicer answers both:
the v1 service reads and writes the v1alpha message classes, which have
the same wire form. The v1 file descriptor is derived from v1alpha's so
reflection can describe itself under either name.
"""

from __future__ import annotations

from collections.abc import Iterable

import grpc
from google.protobuf import descriptor_pb2, descriptor_pool
from grpc_reflection.v1alpha import reflection, reflection_pb2

V1_SERVICE = "grpc.reflection.v1.ServerReflection"
V1ALPHA_SERVICE = reflection.SERVICE_NAME
SERVICE_NAMES = (V1_SERVICE, V1ALPHA_SERVICE)
_V1_FILE = "grpc/reflection/v1/reflection.proto"


def _add_v1_descriptor(pool: descriptor_pool.DescriptorPool) -> None:
    """Register v1's file descriptor (v1alpha's, package renamed) once."""
    try:
        pool.FindFileByName(_V1_FILE)
        return
    except KeyError:
        pass
    fdp = descriptor_pb2.FileDescriptorProto()
    reflection_pb2.DESCRIPTOR.CopyToProto(fdp)
    old, new = f".{fdp.package}.", ".grpc.reflection.v1."
    fdp.name, fdp.package = _V1_FILE, "grpc.reflection.v1"
    for msg in fdp.message_type:
        for field in msg.field:
            if field.type_name.startswith(old):
                field.type_name = new + field.type_name[len(old) :]
    for svc in fdp.service:
        for m in svc.method:
            m.input_type = new + m.input_type[len(old) :]
            m.output_type = new + m.output_type[len(old) :]
    pool.Add(fdp)


def enable(service_names: Iterable[str], server: grpc.aio.Server) -> None:
    """Serve reflection of service_names (plus both reflection services)
    on server, under the v1 and the v1alpha names."""
    pool = descriptor_pool.Default()
    _add_v1_descriptor(pool)
    servicer = reflection.aio.ReflectionServicer([*SERVICE_NAMES, *service_names], pool=pool)
    handlers = {
        "ServerReflectionInfo": grpc.stream_stream_rpc_method_handler(
            servicer.ServerReflectionInfo,
            request_deserializer=reflection_pb2.ServerReflectionRequest.FromString,
            response_serializer=reflection_pb2.ServerReflectionResponse.SerializeToString,
        )
    }
    for name in SERVICE_NAMES:
        server.add_generic_rpc_handlers((grpc.method_handlers_generic_handler(name, handlers),))
