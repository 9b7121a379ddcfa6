from galaxy.v1 import common_pb2 as _common_pb2
from google.protobuf.internal import containers as _containers
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class WarmModelRequest(_message.Message):
    __slots__ = ("node_id", "model")
    NODE_ID_FIELD_NUMBER: _ClassVar[int]
    MODEL_FIELD_NUMBER: _ClassVar[int]
    node_id: str
    model: _common_pb2.ModelRef
    def __init__(self, node_id: _Optional[str] = ..., model: _Optional[_Union[_common_pb2.ModelRef, _Mapping]] = ...) -> None: ...

class WarmModelReply(_message.Message):
    __slots__ = ("tier", "fetched", "seconds")
    TIER_FIELD_NUMBER: _ClassVar[int]
    FETCHED_FIELD_NUMBER: _ClassVar[int]
    SECONDS_FIELD_NUMBER: _ClassVar[int]
    tier: str
    fetched: bool
    seconds: float
    def __init__(self, tier: _Optional[str] = ..., fetched: _Optional[bool] = ..., seconds: _Optional[float] = ...) -> None: ...

class InstanceStreamRequest(_message.Message):
    __slots__ = ("seq", "timeout_ms", "create", "delete", "more")
    SEQ_FIELD_NUMBER: _ClassVar[int]
    TIMEOUT_MS_FIELD_NUMBER: _ClassVar[int]
    CREATE_FIELD_NUMBER: _ClassVar[int]
    DELETE_FIELD_NUMBER: _ClassVar[int]
    MORE_FIELD_NUMBER: _ClassVar[int]
    seq: int
    timeout_ms: int
    create: CreateInstanceRequest
    delete: DeleteInstanceRequest
    more: _containers.RepeatedCompositeFieldContainer[InstanceStreamRequest]
    def __init__(self, seq: _Optional[int] = ..., timeout_ms: _Optional[int] = ..., create: _Optional[_Union[CreateInstanceRequest, _Mapping]] = ..., delete: _Optional[_Union[DeleteInstanceRequest, _Mapping]] = ..., more: _Optional[_Iterable[_Union[InstanceStreamRequest, _Mapping]]] = ...) -> None: ...

class InstanceStreamReply(_message.Message):
    __slots__ = ("seq", "code", "message", "created", "deleted", "goaway", "more")
    SEQ_FIELD_NUMBER: _ClassVar[int]
    CODE_FIELD_NUMBER: _ClassVar[int]
    MESSAGE_FIELD_NUMBER: _ClassVar[int]
    CREATED_FIELD_NUMBER: _ClassVar[int]
    DELETED_FIELD_NUMBER: _ClassVar[int]
    GOAWAY_FIELD_NUMBER: _ClassVar[int]
    MORE_FIELD_NUMBER: _ClassVar[int]
    seq: int
    code: int
    message: str
    created: CreateInstanceReply
    deleted: DeleteInstanceReply
    goaway: bool
    more: _containers.RepeatedCompositeFieldContainer[InstanceStreamReply]
    def __init__(self, seq: _Optional[int] = ..., code: _Optional[int] = ..., message: _Optional[str] = ..., created: _Optional[_Union[CreateInstanceReply, _Mapping]] = ..., deleted: _Optional[_Union[DeleteInstanceReply, _Mapping]] = ..., goaway: _Optional[bool] = ..., more: _Optional[_Iterable[_Union[InstanceStreamReply, _Mapping]]] = ...) -> None: ...

class CreateInstanceRequest(_message.Message):
    __slots__ = ("node_id", "instance_id", "function", "notify_address")
    NODE_ID_FIELD_NUMBER: _ClassVar[int]
    INSTANCE_ID_FIELD_NUMBER: _ClassVar[int]
    FUNCTION_FIELD_NUMBER: _ClassVar[int]
    NOTIFY_ADDRESS_FIELD_NUMBER: _ClassVar[int]
    node_id: str
    instance_id: str
    function: _common_pb2.FunctionSpec
    notify_address: str
    def __init__(self, node_id: _Optional[str] = ..., instance_id: _Optional[str] = ..., function: _Optional[_Union[_common_pb2.FunctionSpec, _Mapping]] = ..., notify_address: _Optional[str] = ...) -> None: ...

class CreateInstanceReply(_message.Message):
    __slots__ = ("instance", "startup_ms", "node_seq")
    INSTANCE_FIELD_NUMBER: _ClassVar[int]
    STARTUP_MS_FIELD_NUMBER: _ClassVar[int]
    NODE_SEQ_FIELD_NUMBER: _ClassVar[int]
    instance: _common_pb2.InstanceInfo
    startup_ms: float
    node_seq: int
    def __init__(self, instance: _Optional[_Union[_common_pb2.InstanceInfo, _Mapping]] = ..., startup_ms: _Optional[float] = ..., node_seq: _Optional[int] = ...) -> None: ...

class DeleteInstanceRequest(_message.Message):
    __slots__ = ("node_id", "instance_id")
    NODE_ID_FIELD_NUMBER: _ClassVar[int]
    INSTANCE_ID_FIELD_NUMBER: _ClassVar[int]
    node_id: str
    instance_id: str
    def __init__(self, node_id: _Optional[str] = ..., instance_id: _Optional[str] = ...) -> None: ...

class DeleteInstanceReply(_message.Message):
    __slots__ = ("deleted",)
    DELETED_FIELD_NUMBER: _ClassVar[int]
    deleted: bool
    def __init__(self, deleted: _Optional[bool] = ...) -> None: ...

class ProbeRequest(_message.Message):
    __slots__ = ("node_id",)
    NODE_ID_FIELD_NUMBER: _ClassVar[int]
    node_id: str
    def __init__(self, node_id: _Optional[str] = ...) -> None: ...

class ProbeReply(_message.Message):
    __slots__ = ("status",)
    STATUS_FIELD_NUMBER: _ClassVar[int]
    status: _common_pb2.NodeStatus
    def __init__(self, status: _Optional[_Union[_common_pb2.NodeStatus, _Mapping]] = ...) -> None: ...

class ListNodeInstancesRequest(_message.Message):
    __slots__ = ("node_id",)
    NODE_ID_FIELD_NUMBER: _ClassVar[int]
    node_id: str
    def __init__(self, node_id: _Optional[str] = ...) -> None: ...

class ListNodeInstancesReply(_message.Message):
    __slots__ = ("instances",)
    INSTANCES_FIELD_NUMBER: _ClassVar[int]
    instances: _containers.RepeatedCompositeFieldContainer[_common_pb2.InstanceInfo]
    def __init__(self, instances: _Optional[_Iterable[_Union[_common_pb2.InstanceInfo, _Mapping]]] = ...) -> None: ...
