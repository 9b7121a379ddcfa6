from galaxy.v1 import common_pb2 as _common_pb2
from google.protobuf.internal import containers as _containers
from google.protobuf.internal import enum_type_wrapper as _enum_type_wrapper
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class ScheduleRequest(_message.Message):
    __slots__ = ("instance_id", "function", "notify_address")
    INSTANCE_ID_FIELD_NUMBER: _ClassVar[int]
    FUNCTION_FIELD_NUMBER: _ClassVar[int]
    NOTIFY_ADDRESS_FIELD_NUMBER: _ClassVar[int]
    instance_id: str
    function: _common_pb2.FunctionSpec
    notify_address: str
    def __init__(self, instance_id: _Optional[str] = ..., function: _Optional[_Union[_common_pb2.FunctionSpec, _Mapping]] = ..., notify_address: _Optional[str] = ...) -> None: ...

class ScheduleReply(_message.Message):
    __slots__ = ("instance", "schedule_id", "probes", "scheduling_ms")
    INSTANCE_FIELD_NUMBER: _ClassVar[int]
    SCHEDULE_ID_FIELD_NUMBER: _ClassVar[int]
    PROBES_FIELD_NUMBER: _ClassVar[int]
    SCHEDULING_MS_FIELD_NUMBER: _ClassVar[int]
    instance: _common_pb2.InstanceInfo
    schedule_id: str
    probes: int
    scheduling_ms: float
    def __init__(self, instance: _Optional[_Union[_common_pb2.InstanceInfo, _Mapping]] = ..., schedule_id: _Optional[str] = ..., probes: _Optional[int] = ..., scheduling_ms: _Optional[float] = ...) -> None: ...

class ModNodeRequest(_message.Message):
    __slots__ = ("op", "node")
    class Op(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
        __slots__ = ()
        OP_UNSPECIFIED: _ClassVar[ModNodeRequest.Op]
        OP_UPSERT: _ClassVar[ModNodeRequest.Op]
        OP_REMOVE: _ClassVar[ModNodeRequest.Op]
    OP_UNSPECIFIED: ModNodeRequest.Op
    OP_UPSERT: ModNodeRequest.Op
    OP_REMOVE: ModNodeRequest.Op
    OP_FIELD_NUMBER: _ClassVar[int]
    NODE_FIELD_NUMBER: _ClassVar[int]
    op: ModNodeRequest.Op
    node: _common_pb2.NodeStatus
    def __init__(self, op: _Optional[_Union[ModNodeRequest.Op, str]] = ..., node: _Optional[_Union[_common_pb2.NodeStatus, _Mapping]] = ...) -> None: ...

class ModNodeReply(_message.Message):
    __slots__ = ("changed",)
    CHANGED_FIELD_NUMBER: _ClassVar[int]
    changed: bool
    def __init__(self, changed: _Optional[bool] = ...) -> None: ...

class ModNodesRequest(_message.Message):
    __slots__ = ("changes",)
    CHANGES_FIELD_NUMBER: _ClassVar[int]
    changes: _containers.RepeatedCompositeFieldContainer[ModNodeRequest]
    def __init__(self, changes: _Optional[_Iterable[_Union[ModNodeRequest, _Mapping]]] = ...) -> None: ...

class ModNodesReply(_message.Message):
    __slots__ = ("changed",)
    CHANGED_FIELD_NUMBER: _ClassVar[int]
    changed: _containers.RepeatedScalarFieldContainer[bool]
    def __init__(self, changed: _Optional[_Iterable[bool]] = ...) -> None: ...

class ListNodesRequest(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class ListNodesReply(_message.Message):
    __slots__ = ("schedule_id", "nodes")
    SCHEDULE_ID_FIELD_NUMBER: _ClassVar[int]
    NODES_FIELD_NUMBER: _ClassVar[int]
    schedule_id: str
    nodes: _containers.RepeatedCompositeFieldContainer[_common_pb2.NodeStatus]
    def __init__(self, schedule_id: _Optional[str] = ..., nodes: _Optional[_Iterable[_Union[_common_pb2.NodeStatus, _Mapping]]] = ...) -> None: ...

class CreditUse(_message.Message):
    __slots__ = ("credit_id", "resources", "node_seq")
    CREDIT_ID_FIELD_NUMBER: _ClassVar[int]
    RESOURCES_FIELD_NUMBER: _ClassVar[int]
    NODE_SEQ_FIELD_NUMBER: _ClassVar[int]
    credit_id: str
    resources: _common_pb2.Resources
    node_seq: int
    def __init__(self, credit_id: _Optional[str] = ..., resources: _Optional[_Union[_common_pb2.Resources, _Mapping]] = ..., node_seq: _Optional[int] = ...) -> None: ...

class CreditReturn(_message.Message):
    __slots__ = ("credit_id", "refused")
    CREDIT_ID_FIELD_NUMBER: _ClassVar[int]
    REFUSED_FIELD_NUMBER: _ClassVar[int]
    credit_id: str
    refused: bool
    def __init__(self, credit_id: _Optional[str] = ..., refused: _Optional[bool] = ...) -> None: ...

class Credit(_message.Message):
    __slots__ = ("credit_id", "node_id", "node_address", "resources", "ttl_ms")
    CREDIT_ID_FIELD_NUMBER: _ClassVar[int]
    NODE_ID_FIELD_NUMBER: _ClassVar[int]
    NODE_ADDRESS_FIELD_NUMBER: _ClassVar[int]
    RESOURCES_FIELD_NUMBER: _ClassVar[int]
    TTL_MS_FIELD_NUMBER: _ClassVar[int]
    credit_id: str
    node_id: str
    node_address: str
    resources: _common_pb2.Resources
    ttl_ms: int
    def __init__(self, credit_id: _Optional[str] = ..., node_id: _Optional[str] = ..., node_address: _Optional[str] = ..., resources: _Optional[_Union[_common_pb2.Resources, _Mapping]] = ..., ttl_ms: _Optional[int] = ...) -> None: ...

class GrantCreditsRequest(_message.Message):
    __slots__ = ("holder", "used", "returned", "want")
    HOLDER_FIELD_NUMBER: _ClassVar[int]
    USED_FIELD_NUMBER: _ClassVar[int]
    RETURNED_FIELD_NUMBER: _ClassVar[int]
    WANT_FIELD_NUMBER: _ClassVar[int]
    holder: str
    used: _containers.RepeatedCompositeFieldContainer[CreditUse]
    returned: _containers.RepeatedCompositeFieldContainer[CreditReturn]
    want: int
    def __init__(self, holder: _Optional[str] = ..., used: _Optional[_Iterable[_Union[CreditUse, _Mapping]]] = ..., returned: _Optional[_Iterable[_Union[CreditReturn, _Mapping]]] = ..., want: _Optional[int] = ...) -> None: ...

class GrantCreditsReply(_message.Message):
    __slots__ = ("schedule_id", "credits")
    SCHEDULE_ID_FIELD_NUMBER: _ClassVar[int]
    CREDITS_FIELD_NUMBER: _ClassVar[int]
    schedule_id: str
    credits: _containers.RepeatedCompositeFieldContainer[Credit]
    def __init__(self, schedule_id: _Optional[str] = ..., credits: _Optional[_Iterable[_Union[Credit, _Mapping]]] = ...) -> None: ...
