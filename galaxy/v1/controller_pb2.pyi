from galaxy.v1 import common_pb2 as _common_pb2
from galaxy.v1 import clustermgr_pb2 as _clustermgr_pb2
from galaxy.v1 import dispatch_pb2 as _dispatch_pb2
from google.protobuf.internal import containers as _containers
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class LoadReport(_message.Message):
    __slots__ = ("instance", "ops_per_second", "queue_depth", "errors")
    class OpsPerSecondEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: float
        def __init__(self, key: _Optional[str] = ..., value: _Optional[float] = ...) -> None: ...
    INSTANCE_FIELD_NUMBER: _ClassVar[int]
    OPS_PER_SECOND_FIELD_NUMBER: _ClassVar[int]
    QUEUE_DEPTH_FIELD_NUMBER: _ClassVar[int]
    ERRORS_FIELD_NUMBER: _ClassVar[int]
    instance: _common_pb2.ControlInstance
    ops_per_second: _containers.ScalarMap[str, float]
    queue_depth: int
    errors: int
    def __init__(self, instance: _Optional[_Union[_common_pb2.ControlInstance, _Mapping]] = ..., ops_per_second: _Optional[_Mapping[str, float]] = ..., queue_depth: _Optional[int] = ..., errors: _Optional[int] = ...) -> None: ...

class ReportLoadReply(_message.Message):
    __slots__ = ("membership_stale", "epoch")
    MEMBERSHIP_STALE_FIELD_NUMBER: _ClassVar[int]
    EPOCH_FIELD_NUMBER: _ClassVar[int]
    membership_stale: bool
    epoch: int
    def __init__(self, membership_stale: _Optional[bool] = ..., epoch: _Optional[int] = ...) -> None: ...

class GetMembershipRequest(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class DeployFunctionRequest(_message.Message):
    __slots__ = ("function",)
    FUNCTION_FIELD_NUMBER: _ClassVar[int]
    function: _common_pb2.FunctionSpec
    def __init__(self, function: _Optional[_Union[_common_pb2.FunctionSpec, _Mapping]] = ...) -> None: ...

class GetFunctionRequest(_message.Message):
    __slots__ = ("name",)
    NAME_FIELD_NUMBER: _ClassVar[int]
    name: str
    def __init__(self, name: _Optional[str] = ...) -> None: ...

class ListFunctionsRequest(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class ListFunctionsReply(_message.Message):
    __slots__ = ("functions",)
    FUNCTIONS_FIELD_NUMBER: _ClassVar[int]
    functions: _containers.RepeatedCompositeFieldContainer[_common_pb2.FunctionSpec]
    def __init__(self, functions: _Optional[_Iterable[_Union[_common_pb2.FunctionSpec, _Mapping]]] = ...) -> None: ...

class DeleteFunctionRequest(_message.Message):
    __slots__ = ("name",)
    NAME_FIELD_NUMBER: _ClassVar[int]
    name: str
    def __init__(self, name: _Optional[str] = ...) -> None: ...

class DeleteFunctionReply(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class GetClusterStatusRequest(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class ClusterStatus(_message.Message):
    __slots__ = ("membership", "nodes", "functions", "instances", "routing", "warnings")
    MEMBERSHIP_FIELD_NUMBER: _ClassVar[int]
    NODES_FIELD_NUMBER: _ClassVar[int]
    FUNCTIONS_FIELD_NUMBER: _ClassVar[int]
    INSTANCES_FIELD_NUMBER: _ClassVar[int]
    ROUTING_FIELD_NUMBER: _ClassVar[int]
    WARNINGS_FIELD_NUMBER: _ClassVar[int]
    membership: _common_pb2.Membership
    nodes: _containers.RepeatedCompositeFieldContainer[_clustermgr_pb2.ClusterNode]
    functions: _containers.RepeatedCompositeFieldContainer[_common_pb2.FunctionSpec]
    instances: _containers.RepeatedCompositeFieldContainer[_dispatch_pb2.InstanceState]
    routing: _containers.RepeatedCompositeFieldContainer[_dispatch_pb2.FunctionRouting]
    warnings: _containers.RepeatedScalarFieldContainer[str]
    def __init__(self, membership: _Optional[_Union[_common_pb2.Membership, _Mapping]] = ..., nodes: _Optional[_Iterable[_Union[_clustermgr_pb2.ClusterNode, _Mapping]]] = ..., functions: _Optional[_Iterable[_Union[_common_pb2.FunctionSpec, _Mapping]]] = ..., instances: _Optional[_Iterable[_Union[_dispatch_pb2.InstanceState, _Mapping]]] = ..., routing: _Optional[_Iterable[_Union[_dispatch_pb2.FunctionRouting, _Mapping]]] = ..., warnings: _Optional[_Iterable[str]] = ...) -> None: ...
