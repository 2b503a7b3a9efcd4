import datetime

from flotilla.v1 import fleet_pb2 as _fleet_pb2
from google.protobuf import duration_pb2 as _duration_pb2
from google.protobuf import timestamp_pb2 as _timestamp_pb2
from google.protobuf.internal import containers as _containers
from google.protobuf.internal import enum_type_wrapper as _enum_type_wrapper
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class FleetRolloutResult(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    FLEET_ROLLOUT_RESULT_UNSPECIFIED: _ClassVar[FleetRolloutResult]
    FLEET_ROLLOUT_RESULT_IN_PROGRESS: _ClassVar[FleetRolloutResult]
    FLEET_ROLLOUT_RESULT_SUCCEEDED: _ClassVar[FleetRolloutResult]
    FLEET_ROLLOUT_RESULT_FAILED: _ClassVar[FleetRolloutResult]
    FLEET_ROLLOUT_RESULT_ROLLED_BACK: _ClassVar[FleetRolloutResult]
    FLEET_ROLLOUT_RESULT_DEADLINE_EXCEEDED: _ClassVar[FleetRolloutResult]

class RolloutPhase(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    ROLLOUT_PHASE_UNSPECIFIED: _ClassVar[RolloutPhase]
    ROLLOUT_PHASE_PROGRESSING: _ClassVar[RolloutPhase]
    ROLLOUT_PHASE_PAUSED: _ClassVar[RolloutPhase]
    ROLLOUT_PHASE_COMPLETE: _ClassVar[RolloutPhase]
    ROLLOUT_PHASE_DEGRADED: _ClassVar[RolloutPhase]
    ROLLOUT_PHASE_ROLLED_BACK: _ClassVar[RolloutPhase]
    ROLLOUT_PHASE_FAILED: _ClassVar[RolloutPhase]

class WaveState(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    WAVE_STATE_UNSPECIFIED: _ClassVar[WaveState]
    WAVE_STATE_PENDING: _ClassVar[WaveState]
    WAVE_STATE_AWAITING_APPROVAL: _ClassVar[WaveState]
    WAVE_STATE_PROGRESSING: _ClassVar[WaveState]
    WAVE_STATE_BAKING: _ClassVar[WaveState]
    WAVE_STATE_DONE: _ClassVar[WaveState]
    WAVE_STATE_SKIPPED: _ClassVar[WaveState]
    WAVE_STATE_FAILED: _ClassVar[WaveState]

class AnalysisCheckState(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    ANALYSIS_CHECK_STATE_UNSPECIFIED: _ClassVar[AnalysisCheckState]
    ANALYSIS_CHECK_STATE_RUNNING: _ClassVar[AnalysisCheckState]
    ANALYSIS_CHECK_STATE_PASSED: _ClassVar[AnalysisCheckState]
    ANALYSIS_CHECK_STATE_FAILED: _ClassVar[AnalysisCheckState]

class ClusterRolloutState(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    CLUSTER_ROLLOUT_STATE_UNSPECIFIED: _ClassVar[ClusterRolloutState]
    CLUSTER_ROLLOUT_STATE_PENDING: _ClassVar[ClusterRolloutState]
    CLUSTER_ROLLOUT_STATE_UPDATING: _ClassVar[ClusterRolloutState]
    CLUSTER_ROLLOUT_STATE_DONE: _ClassVar[ClusterRolloutState]
    CLUSTER_ROLLOUT_STATE_FAILED: _ClassVar[ClusterRolloutState]
    CLUSTER_ROLLOUT_STATE_UNKNOWN: _ClassVar[ClusterRolloutState]
    CLUSTER_ROLLOUT_STATE_REMOVING: _ClassVar[ClusterRolloutState]
FLEET_ROLLOUT_RESULT_UNSPECIFIED: FleetRolloutResult
FLEET_ROLLOUT_RESULT_IN_PROGRESS: FleetRolloutResult
FLEET_ROLLOUT_RESULT_SUCCEEDED: FleetRolloutResult
FLEET_ROLLOUT_RESULT_FAILED: FleetRolloutResult
FLEET_ROLLOUT_RESULT_ROLLED_BACK: FleetRolloutResult
FLEET_ROLLOUT_RESULT_DEADLINE_EXCEEDED: FleetRolloutResult
ROLLOUT_PHASE_UNSPECIFIED: RolloutPhase
ROLLOUT_PHASE_PROGRESSING: RolloutPhase
ROLLOUT_PHASE_PAUSED: RolloutPhase
ROLLOUT_PHASE_COMPLETE: RolloutPhase
ROLLOUT_PHASE_DEGRADED: RolloutPhase
ROLLOUT_PHASE_ROLLED_BACK: RolloutPhase
ROLLOUT_PHASE_FAILED: RolloutPhase
WAVE_STATE_UNSPECIFIED: WaveState
WAVE_STATE_PENDING: WaveState
WAVE_STATE_AWAITING_APPROVAL: WaveState
WAVE_STATE_PROGRESSING: WaveState
WAVE_STATE_BAKING: WaveState
WAVE_STATE_DONE: WaveState
WAVE_STATE_SKIPPED: WaveState
WAVE_STATE_FAILED: WaveState
ANALYSIS_CHECK_STATE_UNSPECIFIED: AnalysisCheckState
ANALYSIS_CHECK_STATE_RUNNING: AnalysisCheckState
ANALYSIS_CHECK_STATE_PASSED: AnalysisCheckState
ANALYSIS_CHECK_STATE_FAILED: AnalysisCheckState
CLUSTER_ROLLOUT_STATE_UNSPECIFIED: ClusterRolloutState
CLUSTER_ROLLOUT_STATE_PENDING: ClusterRolloutState
CLUSTER_ROLLOUT_STATE_UPDATING: ClusterRolloutState
CLUSTER_ROLLOUT_STATE_DONE: ClusterRolloutState
CLUSTER_ROLLOUT_STATE_FAILED: ClusterRolloutState
CLUSTER_ROLLOUT_STATE_UNKNOWN: ClusterRolloutState
CLUSTER_ROLLOUT_STATE_REMOVING: ClusterRolloutState

class WaitForFleetRolloutRequest(_message.Message):
    __slots__ = ("namespace", "name", "generation", "revision", "current", "timeout")
    NAMESPACE_FIELD_NUMBER: _ClassVar[int]
    NAME_FIELD_NUMBER: _ClassVar[int]
    GENERATION_FIELD_NUMBER: _ClassVar[int]
    REVISION_FIELD_NUMBER: _ClassVar[int]
    CURRENT_FIELD_NUMBER: _ClassVar[int]
    TIMEOUT_FIELD_NUMBER: _ClassVar[int]
    namespace: str
    name: str
    generation: int
    revision: str
    current: bool
    timeout: _duration_pb2.Duration
    def __init__(self, namespace: _Optional[str] = ..., name: _Optional[str] = ..., generation: _Optional[int] = ..., revision: _Optional[str] = ..., current: _Optional[bool] = ..., timeout: _Optional[_Union[datetime.timedelta, _duration_pb2.Duration, _Mapping]] = ...) -> None: ...

class WaitForFleetRolloutResponse(_message.Message):
    __slots__ = ("result", "rollout", "target_generation", "target_revision", "summary")
    RESULT_FIELD_NUMBER: _ClassVar[int]
    ROLLOUT_FIELD_NUMBER: _ClassVar[int]
    TARGET_GENERATION_FIELD_NUMBER: _ClassVar[int]
    TARGET_REVISION_FIELD_NUMBER: _ClassVar[int]
    SUMMARY_FIELD_NUMBER: _ClassVar[int]
    result: FleetRolloutResult
    rollout: Rollout
    target_generation: int
    target_revision: int
    summary: str
    def __init__(self, result: _Optional[_Union[FleetRolloutResult, str]] = ..., rollout: _Optional[_Union[Rollout, _Mapping]] = ..., target_generation: _Optional[int] = ..., target_revision: _Optional[int] = ..., summary: _Optional[str] = ...) -> None: ...

class RolloutRef(_message.Message):
    __slots__ = ("namespace", "name")
    NAMESPACE_FIELD_NUMBER: _ClassVar[int]
    NAME_FIELD_NUMBER: _ClassVar[int]
    namespace: str
    name: str
    def __init__(self, namespace: _Optional[str] = ..., name: _Optional[str] = ...) -> None: ...

class UndoRolloutRequest(_message.Message):
    __slots__ = ("namespace", "name", "to_revision")
    NAMESPACE_FIELD_NUMBER: _ClassVar[int]
    NAME_FIELD_NUMBER: _ClassVar[int]
    TO_REVISION_FIELD_NUMBER: _ClassVar[int]
    namespace: str
    name: str
    to_revision: int
    def __init__(self, namespace: _Optional[str] = ..., name: _Optional[str] = ..., to_revision: _Optional[int] = ...) -> None: ...

class ApproveWaveRequest(_message.Message):
    __slots__ = ("namespace", "name", "wave", "revision")
    NAMESPACE_FIELD_NUMBER: _ClassVar[int]
    NAME_FIELD_NUMBER: _ClassVar[int]
    WAVE_FIELD_NUMBER: _ClassVar[int]
    REVISION_FIELD_NUMBER: _ClassVar[int]
    namespace: str
    name: str
    wave: str
    revision: str
    def __init__(self, namespace: _Optional[str] = ..., name: _Optional[str] = ..., wave: _Optional[str] = ..., revision: _Optional[str] = ...) -> None: ...

class ListRolloutsRequest(_message.Message):
    __slots__ = ("namespace", "page_size", "page_token")
    NAMESPACE_FIELD_NUMBER: _ClassVar[int]
    PAGE_SIZE_FIELD_NUMBER: _ClassVar[int]
    PAGE_TOKEN_FIELD_NUMBER: _ClassVar[int]
    namespace: str
    page_size: int
    page_token: str
    def __init__(self, namespace: _Optional[str] = ..., page_size: _Optional[int] = ..., page_token: _Optional[str] = ...) -> None: ...

class ListRolloutsResponse(_message.Message):
    __slots__ = ("rollouts", "revision", "index_id", "next_page_token")
    ROLLOUTS_FIELD_NUMBER: _ClassVar[int]
    REVISION_FIELD_NUMBER: _ClassVar[int]
    INDEX_ID_FIELD_NUMBER: _ClassVar[int]
    NEXT_PAGE_TOKEN_FIELD_NUMBER: _ClassVar[int]
    rollouts: _containers.RepeatedCompositeFieldContainer[Rollout]
    revision: int
    index_id: str
    next_page_token: str
    def __init__(self, rollouts: _Optional[_Iterable[_Union[Rollout, _Mapping]]] = ..., revision: _Optional[int] = ..., index_id: _Optional[str] = ..., next_page_token: _Optional[str] = ...) -> None: ...

class WatchRolloutsRequest(_message.Message):
    __slots__ = ("namespace", "resume_from", "index_id")
    NAMESPACE_FIELD_NUMBER: _ClassVar[int]
    RESUME_FROM_FIELD_NUMBER: _ClassVar[int]
    INDEX_ID_FIELD_NUMBER: _ClassVar[int]
    namespace: str
    resume_from: int
    index_id: str
    def __init__(self, namespace: _Optional[str] = ..., resume_from: _Optional[int] = ..., index_id: _Optional[str] = ...) -> None: ...

class RolloutEvent(_message.Message):
    __slots__ = ("type", "revision", "index_id", "rollout")
    TYPE_FIELD_NUMBER: _ClassVar[int]
    REVISION_FIELD_NUMBER: _ClassVar[int]
    INDEX_ID_FIELD_NUMBER: _ClassVar[int]
    ROLLOUT_FIELD_NUMBER: _ClassVar[int]
    type: _fleet_pb2.WatchEventType
    revision: int
    index_id: str
    rollout: Rollout
    def __init__(self, type: _Optional[_Union[_fleet_pb2.WatchEventType, str]] = ..., revision: _Optional[int] = ..., index_id: _Optional[str] = ..., rollout: _Optional[_Union[Rollout, _Mapping]] = ...) -> None: ...

class Rollout(_message.Message):
    __slots__ = ("namespace", "name", "generation", "observed_generation", "phase", "wave", "image", "paused", "update_revision", "current_revision", "last_good_revision", "updated", "available", "waves", "clusters", "conditions", "history", "deleting", "placement", "rollout_phase", "clusters_placed", "clusters_updated", "clusters_available")
    NAMESPACE_FIELD_NUMBER: _ClassVar[int]
    NAME_FIELD_NUMBER: _ClassVar[int]
    GENERATION_FIELD_NUMBER: _ClassVar[int]
    OBSERVED_GENERATION_FIELD_NUMBER: _ClassVar[int]
    PHASE_FIELD_NUMBER: _ClassVar[int]
    WAVE_FIELD_NUMBER: _ClassVar[int]
    IMAGE_FIELD_NUMBER: _ClassVar[int]
    PAUSED_FIELD_NUMBER: _ClassVar[int]
    UPDATE_REVISION_FIELD_NUMBER: _ClassVar[int]
    CURRENT_REVISION_FIELD_NUMBER: _ClassVar[int]
    LAST_GOOD_REVISION_FIELD_NUMBER: _ClassVar[int]
    UPDATED_FIELD_NUMBER: _ClassVar[int]
    AVAILABLE_FIELD_NUMBER: _ClassVar[int]
    WAVES_FIELD_NUMBER: _ClassVar[int]
    CLUSTERS_FIELD_NUMBER: _ClassVar[int]
    CONDITIONS_FIELD_NUMBER: _ClassVar[int]
    HISTORY_FIELD_NUMBER: _ClassVar[int]
    DELETING_FIELD_NUMBER: _ClassVar[int]
    PLACEMENT_FIELD_NUMBER: _ClassVar[int]
    ROLLOUT_PHASE_FIELD_NUMBER: _ClassVar[int]
    CLUSTERS_PLACED_FIELD_NUMBER: _ClassVar[int]
    CLUSTERS_UPDATED_FIELD_NUMBER: _ClassVar[int]
    CLUSTERS_AVAILABLE_FIELD_NUMBER: _ClassVar[int]
    namespace: str
    name: str
    generation: int
    observed_generation: int
    phase: str
    wave: str
    image: str
    paused: bool
    update_revision: RevisionRef
    current_revision: RevisionRef
    last_good_revision: RevisionRef
    updated: str
    available: str
    waves: _containers.RepeatedCompositeFieldContainer[Wave]
    clusters: _containers.RepeatedCompositeFieldContainer[ClusterRollout]
    conditions: _containers.RepeatedCompositeFieldContainer[_fleet_pb2.Condition]
    history: _containers.RepeatedCompositeFieldContainer[RevisionInfo]
    deleting: bool
    placement: Placement
    rollout_phase: RolloutPhase
    clusters_placed: int
    clusters_updated: int
    clusters_available: int
    def __init__(self, namespace: _Optional[str] = ..., name: _Optional[str] = ..., generation: _Optional[int] = ..., observed_generation: _Optional[int] = ..., phase: _Optional[str] = ..., wave: _Optional[str] = ..., image: _Optional[str] = ..., paused: _Optional[bool] = ..., update_revision: _Optional[_Union[RevisionRef, _Mapping]] = ..., current_revision: _Optional[_Union[RevisionRef, _Mapping]] = ..., last_good_revision: _Optional[_Union[RevisionRef, _Mapping]] = ..., updated: _Optional[str] = ..., available: _Optional[str] = ..., waves: _Optional[_Iterable[_Union[Wave, _Mapping]]] = ..., clusters: _Optional[_Iterable[_Union[ClusterRollout, _Mapping]]] = ..., conditions: _Optional[_Iterable[_Union[_fleet_pb2.Condition, _Mapping]]] = ..., history: _Optional[_Iterable[_Union[RevisionInfo, _Mapping]]] = ..., deleting: _Optional[bool] = ..., placement: _Optional[_Union[Placement, _Mapping]] = ..., rollout_phase: _Optional[_Union[RolloutPhase, str]] = ..., clusters_placed: _Optional[int] = ..., clusters_updated: _Optional[int] = ..., clusters_available: _Optional[int] = ...) -> None: ...

class Placement(_message.Message):
    __slots__ = ("number_of_clusters", "clusters", "history", "last_failover")
    NUMBER_OF_CLUSTERS_FIELD_NUMBER: _ClassVar[int]
    CLUSTERS_FIELD_NUMBER: _ClassVar[int]
    HISTORY_FIELD_NUMBER: _ClassVar[int]
    LAST_FAILOVER_FIELD_NUMBER: _ClassVar[int]
    number_of_clusters: int
    clusters: _containers.RepeatedCompositeFieldContainer[PlacedCluster]
    history: _containers.RepeatedCompositeFieldContainer[PlacementChange]
    last_failover: _timestamp_pb2.Timestamp
    def __init__(self, number_of_clusters: _Optional[int] = ..., clusters: _Optional[_Iterable[_Union[PlacedCluster, _Mapping]]] = ..., history: _Optional[_Iterable[_Union[PlacementChange, _Mapping]]] = ..., last_failover: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ...) -> None: ...

class PlacedCluster(_message.Message):
    __slots__ = ("cluster", "role", "reason", "message", "since", "unreachable_since", "unavailable_since", "replaced_by")
    CLUSTER_FIELD_NUMBER: _ClassVar[int]
    ROLE_FIELD_NUMBER: _ClassVar[int]
    REASON_FIELD_NUMBER: _ClassVar[int]
    MESSAGE_FIELD_NUMBER: _ClassVar[int]
    SINCE_FIELD_NUMBER: _ClassVar[int]
    UNREACHABLE_SINCE_FIELD_NUMBER: _ClassVar[int]
    UNAVAILABLE_SINCE_FIELD_NUMBER: _ClassVar[int]
    REPLACED_BY_FIELD_NUMBER: _ClassVar[int]
    cluster: str
    role: str
    reason: str
    message: str
    since: _timestamp_pb2.Timestamp
    unreachable_since: _timestamp_pb2.Timestamp
    unavailable_since: _timestamp_pb2.Timestamp
    replaced_by: str
    def __init__(self, cluster: _Optional[str] = ..., role: _Optional[str] = ..., reason: _Optional[str] = ..., message: _Optional[str] = ..., since: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ..., unreachable_since: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ..., unavailable_since: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ..., replaced_by: _Optional[str] = ...) -> None: ...

class PlacementChange(_message.Message):
    __slots__ = ("time", "reason", "to", "message")
    TIME_FIELD_NUMBER: _ClassVar[int]
    REASON_FIELD_NUMBER: _ClassVar[int]
    FROM_FIELD_NUMBER: _ClassVar[int]
    TO_FIELD_NUMBER: _ClassVar[int]
    MESSAGE_FIELD_NUMBER: _ClassVar[int]
    time: _timestamp_pb2.Timestamp
    reason: str
    to: str
    message: str
    def __init__(self, time: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ..., reason: _Optional[str] = ..., to: _Optional[str] = ..., message: _Optional[str] = ..., **kwargs) -> None: ...

class RevisionRef(_message.Message):
    __slots__ = ("name", "number")
    NAME_FIELD_NUMBER: _ClassVar[int]
    NUMBER_FIELD_NUMBER: _ClassVar[int]
    name: str
    number: int
    def __init__(self, name: _Optional[str] = ..., number: _Optional[int] = ...) -> None: ...

class RevisionInfo(_message.Message):
    __slots__ = ("name", "number", "image", "replicas", "overrides")
    NAME_FIELD_NUMBER: _ClassVar[int]
    NUMBER_FIELD_NUMBER: _ClassVar[int]
    IMAGE_FIELD_NUMBER: _ClassVar[int]
    REPLICAS_FIELD_NUMBER: _ClassVar[int]
    OVERRIDES_FIELD_NUMBER: _ClassVar[int]
    name: str
    number: int
    image: str
    replicas: int
    overrides: int
    def __init__(self, name: _Optional[str] = ..., number: _Optional[int] = ..., image: _Optional[str] = ..., replicas: _Optional[int] = ..., overrides: _Optional[int] = ...) -> None: ...

class Wave(_message.Message):
    __slots__ = ("name", "clusters", "state", "started", "finished", "manual", "approval", "analysis", "wave_state")
    NAME_FIELD_NUMBER: _ClassVar[int]
    CLUSTERS_FIELD_NUMBER: _ClassVar[int]
    STATE_FIELD_NUMBER: _ClassVar[int]
    STARTED_FIELD_NUMBER: _ClassVar[int]
    FINISHED_FIELD_NUMBER: _ClassVar[int]
    MANUAL_FIELD_NUMBER: _ClassVar[int]
    APPROVAL_FIELD_NUMBER: _ClassVar[int]
    ANALYSIS_FIELD_NUMBER: _ClassVar[int]
    WAVE_STATE_FIELD_NUMBER: _ClassVar[int]
    name: str
    clusters: _containers.RepeatedScalarFieldContainer[str]
    state: str
    started: _timestamp_pb2.Timestamp
    finished: _timestamp_pb2.Timestamp
    manual: bool
    approval: WaveApproval
    analysis: _containers.RepeatedCompositeFieldContainer[AnalysisCheck]
    wave_state: WaveState
    def __init__(self, name: _Optional[str] = ..., clusters: _Optional[_Iterable[str]] = ..., state: _Optional[str] = ..., started: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ..., finished: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ..., manual: _Optional[bool] = ..., approval: _Optional[_Union[WaveApproval, _Mapping]] = ..., analysis: _Optional[_Iterable[_Union[AnalysisCheck, _Mapping]]] = ..., wave_state: _Optional[_Union[WaveState, str]] = ...) -> None: ...

class AnalysisCheck(_message.Message):
    __slots__ = ("name", "state", "failures", "answer", "check_state")
    NAME_FIELD_NUMBER: _ClassVar[int]
    STATE_FIELD_NUMBER: _ClassVar[int]
    FAILURES_FIELD_NUMBER: _ClassVar[int]
    ANSWER_FIELD_NUMBER: _ClassVar[int]
    CHECK_STATE_FIELD_NUMBER: _ClassVar[int]
    name: str
    state: str
    failures: int
    answer: str
    check_state: AnalysisCheckState
    def __init__(self, name: _Optional[str] = ..., state: _Optional[str] = ..., failures: _Optional[int] = ..., answer: _Optional[str] = ..., check_state: _Optional[_Union[AnalysisCheckState, str]] = ...) -> None: ...

class WaveApproval(_message.Message):
    __slots__ = ("revision", "by", "at", "attempt")
    REVISION_FIELD_NUMBER: _ClassVar[int]
    BY_FIELD_NUMBER: _ClassVar[int]
    AT_FIELD_NUMBER: _ClassVar[int]
    ATTEMPT_FIELD_NUMBER: _ClassVar[int]
    revision: str
    by: str
    at: _timestamp_pb2.Timestamp
    attempt: int
    def __init__(self, revision: _Optional[str] = ..., by: _Optional[str] = ..., at: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ..., attempt: _Optional[int] = ...) -> None: ...

class ClusterRollout(_message.Message):
    __slots__ = ("cluster", "revision", "target", "state", "reason", "message", "since", "cluster_state")
    CLUSTER_FIELD_NUMBER: _ClassVar[int]
    REVISION_FIELD_NUMBER: _ClassVar[int]
    TARGET_FIELD_NUMBER: _ClassVar[int]
    STATE_FIELD_NUMBER: _ClassVar[int]
    REASON_FIELD_NUMBER: _ClassVar[int]
    MESSAGE_FIELD_NUMBER: _ClassVar[int]
    SINCE_FIELD_NUMBER: _ClassVar[int]
    CLUSTER_STATE_FIELD_NUMBER: _ClassVar[int]
    cluster: str
    revision: str
    target: str
    state: str
    reason: str
    message: str
    since: _timestamp_pb2.Timestamp
    cluster_state: ClusterRolloutState
    def __init__(self, cluster: _Optional[str] = ..., revision: _Optional[str] = ..., target: _Optional[str] = ..., state: _Optional[str] = ..., reason: _Optional[str] = ..., message: _Optional[str] = ..., since: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ..., cluster_state: _Optional[_Union[ClusterRolloutState, str]] = ...) -> None: ...
