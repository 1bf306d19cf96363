"""Server reflection, v1 beside v1alpha, for the planner and the fleet.

grpcio-reflection (1.85) serves only `grpc.reflection.v1alpha.ServerReflection`. Reflection v1
(`grpc.reflection.v1.ServerReflection`, grpc/grpc-proto's grpc/reflection/v1/reflection.proto)
is the same protocol under another package: the same messages with the same field numbers, so
the same bytes on the wire. Clients built on newer grpc-go and protoreflect try v1 first. This
module registers v1 as a second name of the one v1alpha servicer, and describes it: the v1
file descriptor is derived from v1alpha's (package and type names changed), added to the
default pool, and listed with the other services.
"""

from __future__ import annotations

from collections.abc import Iterable

import grpc
from google.protobuf import descriptor, descriptor_pb2, descriptor_pool
from grpc_reflection.v1alpha import reflection, reflection_pb2, reflection_pb2_grpc

V1ALPHA_SERVICE = reflection.SERVICE_NAME
"""grpc.reflection.v1alpha.ServerReflection."""
V1_SERVICE = "grpc.reflection.v1.ServerReflection"
V1_FILE = "grpc/reflection/v1/reflection.proto"
_V1ALPHA_PACKAGE = ".grpc.reflection.v1alpha."
_V1_PACKAGE = ".grpc.reflection.v1."


def v1_file_descriptor() -> descriptor.FileDescriptor:
    """grpc/reflection/v1/reflection.proto in the default pool, added on the first call."""
    pool = descriptor_pool.Default()
    try:
        return pool.FindFileByName(V1_FILE)
    except KeyError:
        pass
    proto = descriptor_pb2.FileDescriptorProto()
    reflection_pb2.DESCRIPTOR.CopyToProto(proto)
    proto.name = V1_FILE
    proto.package = V1_SERVICE.rsplit(".", 1)[0]
    # v1alpha's options name its Java and Go packages; v1's are upstream's own.
    proto.options.Clear()
    proto.options.go_package = "google.golang.org/grpc/reflection/grpc_reflection_v1"
    proto.options.java_package = "io.grpc.reflection.v1"
    proto.options.java_multiple_files = True
    proto.options.java_outer_classname = "ServerReflectionProto"
    for message in proto.message_type:
        for field in message.field:
            if field.HasField("type_name"):  # proto2: assigning "" would set it
                field.type_name = _renamed(field.type_name)
    for service in proto.service:
        for method in service.method:
            method.input_type = _renamed(method.input_type)
            method.output_type = _renamed(method.output_type)
    pool.Add(proto)
    return pool.FindFileByName(V1_FILE)


def _renamed(type_name: str) -> str:
    """A v1alpha type's name in v1 (other names unchanged)."""
    if type_name.startswith(_V1ALPHA_PACKAGE):
        return _V1_PACKAGE + type_name.removeprefix(_V1ALPHA_PACKAGE)
    return type_name


def enable_reflection(server: grpc.aio.Server, service_names: Iterable[str]) -> tuple[str, ...]:
    """Serve reflection v1alpha and v1 on `server`, listing `service_names` and both.

    Returns:
        The names listed, in order.
    """
    assert v1_file_descriptor().services_by_name["ServerReflection"].full_name == V1_SERVICE
    names = (*service_names, V1ALPHA_SERVICE, V1_SERVICE)
    servicer = reflection.aio.ReflectionServicer(names)
    reflection_pb2_grpc.add_ServerReflectionServicer_to_server(servicer, server)
    # The same servicer under v1's name; v1alpha's message classes read and write v1's bytes
    # (identical wire format).
    v1 = grpc.stream_stream_rpc_method_handler(
        servicer.ServerReflectionInfo,
        request_deserializer=reflection_pb2.ServerReflectionRequest.FromString,
        response_serializer=reflection_pb2.ServerReflectionResponse.SerializeToString,
    )
    server.add_generic_rpc_handlers(
        (grpc.method_handlers_generic_handler(V1_SERVICE, {"ServerReflectionInfo": v1}),)
    )
    return names
