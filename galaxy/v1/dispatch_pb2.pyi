from galaxy.v1 import common_pb2 as _common_pb2
from google.protobuf.internal import containers as _containers
from google.protobuf.internal import enum_type_wrapper as _enum_type_wrapper
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class DispatchRequest(_message.Message):
    __slots__ = ("function", "request_id", "forwarded", "releases", "tag", "hold", "hint")
    FUNCTION_FIELD_NUMBER: _ClassVar[int]
    REQUEST_ID_FIELD_NUMBER: _ClassVar[int]
    FORWARDED_FIELD_NUMBER: _ClassVar[int]
    RELEASES_FIELD_NUMBER: _ClassVar[int]
    TAG_FIELD_NUMBER: _ClassVar[int]
    HOLD_FIELD_NUMBER: _ClassVar[int]
    HINT_FIELD_NUMBER: _ClassVar[int]
    function: str
    request_id: str
    forwarded: bool
    releases: _containers.RepeatedCompositeFieldContainer[ReleaseRequest]
    tag: str
    hold: bool
    hint: RoutingHint
    def __init__(self, function: _Optional[str] = ..., request_id: _Optional[str] = ..., forwarded: _Optional[bool] = ..., releases: _Optional[_Iterable[_Union[ReleaseRequest, _Mapping]]] = ..., tag: _Optional[str] = ..., hold: _Optional[bool] = ..., hint: _Optional[_Union[RoutingHint, _Mapping]] = ...) -> None: ...

class RoutingHint(_message.Message):
    __slots__ = ("prefix_blocks", "adapter", "decode_node", "prompt_tokens", "pd", "priority")
    PREFIX_BLOCKS_FIELD_NUMBER: _ClassVar[int]
    ADAPTER_FIELD_NUMBER: _ClassVar[int]
    DECODE_NODE_FIELD_NUMBER: _ClassVar[int]
    PROMPT_TOKENS_FIELD_NUMBER: _ClassVar[int]
    PD_FIELD_NUMBER: _ClassVar[int]
    PRIORITY_FIELD_NUMBER: _ClassVar[int]
    prefix_blocks: _containers.RepeatedScalarFieldContainer[str]
    adapter: str
    decode_node: str
    prompt_tokens: int
    pd: _common_pb2.PdSpec
    priority: int
    def __init__(self, prefix_blocks: _Optional[_Iterable[str]] = ..., adapter: _Optional[str] = ..., decode_node: _Optional[str] = ..., prompt_tokens: _Optional[int] = ..., pd: _Optional[_Union[_common_pb2.PdSpec, _Mapping]] = ..., priority: _Optional[int] = ...) -> None: ...

class DispatchStreamRequest(_message.Message):
    __slots__ = ("seq", "request", "timeout_ms", "cancel", "releases", "more")
    SEQ_FIELD_NUMBER: _ClassVar[int]
    REQUEST_FIELD_NUMBER: _ClassVar[int]
    TIMEOUT_MS_FIELD_NUMBER: _ClassVar[int]
    CANCEL_FIELD_NUMBER: _ClassVar[int]
    RELEASES_FIELD_NUMBER: _ClassVar[int]
    MORE_FIELD_NUMBER: _ClassVar[int]
    seq: int
    request: DispatchRequest
    timeout_ms: int
    cancel: bool
    releases: _containers.RepeatedCompositeFieldContainer[ReleaseRequest]
    more: _containers.RepeatedCompositeFieldContainer[DispatchStreamRequest]
    def __init__(self, seq: _Optional[int] = ..., request: _Optional[_Union[DispatchRequest, _Mapping]] = ..., timeout_ms: _Optional[int] = ..., cancel: _Optional[bool] = ..., releases: _Optional[_Iterable[_Union[ReleaseRequest, _Mapping]]] = ..., more: _Optional[_Iterable[_Union[DispatchStreamRequest, _Mapping]]] = ...) -> None: ...

class DispatchStreamReply(_message.Message):
    __slots__ = ("seq", "addr", "code", "message", "goaway", "more")
    SEQ_FIELD_NUMBER: _ClassVar[int]
    ADDR_FIELD_NUMBER: _ClassVar[int]
    CODE_FIELD_NUMBER: _ClassVar[int]
    MESSAGE_FIELD_NUMBER: _ClassVar[int]
    GOAWAY_FIELD_NUMBER: _ClassVar[int]
    MORE_FIELD_NUMBER: _ClassVar[int]
    seq: int
    addr: InstanceAddr
    code: int
    message: str
    goaway: bool
    more: _containers.RepeatedCompositeFieldContainer[DispatchStreamReply]
    def __init__(self, seq: _Optional[int] = ..., addr: _Optional[_Union[InstanceAddr, _Mapping]] = ..., code: _Optional[int] = ..., message: _Optional[str] = ..., goaway: _Optional[bool] = ..., more: _Optional[_Iterable[_Union[DispatchStreamReply, _Mapping]]] = ...) -> None: ...

class InstanceAddr(_message.Message):
    __slots__ = ("function", "instance_id", "address", "node_id", "lease_id", "cold_start", "wait_ms", "lease_ttl_ms", "hold_ms", "namespace", "lease_token", "pd")
    FUNCTION_FIELD_NUMBER: _ClassVar[int]
    INSTANCE_ID_FIELD_NUMBER: _ClassVar[int]
    ADDRESS_FIELD_NUMBER: _ClassVar[int]
    NODE_ID_FIELD_NUMBER: _ClassVar[int]
    LEASE_ID_FIELD_NUMBER: _ClassVar[int]
    COLD_START_FIELD_NUMBER: _ClassVar[int]
    WAIT_MS_FIELD_NUMBER: _ClassVar[int]
    LEASE_TTL_MS_FIELD_NUMBER: _ClassVar[int]
    HOLD_MS_FIELD_NUMBER: _ClassVar[int]
    NAMESPACE_FIELD_NUMBER: _ClassVar[int]
    LEASE_TOKEN_FIELD_NUMBER: _ClassVar[int]
    PD_FIELD_NUMBER: _ClassVar[int]
    function: str
    instance_id: str
    address: str
    node_id: str
    lease_id: str
    cold_start: bool
    wait_ms: float
    lease_ttl_ms: int
    hold_ms: int
    namespace: str
    lease_token: str
    pd: _common_pb2.PdSpec
    def __init__(self, function: _Optional[str] = ..., instance_id: _Optional[str] = ..., address: _Optional[str] = ..., node_id: _Optional[str] = ..., lease_id: _Optional[str] = ..., cold_start: _Optional[bool] = ..., wait_ms: _Optional[float] = ..., lease_ttl_ms: _Optional[int] = ..., hold_ms: _Optional[int] = ..., namespace: _Optional[str] = ..., lease_token: _Optional[str] = ..., pd: _Optional[_Union[_common_pb2.PdSpec, _Mapping]] = ...) -> None: ...

class ReleaseRequest(_message.Message):
    __slots__ = ("function", "lease_id", "forwarded")
    FUNCTION_FIELD_NUMBER: _ClassVar[int]
    LEASE_ID_FIELD_NUMBER: _ClassVar[int]
    FORWARDED_FIELD_NUMBER: _ClassVar[int]
    function: str
    lease_id: str
    forwarded: bool
    def __init__(self, function: _Optional[str] = ..., lease_id: _Optional[str] = ..., forwarded: _Optional[bool] = ...) -> None: ...

class ReleaseReply(_message.Message):
    __slots__ = ("released",)
    RELEASED_FIELD_NUMBER: _ClassVar[int]
    released: bool
    def __init__(self, released: _Optional[bool] = ...) -> None: ...

class ModInstanceRequest(_message.Message):
    __slots__ = ("op", "instance", "reason", "active_leases")
    class Op(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
        __slots__ = ()
        OP_UNSPECIFIED: _ClassVar[ModInstanceRequest.Op]
        OP_ADD: _ClassVar[ModInstanceRequest.Op]
        OP_REMOVE: _ClassVar[ModInstanceRequest.Op]
    OP_UNSPECIFIED: ModInstanceRequest.Op
    OP_ADD: ModInstanceRequest.Op
    OP_REMOVE: ModInstanceRequest.Op
    OP_FIELD_NUMBER: _ClassVar[int]
    INSTANCE_FIELD_NUMBER: _ClassVar[int]
    REASON_FIELD_NUMBER: _ClassVar[int]
    ACTIVE_LEASES_FIELD_NUMBER: _ClassVar[int]
    op: ModInstanceRequest.Op
    instance: _common_pb2.InstanceInfo
    reason: str
    active_leases: _containers.RepeatedScalarFieldContainer[str]
    def __init__(self, op: _Optional[_Union[ModInstanceRequest.Op, str]] = ..., instance: _Optional[_Union[_common_pb2.InstanceInfo, _Mapping]] = ..., reason: _Optional[str] = ..., active_leases: _Optional[_Iterable[str]] = ...) -> None: ...

class ModInstanceReply(_message.Message):
    __slots__ = ("changed",)
    CHANGED_FIELD_NUMBER: _ClassVar[int]
    changed: bool
    def __init__(self, changed: _Optional[bool] = ...) -> None: ...

class ListInstancesRequest(_message.Message):
    __slots__ = ("function",)
    FUNCTION_FIELD_NUMBER: _ClassVar[int]
    function: str
    def __init__(self, function: _Optional[str] = ...) -> None: ...

class InstanceState(_message.Message):
    __slots__ = ("instance", "in_flight", "draining", "asleep")
    INSTANCE_FIELD_NUMBER: _ClassVar[int]
    IN_FLIGHT_FIELD_NUMBER: _ClassVar[int]
    DRAINING_FIELD_NUMBER: _ClassVar[int]
    ASLEEP_FIELD_NUMBER: _ClassVar[int]
    instance: _common_pb2.InstanceInfo
    in_flight: int
    draining: bool
    asleep: bool
    def __init__(self, instance: _Optional[_Union[_common_pb2.InstanceInfo, _Mapping]] = ..., in_flight: _Optional[int] = ..., draining: _Optional[bool] = ..., asleep: _Optional[bool] = ...) -> None: ...

class FunctionRouting(_message.Message):
    __slots__ = ("function", "waiting", "pending", "start_failures", "start_error", "backoff_ms")
    FUNCTION_FIELD_NUMBER: _ClassVar[int]
    WAITING_FIELD_NUMBER: _ClassVar[int]
    PENDING_FIELD_NUMBER: _ClassVar[int]
    START_FAILURES_FIELD_NUMBER: _ClassVar[int]
    START_ERROR_FIELD_NUMBER: _ClassVar[int]
    BACKOFF_MS_FIELD_NUMBER: _ClassVar[int]
    function: str
    waiting: int
    pending: int
    start_failures: int
    start_error: str
    backoff_ms: float
    def __init__(self, function: _Optional[str] = ..., waiting: _Optional[int] = ..., pending: _Optional[int] = ..., start_failures: _Optional[int] = ..., start_error: _Optional[str] = ..., backoff_ms: _Optional[float] = ...) -> None: ...

class ListInstancesReply(_message.Message):
    __slots__ = ("dispatch_id", "instances", "functions")
    DISPATCH_ID_FIELD_NUMBER: _ClassVar[int]
    INSTANCES_FIELD_NUMBER: _ClassVar[int]
    FUNCTIONS_FIELD_NUMBER: _ClassVar[int]
    dispatch_id: str
    instances: _containers.RepeatedCompositeFieldContainer[InstanceState]
    functions: _containers.RepeatedCompositeFieldContainer[FunctionRouting]
    def __init__(self, dispatch_id: _Optional[str] = ..., instances: _Optional[_Iterable[_Union[InstanceState, _Mapping]]] = ..., functions: _Optional[_Iterable[_Union[FunctionRouting, _Mapping]]] = ...) -> None: ...
