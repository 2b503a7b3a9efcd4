import datetime

from google.protobuf import duration_pb2 as _duration_pb2
from google.protobuf import timestamp_pb2 as _timestamp_pb2
from google.protobuf.internal import containers as _containers
from google.protobuf.internal import enum_type_wrapper as _enum_type_wrapper
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class Reachability(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    REACHABILITY_UNSPECIFIED: _ClassVar[Reachability]
    REACHABILITY_CONNECTING: _ClassVar[Reachability]
    REACHABILITY_REACHABLE: _ClassVar[Reachability]
    REACHABILITY_UNREACHABLE: _ClassVar[Reachability]
    REACHABILITY_INVALID: _ClassVar[Reachability]

class EntryState(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    ENTRY_STATE_UNSPECIFIED: _ClassVar[EntryState]
    ENTRY_STATE_DONE: _ClassVar[EntryState]
    ENTRY_STATE_PROGRESSING: _ClassVar[EntryState]
    ENTRY_STATE_FAILED: _ClassVar[EntryState]
    ENTRY_STATE_UNKNOWN: _ClassVar[EntryState]

class MicroservicePhase(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    MICROSERVICE_PHASE_UNSPECIFIED: _ClassVar[MicroservicePhase]
    MICROSERVICE_PHASE_ACCEPTED: _ClassVar[MicroservicePhase]
    MICROSERVICE_PHASE_RESOURCES_APPLIED: _ClassVar[MicroservicePhase]
    MICROSERVICE_PHASE_AVAILABLE: _ClassVar[MicroservicePhase]
    MICROSERVICE_PHASE_FAILED: _ClassVar[MicroservicePhase]

class MicroserviceView(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    MICROSERVICE_VIEW_UNSPECIFIED: _ClassVar[MicroserviceView]
    MICROSERVICE_VIEW_BASIC: _ClassVar[MicroserviceView]
    MICROSERVICE_VIEW_FULL: _ClassVar[MicroserviceView]

class WatchEventType(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    WATCH_EVENT_TYPE_UNSPECIFIED: _ClassVar[WatchEventType]
    WATCH_EVENT_TYPE_SNAPSHOT: _ClassVar[WatchEventType]
    WATCH_EVENT_TYPE_SYNCED: _ClassVar[WatchEventType]
    WATCH_EVENT_TYPE_UPSERT: _ClassVar[WatchEventType]
    WATCH_EVENT_TYPE_DELETE: _ClassVar[WatchEventType]
    WATCH_EVENT_TYPE_RESET: _ClassVar[WatchEventType]
    WATCH_EVENT_TYPE_BOOKMARK: _ClassVar[WatchEventType]

class RolloutResult(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    ROLLOUT_RESULT_UNSPECIFIED: _ClassVar[RolloutResult]
    ROLLOUT_RESULT_IN_PROGRESS: _ClassVar[RolloutResult]
    ROLLOUT_RESULT_SUCCEEDED: _ClassVar[RolloutResult]
    ROLLOUT_RESULT_FAILED: _ClassVar[RolloutResult]
    ROLLOUT_RESULT_DEADLINE_EXCEEDED: _ClassVar[RolloutResult]
REACHABILITY_UNSPECIFIED: Reachability
REACHABILITY_CONNECTING: Reachability
REACHABILITY_REACHABLE: Reachability
REACHABILITY_UNREACHABLE: Reachability
REACHABILITY_INVALID: Reachability
ENTRY_STATE_UNSPECIFIED: EntryState
ENTRY_STATE_DONE: EntryState
ENTRY_STATE_PROGRESSING: EntryState
ENTRY_STATE_FAILED: EntryState
ENTRY_STATE_UNKNOWN: EntryState
MICROSERVICE_PHASE_UNSPECIFIED: MicroservicePhase
MICROSERVICE_PHASE_ACCEPTED: MicroservicePhase
MICROSERVICE_PHASE_RESOURCES_APPLIED: MicroservicePhase
MICROSERVICE_PHASE_AVAILABLE: MicroservicePhase
MICROSERVICE_PHASE_FAILED: MicroservicePhase
MICROSERVICE_VIEW_UNSPECIFIED: MicroserviceView
MICROSERVICE_VIEW_BASIC: MicroserviceView
MICROSERVICE_VIEW_FULL: MicroserviceView
WATCH_EVENT_TYPE_UNSPECIFIED: WatchEventType
WATCH_EVENT_TYPE_SNAPSHOT: WatchEventType
WATCH_EVENT_TYPE_SYNCED: WatchEventType
WATCH_EVENT_TYPE_UPSERT: WatchEventType
WATCH_EVENT_TYPE_DELETE: WatchEventType
WATCH_EVENT_TYPE_RESET: WatchEventType
WATCH_EVENT_TYPE_BOOKMARK: WatchEventType
ROLLOUT_RESULT_UNSPECIFIED: RolloutResult
ROLLOUT_RESULT_IN_PROGRESS: RolloutResult
ROLLOUT_RESULT_SUCCEEDED: RolloutResult
ROLLOUT_RESULT_FAILED: RolloutResult
ROLLOUT_RESULT_DEADLINE_EXCEEDED: RolloutResult

class Cluster(_message.Message):
    __slots__ = ("name", "source", "reachability", "reason", "last_seen", "lease_holder", "epoch", "led_by_this_replica", "microservices", "synced", "labels", "labels_error")
    class LabelsEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: str
        def __init__(self, key: _Optional[str] = ..., value: _Optional[str] = ...) -> None: ...
    NAME_FIELD_NUMBER: _ClassVar[int]
    SOURCE_FIELD_NUMBER: _ClassVar[int]
    REACHABILITY_FIELD_NUMBER: _ClassVar[int]
    REASON_FIELD_NUMBER: _ClassVar[int]
    LAST_SEEN_FIELD_NUMBER: _ClassVar[int]
    LEASE_HOLDER_FIELD_NUMBER: _ClassVar[int]
    EPOCH_FIELD_NUMBER: _ClassVar[int]
    LED_BY_THIS_REPLICA_FIELD_NUMBER: _ClassVar[int]
    MICROSERVICES_FIELD_NUMBER: _ClassVar[int]
    SYNCED_FIELD_NUMBER: _ClassVar[int]
    LABELS_FIELD_NUMBER: _ClassVar[int]
    LABELS_ERROR_FIELD_NUMBER: _ClassVar[int]
    name: str
    source: str
    reachability: Reachability
    reason: str
    last_seen: _timestamp_pb2.Timestamp
    lease_holder: str
    epoch: int
    led_by_this_replica: bool
    microservices: int
    synced: bool
    labels: _containers.ScalarMap[str, str]
    labels_error: str
    def __init__(self, name: _Optional[str] = ..., source: _Optional[str] = ..., reachability: _Optional[_Union[Reachability, str]] = ..., reason: _Optional[str] = ..., last_seen: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ..., lease_holder: _Optional[str] = ..., epoch: _Optional[int] = ..., led_by_this_replica: _Optional[bool] = ..., microservices: _Optional[int] = ..., synced: _Optional[bool] = ..., labels: _Optional[_Mapping[str, str]] = ..., labels_error: _Optional[str] = ...) -> None: ...

class ListClustersRequest(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class ListClustersResponse(_message.Message):
    __slots__ = ("clusters", "replica_id")
    CLUSTERS_FIELD_NUMBER: _ClassVar[int]
    REPLICA_ID_FIELD_NUMBER: _ClassVar[int]
    clusters: _containers.RepeatedCompositeFieldContainer[Cluster]
    replica_id: str
    def __init__(self, clusters: _Optional[_Iterable[_Union[Cluster, _Mapping]]] = ..., replica_id: _Optional[str] = ...) -> None: ...

class Condition(_message.Message):
    __slots__ = ("type", "status", "reason", "message", "observed_generation", "last_transition_time")
    TYPE_FIELD_NUMBER: _ClassVar[int]
    STATUS_FIELD_NUMBER: _ClassVar[int]
    REASON_FIELD_NUMBER: _ClassVar[int]
    MESSAGE_FIELD_NUMBER: _ClassVar[int]
    OBSERVED_GENERATION_FIELD_NUMBER: _ClassVar[int]
    LAST_TRANSITION_TIME_FIELD_NUMBER: _ClassVar[int]
    type: str
    status: str
    reason: str
    message: str
    observed_generation: int
    last_transition_time: _timestamp_pb2.Timestamp
    def __init__(self, type: _Optional[str] = ..., status: _Optional[str] = ..., reason: _Optional[str] = ..., message: _Optional[str] = ..., observed_generation: _Optional[int] = ..., last_transition_time: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ...) -> None: ...

class ReplicaCounts(_message.Message):
    __slots__ = ("desired", "updated", "ready", "available")
    DESIRED_FIELD_NUMBER: _ClassVar[int]
    UPDATED_FIELD_NUMBER: _ClassVar[int]
    READY_FIELD_NUMBER: _ClassVar[int]
    AVAILABLE_FIELD_NUMBER: _ClassVar[int]
    desired: int
    updated: int
    ready: int
    available: int
    def __init__(self, desired: _Optional[int] = ..., updated: _Optional[int] = ..., ready: _Optional[int] = ..., available: _Optional[int] = ...) -> None: ...

class ClusterEntry(_message.Message):
    __slots__ = ("cluster", "state", "generation", "observed_generation", "image", "replicas", "conditions", "phase", "reachability", "last_seen", "reason", "message", "labels", "deleting", "registered", "cleanup_blocked", "microservice_phase")
    class LabelsEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: str
        def __init__(self, key: _Optional[str] = ..., value: _Optional[str] = ...) -> None: ...
    CLUSTER_FIELD_NUMBER: _ClassVar[int]
    STATE_FIELD_NUMBER: _ClassVar[int]
    GENERATION_FIELD_NUMBER: _ClassVar[int]
    OBSERVED_GENERATION_FIELD_NUMBER: _ClassVar[int]
    IMAGE_FIELD_NUMBER: _ClassVar[int]
    REPLICAS_FIELD_NUMBER: _ClassVar[int]
    CONDITIONS_FIELD_NUMBER: _ClassVar[int]
    PHASE_FIELD_NUMBER: _ClassVar[int]
    REACHABILITY_FIELD_NUMBER: _ClassVar[int]
    LAST_SEEN_FIELD_NUMBER: _ClassVar[int]
    REASON_FIELD_NUMBER: _ClassVar[int]
    MESSAGE_FIELD_NUMBER: _ClassVar[int]
    LABELS_FIELD_NUMBER: _ClassVar[int]
    DELETING_FIELD_NUMBER: _ClassVar[int]
    REGISTERED_FIELD_NUMBER: _ClassVar[int]
    CLEANUP_BLOCKED_FIELD_NUMBER: _ClassVar[int]
    MICROSERVICE_PHASE_FIELD_NUMBER: _ClassVar[int]
    cluster: str
    state: EntryState
    generation: int
    observed_generation: int
    image: str
    replicas: ReplicaCounts
    conditions: _containers.RepeatedCompositeFieldContainer[Condition]
    phase: str
    reachability: Reachability
    last_seen: _timestamp_pb2.Timestamp
    reason: str
    message: str
    labels: _containers.ScalarMap[str, str]
    deleting: bool
    registered: str
    cleanup_blocked: str
    microservice_phase: MicroservicePhase
    def __init__(self, cluster: _Optional[str] = ..., state: _Optional[_Union[EntryState, str]] = ..., generation: _Optional[int] = ..., observed_generation: _Optional[int] = ..., image: _Optional[str] = ..., replicas: _Optional[_Union[ReplicaCounts, _Mapping]] = ..., conditions: _Optional[_Iterable[_Union[Condition, _Mapping]]] = ..., phase: _Optional[str] = ..., reachability: _Optional[_Union[Reachability, str]] = ..., last_seen: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ..., reason: _Optional[str] = ..., message: _Optional[str] = ..., labels: _Optional[_Mapping[str, str]] = ..., deleting: _Optional[bool] = ..., registered: _Optional[str] = ..., cleanup_blocked: _Optional[str] = ..., microservice_phase: _Optional[_Union[MicroservicePhase, str]] = ...) -> None: ...

class Aggregate(_message.Message):
    __slots__ = ("clusters", "done", "progressing", "failed", "unknown", "all_done", "summary")
    CLUSTERS_FIELD_NUMBER: _ClassVar[int]
    DONE_FIELD_NUMBER: _ClassVar[int]
    PROGRESSING_FIELD_NUMBER: _ClassVar[int]
    FAILED_FIELD_NUMBER: _ClassVar[int]
    UNKNOWN_FIELD_NUMBER: _ClassVar[int]
    ALL_DONE_FIELD_NUMBER: _ClassVar[int]
    SUMMARY_FIELD_NUMBER: _ClassVar[int]
    clusters: int
    done: int
    progressing: int
    failed: int
    unknown: int
    all_done: bool
    summary: str
    def __init__(self, clusters: _Optional[int] = ..., done: _Optional[int] = ..., progressing: _Optional[int] = ..., failed: _Optional[int] = ..., unknown: _Optional[int] = ..., all_done: _Optional[bool] = ..., summary: _Optional[str] = ...) -> None: ...

class Microservice(_message.Message):
    __slots__ = ("namespace", "name", "clusters", "aggregate", "revision", "dns")
    NAMESPACE_FIELD_NUMBER: _ClassVar[int]
    NAME_FIELD_NUMBER: _ClassVar[int]
    CLUSTERS_FIELD_NUMBER: _ClassVar[int]
    AGGREGATE_FIELD_NUMBER: _ClassVar[int]
    REVISION_FIELD_NUMBER: _ClassVar[int]
    DNS_FIELD_NUMBER: _ClassVar[int]
    namespace: str
    name: str
    clusters: _containers.RepeatedCompositeFieldContainer[ClusterEntry]
    aggregate: Aggregate
    revision: int
    dns: DnsAnswer
    def __init__(self, namespace: _Optional[str] = ..., name: _Optional[str] = ..., clusters: _Optional[_Iterable[_Union[ClusterEntry, _Mapping]]] = ..., aggregate: _Optional[_Union[Aggregate, _Mapping]] = ..., revision: _Optional[int] = ..., dns: _Optional[_Union[DnsAnswer, _Mapping]] = ...) -> None: ...

class DnsAnswer(_message.Message):
    __slots__ = ("name", "strategy", "degraded", "clusters", "summary", "error")
    NAME_FIELD_NUMBER: _ClassVar[int]
    STRATEGY_FIELD_NUMBER: _ClassVar[int]
    DEGRADED_FIELD_NUMBER: _ClassVar[int]
    CLUSTERS_FIELD_NUMBER: _ClassVar[int]
    SUMMARY_FIELD_NUMBER: _ClassVar[int]
    ERROR_FIELD_NUMBER: _ClassVar[int]
    name: str
    strategy: str
    degraded: bool
    clusters: _containers.RepeatedCompositeFieldContainer[DnsCluster]
    summary: str
    error: str
    def __init__(self, name: _Optional[str] = ..., strategy: _Optional[str] = ..., degraded: _Optional[bool] = ..., clusters: _Optional[_Iterable[_Union[DnsCluster, _Mapping]]] = ..., summary: _Optional[str] = ..., error: _Optional[str] = ...) -> None: ...

class DnsCluster(_message.Message):
    __slots__ = ("cluster", "listed", "address", "health", "primary", "reason")
    CLUSTER_FIELD_NUMBER: _ClassVar[int]
    LISTED_FIELD_NUMBER: _ClassVar[int]
    ADDRESS_FIELD_NUMBER: _ClassVar[int]
    HEALTH_FIELD_NUMBER: _ClassVar[int]
    PRIMARY_FIELD_NUMBER: _ClassVar[int]
    REASON_FIELD_NUMBER: _ClassVar[int]
    cluster: str
    listed: bool
    address: str
    health: str
    primary: bool
    reason: str
    def __init__(self, cluster: _Optional[str] = ..., listed: _Optional[bool] = ..., address: _Optional[str] = ..., health: _Optional[str] = ..., primary: _Optional[bool] = ..., reason: _Optional[str] = ...) -> None: ...

class GetMicroserviceRequest(_message.Message):
    __slots__ = ("namespace", "name")
    NAMESPACE_FIELD_NUMBER: _ClassVar[int]
    NAME_FIELD_NUMBER: _ClassVar[int]
    namespace: str
    name: str
    def __init__(self, namespace: _Optional[str] = ..., name: _Optional[str] = ...) -> None: ...

class ListMicroservicesRequest(_message.Message):
    __slots__ = ("namespace", "label_selector", "cluster", "page_size", "page_token", "view")
    NAMESPACE_FIELD_NUMBER: _ClassVar[int]
    LABEL_SELECTOR_FIELD_NUMBER: _ClassVar[int]
    CLUSTER_FIELD_NUMBER: _ClassVar[int]
    PAGE_SIZE_FIELD_NUMBER: _ClassVar[int]
    PAGE_TOKEN_FIELD_NUMBER: _ClassVar[int]
    VIEW_FIELD_NUMBER: _ClassVar[int]
    namespace: str
    label_selector: str
    cluster: str
    page_size: int
    page_token: str
    view: MicroserviceView
    def __init__(self, namespace: _Optional[str] = ..., label_selector: _Optional[str] = ..., cluster: _Optional[str] = ..., page_size: _Optional[int] = ..., page_token: _Optional[str] = ..., view: _Optional[_Union[MicroserviceView, str]] = ...) -> None: ...

class ListMicroservicesResponse(_message.Message):
    __slots__ = ("items", "next_page_token", "revision")
    ITEMS_FIELD_NUMBER: _ClassVar[int]
    NEXT_PAGE_TOKEN_FIELD_NUMBER: _ClassVar[int]
    REVISION_FIELD_NUMBER: _ClassVar[int]
    items: _containers.RepeatedCompositeFieldContainer[Microservice]
    next_page_token: str
    revision: int
    def __init__(self, items: _Optional[_Iterable[_Union[Microservice, _Mapping]]] = ..., next_page_token: _Optional[str] = ..., revision: _Optional[int] = ...) -> None: ...

class WatchMicroservicesRequest(_message.Message):
    __slots__ = ("namespace", "label_selector", "cluster", "resume_revision", "index_id")
    NAMESPACE_FIELD_NUMBER: _ClassVar[int]
    LABEL_SELECTOR_FIELD_NUMBER: _ClassVar[int]
    CLUSTER_FIELD_NUMBER: _ClassVar[int]
    RESUME_REVISION_FIELD_NUMBER: _ClassVar[int]
    INDEX_ID_FIELD_NUMBER: _ClassVar[int]
    namespace: str
    label_selector: str
    cluster: str
    resume_revision: int
    index_id: str
    def __init__(self, namespace: _Optional[str] = ..., label_selector: _Optional[str] = ..., cluster: _Optional[str] = ..., resume_revision: _Optional[int] = ..., index_id: _Optional[str] = ...) -> None: ...

class WatchEvent(_message.Message):
    __slots__ = ("type", "revision", "index_id", "microservice")
    TYPE_FIELD_NUMBER: _ClassVar[int]
    REVISION_FIELD_NUMBER: _ClassVar[int]
    INDEX_ID_FIELD_NUMBER: _ClassVar[int]
    MICROSERVICE_FIELD_NUMBER: _ClassVar[int]
    type: WatchEventType
    revision: int
    index_id: str
    microservice: Microservice
    def __init__(self, type: _Optional[_Union[WatchEventType, str]] = ..., revision: _Optional[int] = ..., index_id: _Optional[str] = ..., microservice: _Optional[_Union[Microservice, _Mapping]] = ...) -> None: ...

class WaitForRolloutRequest(_message.Message):
    __slots__ = ("namespace", "name", "image", "generation", "generations", "clusters", "timeout")
    NAMESPACE_FIELD_NUMBER: _ClassVar[int]
    NAME_FIELD_NUMBER: _ClassVar[int]
    IMAGE_FIELD_NUMBER: _ClassVar[int]
    GENERATION_FIELD_NUMBER: _ClassVar[int]
    GENERATIONS_FIELD_NUMBER: _ClassVar[int]
    CLUSTERS_FIELD_NUMBER: _ClassVar[int]
    TIMEOUT_FIELD_NUMBER: _ClassVar[int]
    namespace: str
    name: str
    image: str
    generation: int
    generations: GenerationTargets
    clusters: _containers.RepeatedScalarFieldContainer[str]
    timeout: _duration_pb2.Duration
    def __init__(self, namespace: _Optional[str] = ..., name: _Optional[str] = ..., image: _Optional[str] = ..., generation: _Optional[int] = ..., generations: _Optional[_Union[GenerationTargets, _Mapping]] = ..., clusters: _Optional[_Iterable[str]] = ..., timeout: _Optional[_Union[datetime.timedelta, _duration_pb2.Duration, _Mapping]] = ...) -> None: ...

class GenerationTargets(_message.Message):
    __slots__ = ("at_least", "otherwise", "current")
    class AtLeastEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: int
        def __init__(self, key: _Optional[str] = ..., value: _Optional[int] = ...) -> None: ...
    AT_LEAST_FIELD_NUMBER: _ClassVar[int]
    OTHERWISE_FIELD_NUMBER: _ClassVar[int]
    CURRENT_FIELD_NUMBER: _ClassVar[int]
    at_least: _containers.ScalarMap[str, int]
    otherwise: int
    current: bool
    def __init__(self, at_least: _Optional[_Mapping[str, int]] = ..., otherwise: _Optional[int] = ..., current: _Optional[bool] = ...) -> None: ...

class RolloutProgress(_message.Message):
    __slots__ = ("result", "clusters", "aggregate", "failed_clusters", "revision", "summary", "floors")
    RESULT_FIELD_NUMBER: _ClassVar[int]
    CLUSTERS_FIELD_NUMBER: _ClassVar[int]
    AGGREGATE_FIELD_NUMBER: _ClassVar[int]
    FAILED_CLUSTERS_FIELD_NUMBER: _ClassVar[int]
    REVISION_FIELD_NUMBER: _ClassVar[int]
    SUMMARY_FIELD_NUMBER: _ClassVar[int]
    FLOORS_FIELD_NUMBER: _ClassVar[int]
    result: RolloutResult
    clusters: _containers.RepeatedCompositeFieldContainer[ClusterEntry]
    aggregate: Aggregate
    failed_clusters: _containers.RepeatedScalarFieldContainer[str]
    revision: int
    summary: str
    floors: bool
    def __init__(self, result: _Optional[_Union[RolloutResult, str]] = ..., clusters: _Optional[_Iterable[_Union[ClusterEntry, _Mapping]]] = ..., aggregate: _Optional[_Union[Aggregate, _Mapping]] = ..., failed_clusters: _Optional[_Iterable[str]] = ..., revision: _Optional[int] = ..., summary: _Optional[str] = ..., floors: _Optional[bool] = ...) -> None: ...
