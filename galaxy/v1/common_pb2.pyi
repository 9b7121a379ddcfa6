from google.protobuf.internal import containers as _containers
from google.protobuf.internal import enum_type_wrapper as _enum_type_wrapper
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class ControlKind(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    CONTROL_KIND_UNSPECIFIED: _ClassVar[ControlKind]
    CONTROL_KIND_DISPATCH: _ClassVar[ControlKind]
    CONTROL_KIND_SCHEDULE: _ClassVar[ControlKind]
    CONTROL_KIND_CLUSTERMGR: _ClassVar[ControlKind]
    CONTROL_KIND_CONTROLLER: _ClassVar[ControlKind]
CONTROL_KIND_UNSPECIFIED: ControlKind
CONTROL_KIND_DISPATCH: ControlKind
CONTROL_KIND_SCHEDULE: ControlKind
CONTROL_KIND_CLUSTERMGR: ControlKind
CONTROL_KIND_CONTROLLER: ControlKind

class Resources(_message.Message):
    __slots__ = ("cpu_millis", "memory_mib", "gpus", "disk_mib")
    CPU_MILLIS_FIELD_NUMBER: _ClassVar[int]
    MEMORY_MIB_FIELD_NUMBER: _ClassVar[int]
    GPUS_FIELD_NUMBER: _ClassVar[int]
    DISK_MIB_FIELD_NUMBER: _ClassVar[int]
    cpu_millis: int
    memory_mib: int
    gpus: int
    disk_mib: int
    def __init__(self, cpu_millis: _Optional[int] = ..., memory_mib: _Optional[int] = ..., gpus: _Optional[int] = ..., disk_mib: _Optional[int] = ...) -> None: ...

class FunctionSpec(_message.Message):
    __slots__ = ("name", "command", "workdir", "env", "resources", "concurrency", "min_scale", "max_scale", "readiness_path", "startup_timeout_ms", "version", "request_timeout_ms", "autoscaling", "revision", "traffic", "runtime", "artifact", "args", "namespace", "public", "model", "batching", "llm", "pd", "egress")
    class EnvEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: str
        def __init__(self, key: _Optional[str] = ..., value: _Optional[str] = ...) -> None: ...
    NAME_FIELD_NUMBER: _ClassVar[int]
    COMMAND_FIELD_NUMBER: _ClassVar[int]
    WORKDIR_FIELD_NUMBER: _ClassVar[int]
    ENV_FIELD_NUMBER: _ClassVar[int]
    RESOURCES_FIELD_NUMBER: _ClassVar[int]
    CONCURRENCY_FIELD_NUMBER: _ClassVar[int]
    MIN_SCALE_FIELD_NUMBER: _ClassVar[int]
    MAX_SCALE_FIELD_NUMBER: _ClassVar[int]
    READINESS_PATH_FIELD_NUMBER: _ClassVar[int]
    STARTUP_TIMEOUT_MS_FIELD_NUMBER: _ClassVar[int]
    VERSION_FIELD_NUMBER: _ClassVar[int]
    REQUEST_TIMEOUT_MS_FIELD_NUMBER: _ClassVar[int]
    AUTOSCALING_FIELD_NUMBER: _ClassVar[int]
    REVISION_FIELD_NUMBER: _ClassVar[int]
    TRAFFIC_FIELD_NUMBER: _ClassVar[int]
    RUNTIME_FIELD_NUMBER: _ClassVar[int]
    ARTIFACT_FIELD_NUMBER: _ClassVar[int]
    ARGS_FIELD_NUMBER: _ClassVar[int]
    NAMESPACE_FIELD_NUMBER: _ClassVar[int]
    PUBLIC_FIELD_NUMBER: _ClassVar[int]
    MODEL_FIELD_NUMBER: _ClassVar[int]
    BATCHING_FIELD_NUMBER: _ClassVar[int]
    LLM_FIELD_NUMBER: _ClassVar[int]
    PD_FIELD_NUMBER: _ClassVar[int]
    EGRESS_FIELD_NUMBER: _ClassVar[int]
    name: str
    command: _containers.RepeatedScalarFieldContainer[str]
    workdir: str
    env: _containers.ScalarMap[str, str]
    resources: Resources
    concurrency: int
    min_scale: int
    max_scale: int
    readiness_path: str
    startup_timeout_ms: int
    version: int
    request_timeout_ms: int
    autoscaling: AutoscalingSpec
    revision: int
    traffic: _containers.RepeatedCompositeFieldContainer[TrafficTarget]
    runtime: str
    artifact: str
    args: _containers.RepeatedScalarFieldContainer[str]
    namespace: str
    public: bool
    model: ModelRef
    batching: BatchingSpec
    llm: bool
    pd: PdSpec
    egress: bool
    def __init__(self, name: _Optional[str] = ..., command: _Optional[_Iterable[str]] = ..., workdir: _Optional[str] = ..., env: _Optional[_Mapping[str, str]] = ..., resources: _Optional[_Union[Resources, _Mapping]] = ..., concurrency: _Optional[int] = ..., min_scale: _Optional[int] = ..., max_scale: _Optional[int] = ..., readiness_path: _Optional[str] = ..., startup_timeout_ms: _Optional[int] = ..., version: _Optional[int] = ..., request_timeout_ms: _Optional[int] = ..., autoscaling: _Optional[_Union[AutoscalingSpec, _Mapping]] = ..., revision: _Optional[int] = ..., traffic: _Optional[_Iterable[_Union[TrafficTarget, _Mapping]]] = ..., runtime: _Optional[str] = ..., artifact: _Optional[str] = ..., args: _Optional[_Iterable[str]] = ..., namespace: _Optional[str] = ..., public: _Optional[bool] = ..., model: _Optional[_Union[ModelRef, _Mapping]] = ..., batching: _Optional[_Union[BatchingSpec, _Mapping]] = ..., llm: _Optional[bool] = ..., pd: _Optional[_Union[PdSpec, _Mapping]] = ..., egress: _Optional[bool] = ...) -> None: ...

class PdSpec(_message.Message):
    __slots__ = ("prefill", "kv_bytes_per_token", "prefill_tps")
    PREFILL_FIELD_NUMBER: _ClassVar[int]
    KV_BYTES_PER_TOKEN_FIELD_NUMBER: _ClassVar[int]
    PREFILL_TPS_FIELD_NUMBER: _ClassVar[int]
    prefill: str
    kv_bytes_per_token: int
    prefill_tps: float
    def __init__(self, prefill: _Optional[str] = ..., kv_bytes_per_token: _Optional[int] = ..., prefill_tps: _Optional[float] = ...) -> None: ...

class BatchingSpec(_message.Message):
    __slots__ = ("max_batch_size", "max_latency_ms")
    MAX_BATCH_SIZE_FIELD_NUMBER: _ClassVar[int]
    MAX_LATENCY_MS_FIELD_NUMBER: _ClassVar[int]
    max_batch_size: int
    max_latency_ms: int
    def __init__(self, max_batch_size: _Optional[int] = ..., max_latency_ms: _Optional[int] = ...) -> None: ...

class ModelRef(_message.Message):
    __slots__ = ("uri", "format", "sha256", "size_bytes", "warm_nodes")
    URI_FIELD_NUMBER: _ClassVar[int]
    FORMAT_FIELD_NUMBER: _ClassVar[int]
    SHA256_FIELD_NUMBER: _ClassVar[int]
    SIZE_BYTES_FIELD_NUMBER: _ClassVar[int]
    WARM_NODES_FIELD_NUMBER: _ClassVar[int]
    uri: str
    format: str
    sha256: str
    size_bytes: int
    warm_nodes: int
    def __init__(self, uri: _Optional[str] = ..., format: _Optional[str] = ..., sha256: _Optional[str] = ..., size_bytes: _Optional[int] = ..., warm_nodes: _Optional[int] = ...) -> None: ...

class ModelHeld(_message.Message):
    __slots__ = ("digest", "tier", "size_bytes")
    DIGEST_FIELD_NUMBER: _ClassVar[int]
    TIER_FIELD_NUMBER: _ClassVar[int]
    SIZE_BYTES_FIELD_NUMBER: _ClassVar[int]
    digest: str
    tier: str
    size_bytes: int
    def __init__(self, digest: _Optional[str] = ..., tier: _Optional[str] = ..., size_bytes: _Optional[int] = ...) -> None: ...

class TrafficTarget(_message.Message):
    __slots__ = ("revision", "percent", "tag")
    REVISION_FIELD_NUMBER: _ClassVar[int]
    PERCENT_FIELD_NUMBER: _ClassVar[int]
    TAG_FIELD_NUMBER: _ClassVar[int]
    revision: int
    percent: int
    tag: str
    def __init__(self, revision: _Optional[int] = ..., percent: _Optional[int] = ..., tag: _Optional[str] = ...) -> None: ...

class AutoscalingSpec(_message.Message):
    __slots__ = ("target_utilization", "stable_window_ms", "panic_window_percent", "scale_to_zero_grace_ms", "keepalive", "keepalive_ms", "metric", "target", "ttft_ms", "tpot_ms", "max_asleep", "keep_asleep_ms")
    TARGET_UTILIZATION_FIELD_NUMBER: _ClassVar[int]
    STABLE_WINDOW_MS_FIELD_NUMBER: _ClassVar[int]
    PANIC_WINDOW_PERCENT_FIELD_NUMBER: _ClassVar[int]
    SCALE_TO_ZERO_GRACE_MS_FIELD_NUMBER: _ClassVar[int]
    KEEPALIVE_FIELD_NUMBER: _ClassVar[int]
    KEEPALIVE_MS_FIELD_NUMBER: _ClassVar[int]
    METRIC_FIELD_NUMBER: _ClassVar[int]
    TARGET_FIELD_NUMBER: _ClassVar[int]
    TTFT_MS_FIELD_NUMBER: _ClassVar[int]
    TPOT_MS_FIELD_NUMBER: _ClassVar[int]
    MAX_ASLEEP_FIELD_NUMBER: _ClassVar[int]
    KEEP_ASLEEP_MS_FIELD_NUMBER: _ClassVar[int]
    target_utilization: float
    stable_window_ms: int
    panic_window_percent: float
    scale_to_zero_grace_ms: int
    keepalive: str
    keepalive_ms: int
    metric: str
    target: float
    ttft_ms: int
    tpot_ms: int
    max_asleep: int
    keep_asleep_ms: int
    def __init__(self, target_utilization: _Optional[float] = ..., stable_window_ms: _Optional[int] = ..., panic_window_percent: _Optional[float] = ..., scale_to_zero_grace_ms: _Optional[int] = ..., keepalive: _Optional[str] = ..., keepalive_ms: _Optional[int] = ..., metric: _Optional[str] = ..., target: _Optional[float] = ..., ttft_ms: _Optional[int] = ..., tpot_ms: _Optional[int] = ..., max_asleep: _Optional[int] = ..., keep_asleep_ms: _Optional[int] = ...) -> None: ...

class ControlInstance(_message.Message):
    __slots__ = ("id", "kind", "address", "metrics_address", "standby")
    ID_FIELD_NUMBER: _ClassVar[int]
    KIND_FIELD_NUMBER: _ClassVar[int]
    ADDRESS_FIELD_NUMBER: _ClassVar[int]
    METRICS_ADDRESS_FIELD_NUMBER: _ClassVar[int]
    STANDBY_FIELD_NUMBER: _ClassVar[int]
    id: str
    kind: ControlKind
    address: str
    metrics_address: str
    standby: bool
    def __init__(self, id: _Optional[str] = ..., kind: _Optional[_Union[ControlKind, str]] = ..., address: _Optional[str] = ..., metrics_address: _Optional[str] = ..., standby: _Optional[bool] = ...) -> None: ...

class Membership(_message.Message):
    __slots__ = ("epoch", "instances")
    EPOCH_FIELD_NUMBER: _ClassVar[int]
    INSTANCES_FIELD_NUMBER: _ClassVar[int]
    epoch: int
    instances: _containers.RepeatedCompositeFieldContainer[ControlInstance]
    def __init__(self, epoch: _Optional[int] = ..., instances: _Optional[_Iterable[_Union[ControlInstance, _Mapping]]] = ...) -> None: ...

class InstanceInfo(_message.Message):
    __slots__ = ("instance_id", "function", "node_id", "address", "spec_version", "concurrency", "node_address")
    INSTANCE_ID_FIELD_NUMBER: _ClassVar[int]
    FUNCTION_FIELD_NUMBER: _ClassVar[int]
    NODE_ID_FIELD_NUMBER: _ClassVar[int]
    ADDRESS_FIELD_NUMBER: _ClassVar[int]
    SPEC_VERSION_FIELD_NUMBER: _ClassVar[int]
    CONCURRENCY_FIELD_NUMBER: _ClassVar[int]
    NODE_ADDRESS_FIELD_NUMBER: _ClassVar[int]
    instance_id: str
    function: str
    node_id: str
    address: str
    spec_version: int
    concurrency: int
    node_address: str
    def __init__(self, instance_id: _Optional[str] = ..., function: _Optional[str] = ..., node_id: _Optional[str] = ..., address: _Optional[str] = ..., spec_version: _Optional[int] = ..., concurrency: _Optional[int] = ..., node_address: _Optional[str] = ...) -> None: ...

class NodeStatus(_message.Message):
    __slots__ = ("node_id", "address", "capacity", "allocated", "instances", "seq", "starting", "incarnation", "models")
    NODE_ID_FIELD_NUMBER: _ClassVar[int]
    ADDRESS_FIELD_NUMBER: _ClassVar[int]
    CAPACITY_FIELD_NUMBER: _ClassVar[int]
    ALLOCATED_FIELD_NUMBER: _ClassVar[int]
    INSTANCES_FIELD_NUMBER: _ClassVar[int]
    SEQ_FIELD_NUMBER: _ClassVar[int]
    STARTING_FIELD_NUMBER: _ClassVar[int]
    INCARNATION_FIELD_NUMBER: _ClassVar[int]
    MODELS_FIELD_NUMBER: _ClassVar[int]
    node_id: str
    address: str
    capacity: Resources
    allocated: Resources
    instances: int
    seq: int
    starting: Resources
    incarnation: int
    models: _containers.RepeatedCompositeFieldContainer[ModelHeld]
    def __init__(self, node_id: _Optional[str] = ..., address: _Optional[str] = ..., capacity: _Optional[_Union[Resources, _Mapping]] = ..., allocated: _Optional[_Union[Resources, _Mapping]] = ..., instances: _Optional[int] = ..., seq: _Optional[int] = ..., starting: _Optional[_Union[Resources, _Mapping]] = ..., incarnation: _Optional[int] = ..., models: _Optional[_Iterable[_Union[ModelHeld, _Mapping]]] = ...) -> None: ...

class CoordinateAction(_message.Message):
    __slots__ = ("kind", "function", "node_id")
    class Kind(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
        __slots__ = ()
        KIND_UNSPECIFIED: _ClassVar[CoordinateAction.Kind]
        KIND_FUNCTION_DELETED: _ClassVar[CoordinateAction.Kind]
        KIND_FUNCTION_UPDATED: _ClassVar[CoordinateAction.Kind]
        KIND_NODE_DEAD: _ClassVar[CoordinateAction.Kind]
    KIND_UNSPECIFIED: CoordinateAction.Kind
    KIND_FUNCTION_DELETED: CoordinateAction.Kind
    KIND_FUNCTION_UPDATED: CoordinateAction.Kind
    KIND_NODE_DEAD: CoordinateAction.Kind
    KIND_FIELD_NUMBER: _ClassVar[int]
    FUNCTION_FIELD_NUMBER: _ClassVar[int]
    NODE_ID_FIELD_NUMBER: _ClassVar[int]
    kind: CoordinateAction.Kind
    function: str
    node_id: str
    def __init__(self, kind: _Optional[_Union[CoordinateAction.Kind, str]] = ..., function: _Optional[str] = ..., node_id: _Optional[str] = ...) -> None: ...

class CoordinateRequest(_message.Message):
    __slots__ = ("membership", "actions")
    MEMBERSHIP_FIELD_NUMBER: _ClassVar[int]
    ACTIONS_FIELD_NUMBER: _ClassVar[int]
    membership: Membership
    actions: _containers.RepeatedCompositeFieldContainer[CoordinateAction]
    def __init__(self, membership: _Optional[_Union[Membership, _Mapping]] = ..., actions: _Optional[_Iterable[_Union[CoordinateAction, _Mapping]]] = ...) -> None: ...

class CoordinateReply(_message.Message):
    __slots__ = ("epoch",)
    EPOCH_FIELD_NUMBER: _ClassVar[int]
    epoch: int
    def __init__(self, epoch: _Optional[int] = ...) -> None: ...

class ServingRuntime(_message.Message):
    __slots__ = ("name", "command", "description", "workdir", "artifact", "allowed_args", "max_args", "allowed_env", "resources", "readiness_path", "startup_timeout_ms", "concurrency", "version", "llm")
    class ArtifactRules(_message.Message):
        __slots__ = ("required", "prefixes", "suffixes", "max_length")
        REQUIRED_FIELD_NUMBER: _ClassVar[int]
        PREFIXES_FIELD_NUMBER: _ClassVar[int]
        SUFFIXES_FIELD_NUMBER: _ClassVar[int]
        MAX_LENGTH_FIELD_NUMBER: _ClassVar[int]
        required: bool
        prefixes: _containers.RepeatedScalarFieldContainer[str]
        suffixes: _containers.RepeatedScalarFieldContainer[str]
        max_length: int
        def __init__(self, required: _Optional[bool] = ..., prefixes: _Optional[_Iterable[str]] = ..., suffixes: _Optional[_Iterable[str]] = ..., max_length: _Optional[int] = ...) -> None: ...
    NAME_FIELD_NUMBER: _ClassVar[int]
    COMMAND_FIELD_NUMBER: _ClassVar[int]
    DESCRIPTION_FIELD_NUMBER: _ClassVar[int]
    WORKDIR_FIELD_NUMBER: _ClassVar[int]
    ARTIFACT_FIELD_NUMBER: _ClassVar[int]
    ALLOWED_ARGS_FIELD_NUMBER: _ClassVar[int]
    MAX_ARGS_FIELD_NUMBER: _ClassVar[int]
    ALLOWED_ENV_FIELD_NUMBER: _ClassVar[int]
    RESOURCES_FIELD_NUMBER: _ClassVar[int]
    READINESS_PATH_FIELD_NUMBER: _ClassVar[int]
    STARTUP_TIMEOUT_MS_FIELD_NUMBER: _ClassVar[int]
    CONCURRENCY_FIELD_NUMBER: _ClassVar[int]
    VERSION_FIELD_NUMBER: _ClassVar[int]
    LLM_FIELD_NUMBER: _ClassVar[int]
    name: str
    command: _containers.RepeatedScalarFieldContainer[str]
    description: str
    workdir: str
    artifact: ServingRuntime.ArtifactRules
    allowed_args: _containers.RepeatedScalarFieldContainer[str]
    max_args: int
    allowed_env: _containers.RepeatedScalarFieldContainer[str]
    resources: Resources
    readiness_path: str
    startup_timeout_ms: int
    concurrency: int
    version: int
    llm: bool
    def __init__(self, name: _Optional[str] = ..., command: _Optional[_Iterable[str]] = ..., description: _Optional[str] = ..., workdir: _Optional[str] = ..., artifact: _Optional[_Union[ServingRuntime.ArtifactRules, _Mapping]] = ..., allowed_args: _Optional[_Iterable[str]] = ..., max_args: _Optional[int] = ..., allowed_env: _Optional[_Iterable[str]] = ..., resources: _Optional[_Union[Resources, _Mapping]] = ..., readiness_path: _Optional[str] = ..., startup_timeout_ms: _Optional[int] = ..., concurrency: _Optional[int] = ..., version: _Optional[int] = ..., llm: _Optional[bool] = ...) -> None: ...
