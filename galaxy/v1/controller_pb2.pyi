from galaxy.v1 import common_pb2 as _common_pb2
from galaxy.v1 import clustermgr_pb2 as _clustermgr_pb2
from galaxy.v1 import dispatch_pb2 as _dispatch_pb2
from google.protobuf.internal import containers as _containers
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class ReportUnreachableReply(_message.Message):
    __slots__ = ("removed",)
    REMOVED_FIELD_NUMBER: _ClassVar[int]
    removed: bool
    def __init__(self, removed: _Optional[bool] = ...) -> None: ...

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
    __slots__ = ("membership_stale", "epoch", "standby")
    MEMBERSHIP_STALE_FIELD_NUMBER: _ClassVar[int]
    EPOCH_FIELD_NUMBER: _ClassVar[int]
    STANDBY_FIELD_NUMBER: _ClassVar[int]
    membership_stale: bool
    epoch: int
    standby: bool
    def __init__(self, membership_stale: _Optional[bool] = ..., epoch: _Optional[int] = ..., standby: _Optional[bool] = ...) -> None: ...

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

class ListRevisionsRequest(_message.Message):
    __slots__ = ("name",)
    NAME_FIELD_NUMBER: _ClassVar[int]
    name: str
    def __init__(self, name: _Optional[str] = ...) -> None: ...

class ListRevisionsReply(_message.Message):
    __slots__ = ("revisions", "traffic")
    REVISIONS_FIELD_NUMBER: _ClassVar[int]
    TRAFFIC_FIELD_NUMBER: _ClassVar[int]
    revisions: _containers.RepeatedCompositeFieldContainer[_common_pb2.FunctionSpec]
    traffic: _containers.RepeatedCompositeFieldContainer[_common_pb2.TrafficTarget]
    def __init__(self, revisions: _Optional[_Iterable[_Union[_common_pb2.FunctionSpec, _Mapping]]] = ..., traffic: _Optional[_Iterable[_Union[_common_pb2.TrafficTarget, _Mapping]]] = ...) -> None: ...

class SetTrafficRequest(_message.Message):
    __slots__ = ("name", "traffic")
    NAME_FIELD_NUMBER: _ClassVar[int]
    TRAFFIC_FIELD_NUMBER: _ClassVar[int]
    name: str
    traffic: _containers.RepeatedCompositeFieldContainer[_common_pb2.TrafficTarget]
    def __init__(self, name: _Optional[str] = ..., traffic: _Optional[_Iterable[_Union[_common_pb2.TrafficTarget, _Mapping]]] = ...) -> None: ...

class TokenInfo(_message.Message):
    __slots__ = ("id", "name", "role", "namespace", "created_unix")
    ID_FIELD_NUMBER: _ClassVar[int]
    NAME_FIELD_NUMBER: _ClassVar[int]
    ROLE_FIELD_NUMBER: _ClassVar[int]
    NAMESPACE_FIELD_NUMBER: _ClassVar[int]
    CREATED_UNIX_FIELD_NUMBER: _ClassVar[int]
    id: str
    name: str
    role: str
    namespace: str
    created_unix: float
    def __init__(self, id: _Optional[str] = ..., name: _Optional[str] = ..., role: _Optional[str] = ..., namespace: _Optional[str] = ..., created_unix: _Optional[float] = ...) -> None: ...

class CreateTokenRequest(_message.Message):
    __slots__ = ("name", "role", "namespace")
    NAME_FIELD_NUMBER: _ClassVar[int]
    ROLE_FIELD_NUMBER: _ClassVar[int]
    NAMESPACE_FIELD_NUMBER: _ClassVar[int]
    name: str
    role: str
    namespace: str
    def __init__(self, name: _Optional[str] = ..., role: _Optional[str] = ..., namespace: _Optional[str] = ...) -> None: ...

class CreateTokenReply(_message.Message):
    __slots__ = ("info", "token")
    INFO_FIELD_NUMBER: _ClassVar[int]
    TOKEN_FIELD_NUMBER: _ClassVar[int]
    info: TokenInfo
    token: str
    def __init__(self, info: _Optional[_Union[TokenInfo, _Mapping]] = ..., token: _Optional[str] = ...) -> None: ...

class ListTokensRequest(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class ListTokensReply(_message.Message):
    __slots__ = ("tokens",)
    TOKENS_FIELD_NUMBER: _ClassVar[int]
    tokens: _containers.RepeatedCompositeFieldContainer[TokenInfo]
    def __init__(self, tokens: _Optional[_Iterable[_Union[TokenInfo, _Mapping]]] = ...) -> None: ...

class DeleteTokenRequest(_message.Message):
    __slots__ = ("id",)
    ID_FIELD_NUMBER: _ClassVar[int]
    id: str
    def __init__(self, id: _Optional[str] = ...) -> None: ...

class DeleteTokenReply(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class LookupTokenRequest(_message.Message):
    __slots__ = ("id",)
    ID_FIELD_NUMBER: _ClassVar[int]
    id: str
    def __init__(self, id: _Optional[str] = ...) -> None: ...

class TokenRecord(_message.Message):
    __slots__ = ("found", "info", "sha256")
    FOUND_FIELD_NUMBER: _ClassVar[int]
    INFO_FIELD_NUMBER: _ClassVar[int]
    SHA256_FIELD_NUMBER: _ClassVar[int]
    found: bool
    info: TokenInfo
    sha256: str
    def __init__(self, found: _Optional[bool] = ..., info: _Optional[_Union[TokenInfo, _Mapping]] = ..., sha256: _Optional[str] = ...) -> None: ...

class GetClusterStatusRequest(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class ClusterStatus(_message.Message):
    __slots__ = ("membership", "nodes", "functions", "instances", "routing", "warnings", "scaling", "controller")
    MEMBERSHIP_FIELD_NUMBER: _ClassVar[int]
    NODES_FIELD_NUMBER: _ClassVar[int]
    FUNCTIONS_FIELD_NUMBER: _ClassVar[int]
    INSTANCES_FIELD_NUMBER: _ClassVar[int]
    ROUTING_FIELD_NUMBER: _ClassVar[int]
    WARNINGS_FIELD_NUMBER: _ClassVar[int]
    SCALING_FIELD_NUMBER: _ClassVar[int]
    CONTROLLER_FIELD_NUMBER: _ClassVar[int]
    membership: _common_pb2.Membership
    nodes: _containers.RepeatedCompositeFieldContainer[_clustermgr_pb2.ClusterNode]
    functions: _containers.RepeatedCompositeFieldContainer[_common_pb2.FunctionSpec]
    instances: _containers.RepeatedCompositeFieldContainer[_dispatch_pb2.InstanceState]
    routing: _containers.RepeatedCompositeFieldContainer[_dispatch_pb2.FunctionRouting]
    warnings: _containers.RepeatedScalarFieldContainer[str]
    scaling: _containers.RepeatedCompositeFieldContainer[ControlScaling]
    controller: ControllerInfo
    def __init__(self, membership: _Optional[_Union[_common_pb2.Membership, _Mapping]] = ..., nodes: _Optional[_Iterable[_Union[_clustermgr_pb2.ClusterNode, _Mapping]]] = ..., functions: _Optional[_Iterable[_Union[_common_pb2.FunctionSpec, _Mapping]]] = ..., instances: _Optional[_Iterable[_Union[_dispatch_pb2.InstanceState, _Mapping]]] = ..., routing: _Optional[_Iterable[_Union[_dispatch_pb2.FunctionRouting, _Mapping]]] = ..., warnings: _Optional[_Iterable[str]] = ..., scaling: _Optional[_Iterable[_Union[ControlScaling, _Mapping]]] = ..., controller: _Optional[_Union[ControllerInfo, _Mapping]] = ...) -> None: ...

class ControlScaling(_message.Message):
    __slots__ = ("kind", "instances", "warming", "draining", "desired", "load_op", "load", "capacity", "utilization", "queue_depth", "min_instances", "max_instances", "decisions")
    KIND_FIELD_NUMBER: _ClassVar[int]
    INSTANCES_FIELD_NUMBER: _ClassVar[int]
    WARMING_FIELD_NUMBER: _ClassVar[int]
    DRAINING_FIELD_NUMBER: _ClassVar[int]
    DESIRED_FIELD_NUMBER: _ClassVar[int]
    LOAD_OP_FIELD_NUMBER: _ClassVar[int]
    LOAD_FIELD_NUMBER: _ClassVar[int]
    CAPACITY_FIELD_NUMBER: _ClassVar[int]
    UTILIZATION_FIELD_NUMBER: _ClassVar[int]
    QUEUE_DEPTH_FIELD_NUMBER: _ClassVar[int]
    MIN_INSTANCES_FIELD_NUMBER: _ClassVar[int]
    MAX_INSTANCES_FIELD_NUMBER: _ClassVar[int]
    DECISIONS_FIELD_NUMBER: _ClassVar[int]
    kind: _common_pb2.ControlKind
    instances: int
    warming: int
    draining: int
    desired: int
    load_op: str
    load: float
    capacity: float
    utilization: float
    queue_depth: int
    min_instances: int
    max_instances: int
    decisions: _containers.RepeatedCompositeFieldContainer[ScalingDecision]
    def __init__(self, kind: _Optional[_Union[_common_pb2.ControlKind, str]] = ..., instances: _Optional[int] = ..., warming: _Optional[int] = ..., draining: _Optional[int] = ..., desired: _Optional[int] = ..., load_op: _Optional[str] = ..., load: _Optional[float] = ..., capacity: _Optional[float] = ..., utilization: _Optional[float] = ..., queue_depth: _Optional[int] = ..., min_instances: _Optional[int] = ..., max_instances: _Optional[int] = ..., decisions: _Optional[_Iterable[_Union[ScalingDecision, _Mapping]]] = ...) -> None: ...

class ScalingDecision(_message.Message):
    __slots__ = ("kind", "from_instances", "to_instances", "code", "reason", "decided_at_unix", "outcome", "detect_s", "duration_s", "term", "instance_ids")
    KIND_FIELD_NUMBER: _ClassVar[int]
    FROM_INSTANCES_FIELD_NUMBER: _ClassVar[int]
    TO_INSTANCES_FIELD_NUMBER: _ClassVar[int]
    CODE_FIELD_NUMBER: _ClassVar[int]
    REASON_FIELD_NUMBER: _ClassVar[int]
    DECIDED_AT_UNIX_FIELD_NUMBER: _ClassVar[int]
    OUTCOME_FIELD_NUMBER: _ClassVar[int]
    DETECT_S_FIELD_NUMBER: _ClassVar[int]
    DURATION_S_FIELD_NUMBER: _ClassVar[int]
    TERM_FIELD_NUMBER: _ClassVar[int]
    INSTANCE_IDS_FIELD_NUMBER: _ClassVar[int]
    kind: _common_pb2.ControlKind
    from_instances: int
    to_instances: int
    code: str
    reason: str
    decided_at_unix: float
    outcome: str
    detect_s: float
    duration_s: float
    term: int
    instance_ids: _containers.RepeatedScalarFieldContainer[str]
    def __init__(self, kind: _Optional[_Union[_common_pb2.ControlKind, str]] = ..., from_instances: _Optional[int] = ..., to_instances: _Optional[int] = ..., code: _Optional[str] = ..., reason: _Optional[str] = ..., decided_at_unix: _Optional[float] = ..., outcome: _Optional[str] = ..., detect_s: _Optional[float] = ..., duration_s: _Optional[float] = ..., term: _Optional[int] = ..., instance_ids: _Optional[_Iterable[str]] = ...) -> None: ...

class ControllerInfo(_message.Message):
    __slots__ = ("id", "address", "leader", "leader_id", "leader_address", "term", "autoscale", "actuator")
    ID_FIELD_NUMBER: _ClassVar[int]
    ADDRESS_FIELD_NUMBER: _ClassVar[int]
    LEADER_FIELD_NUMBER: _ClassVar[int]
    LEADER_ID_FIELD_NUMBER: _ClassVar[int]
    LEADER_ADDRESS_FIELD_NUMBER: _ClassVar[int]
    TERM_FIELD_NUMBER: _ClassVar[int]
    AUTOSCALE_FIELD_NUMBER: _ClassVar[int]
    ACTUATOR_FIELD_NUMBER: _ClassVar[int]
    id: str
    address: str
    leader: bool
    leader_id: str
    leader_address: str
    term: int
    autoscale: bool
    actuator: str
    def __init__(self, id: _Optional[str] = ..., address: _Optional[str] = ..., leader: _Optional[bool] = ..., leader_id: _Optional[str] = ..., leader_address: _Optional[str] = ..., term: _Optional[int] = ..., autoscale: _Optional[bool] = ..., actuator: _Optional[str] = ...) -> None: ...

class PutRuntimeRequest(_message.Message):
    __slots__ = ("runtime",)
    RUNTIME_FIELD_NUMBER: _ClassVar[int]
    runtime: _common_pb2.ServingRuntime
    def __init__(self, runtime: _Optional[_Union[_common_pb2.ServingRuntime, _Mapping]] = ...) -> None: ...

class GetRuntimeRequest(_message.Message):
    __slots__ = ("name",)
    NAME_FIELD_NUMBER: _ClassVar[int]
    name: str
    def __init__(self, name: _Optional[str] = ...) -> None: ...

class ListRuntimesRequest(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class ListRuntimesReply(_message.Message):
    __slots__ = ("runtimes",)
    RUNTIMES_FIELD_NUMBER: _ClassVar[int]
    runtimes: _containers.RepeatedCompositeFieldContainer[_common_pb2.ServingRuntime]
    def __init__(self, runtimes: _Optional[_Iterable[_Union[_common_pb2.ServingRuntime, _Mapping]]] = ...) -> None: ...

class DeleteRuntimeRequest(_message.Message):
    __slots__ = ("name",)
    NAME_FIELD_NUMBER: _ClassVar[int]
    name: str
    def __init__(self, name: _Optional[str] = ...) -> None: ...

class DeleteRuntimeReply(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class GraphSpec(_message.Message):
    __slots__ = ("name", "namespace", "document_json", "version")
    NAME_FIELD_NUMBER: _ClassVar[int]
    NAMESPACE_FIELD_NUMBER: _ClassVar[int]
    DOCUMENT_JSON_FIELD_NUMBER: _ClassVar[int]
    VERSION_FIELD_NUMBER: _ClassVar[int]
    name: str
    namespace: str
    document_json: str
    version: int
    def __init__(self, name: _Optional[str] = ..., namespace: _Optional[str] = ..., document_json: _Optional[str] = ..., version: _Optional[int] = ...) -> None: ...

class ApplyGraphRequest(_message.Message):
    __slots__ = ("document_json",)
    DOCUMENT_JSON_FIELD_NUMBER: _ClassVar[int]
    document_json: str
    def __init__(self, document_json: _Optional[str] = ...) -> None: ...

class GetGraphRequest(_message.Message):
    __slots__ = ("name",)
    NAME_FIELD_NUMBER: _ClassVar[int]
    name: str
    def __init__(self, name: _Optional[str] = ...) -> None: ...

class ListGraphsRequest(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class ListGraphsReply(_message.Message):
    __slots__ = ("graphs",)
    GRAPHS_FIELD_NUMBER: _ClassVar[int]
    graphs: _containers.RepeatedCompositeFieldContainer[GraphSpec]
    def __init__(self, graphs: _Optional[_Iterable[_Union[GraphSpec, _Mapping]]] = ...) -> None: ...

class DeleteGraphRequest(_message.Message):
    __slots__ = ("name",)
    NAME_FIELD_NUMBER: _ClassVar[int]
    name: str
    def __init__(self, name: _Optional[str] = ...) -> None: ...

class DeleteGraphReply(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...
