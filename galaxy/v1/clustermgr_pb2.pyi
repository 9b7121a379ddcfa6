from galaxy.v1 import common_pb2 as _common_pb2
from google.protobuf.internal import containers as _containers
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class UpdateReply(_message.Message):
    __slots__ = ("reregister", "heartbeat_interval_ms", "wrong_owner")
    REREGISTER_FIELD_NUMBER: _ClassVar[int]
    HEARTBEAT_INTERVAL_MS_FIELD_NUMBER: _ClassVar[int]
    WRONG_OWNER_FIELD_NUMBER: _ClassVar[int]
    reregister: bool
    heartbeat_interval_ms: int
    wrong_owner: bool
    def __init__(self, reregister: _Optional[bool] = ..., heartbeat_interval_ms: _Optional[int] = ..., wrong_owner: _Optional[bool] = ...) -> None: ...

class HeartbeatReply(_message.Message):
    __slots__ = ("node_id", "reply", "reopen")
    NODE_ID_FIELD_NUMBER: _ClassVar[int]
    REPLY_FIELD_NUMBER: _ClassVar[int]
    REOPEN_FIELD_NUMBER: _ClassVar[int]
    node_id: str
    reply: UpdateReply
    reopen: bool
    def __init__(self, node_id: _Optional[str] = ..., reply: _Optional[_Union[UpdateReply, _Mapping]] = ..., reopen: _Optional[bool] = ...) -> None: ...

class NodeStatusBatch(_message.Message):
    __slots__ = ("statuses",)
    STATUSES_FIELD_NUMBER: _ClassVar[int]
    statuses: _containers.RepeatedCompositeFieldContainer[_common_pb2.NodeStatus]
    def __init__(self, statuses: _Optional[_Iterable[_Union[_common_pb2.NodeStatus, _Mapping]]] = ...) -> None: ...

class HeartbeatBatchReply(_message.Message):
    __slots__ = ("replies", "reopen")
    REPLIES_FIELD_NUMBER: _ClassVar[int]
    REOPEN_FIELD_NUMBER: _ClassVar[int]
    replies: _containers.RepeatedCompositeFieldContainer[HeartbeatReply]
    reopen: bool
    def __init__(self, replies: _Optional[_Iterable[_Union[HeartbeatReply, _Mapping]]] = ..., reopen: _Optional[bool] = ...) -> None: ...

class ListClusterNodesRequest(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class ClusterNode(_message.Message):
    __slots__ = ("status", "alive", "last_seen_ms", "schedule_id")
    STATUS_FIELD_NUMBER: _ClassVar[int]
    ALIVE_FIELD_NUMBER: _ClassVar[int]
    LAST_SEEN_MS_FIELD_NUMBER: _ClassVar[int]
    SCHEDULE_ID_FIELD_NUMBER: _ClassVar[int]
    status: _common_pb2.NodeStatus
    alive: bool
    last_seen_ms: float
    schedule_id: str
    def __init__(self, status: _Optional[_Union[_common_pb2.NodeStatus, _Mapping]] = ..., alive: _Optional[bool] = ..., last_seen_ms: _Optional[float] = ..., schedule_id: _Optional[str] = ...) -> None: ...

class ListClusterNodesReply(_message.Message):
    __slots__ = ("clustermgr_id", "nodes")
    CLUSTERMGR_ID_FIELD_NUMBER: _ClassVar[int]
    NODES_FIELD_NUMBER: _ClassVar[int]
    clustermgr_id: str
    nodes: _containers.RepeatedCompositeFieldContainer[ClusterNode]
    def __init__(self, clustermgr_id: _Optional[str] = ..., nodes: _Optional[_Iterable[_Union[ClusterNode, _Mapping]]] = ...) -> None: ...
