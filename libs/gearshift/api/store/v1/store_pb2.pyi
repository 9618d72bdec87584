import datetime

from gearshift.api.common.v1 import common_pb2 as _common_pb2
from google.protobuf import timestamp_pb2 as _timestamp_pb2
from google.protobuf.internal import containers as _containers
from google.protobuf.internal import enum_type_wrapper as _enum_type_wrapper
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class Correctness(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    CORRECTNESS_UNSPECIFIED: _ClassVar[Correctness]
    CORRECTNESS_CORRECT: _ClassVar[Correctness]
    CORRECTNESS_INCORRECT: _ClassVar[Correctness]
    CORRECTNESS_UNSCORED: _ClassVar[Correctness]
CORRECTNESS_UNSPECIFIED: Correctness
CORRECTNESS_CORRECT: Correctness
CORRECTNESS_INCORRECT: Correctness
CORRECTNESS_UNSCORED: Correctness

class PutRequest(_message.Message):
    __slots__ = ("trajectories",)
    TRAJECTORIES_FIELD_NUMBER: _ClassVar[int]
    trajectories: _containers.RepeatedCompositeFieldContainer[_common_pb2.Trajectory]
    def __init__(self, trajectories: _Optional[_Iterable[_Union[_common_pb2.Trajectory, _Mapping]]] = ...) -> None: ...

class PutResponse(_message.Message):
    __slots__ = ("inserted", "duplicates")
    INSERTED_FIELD_NUMBER: _ClassVar[int]
    DUPLICATES_FIELD_NUMBER: _ClassVar[int]
    inserted: int
    duplicates: int
    def __init__(self, inserted: _Optional[int] = ..., duplicates: _Optional[int] = ...) -> None: ...

class GetRequest(_message.Message):
    __slots__ = ("id",)
    ID_FIELD_NUMBER: _ClassVar[int]
    id: str
    def __init__(self, id: _Optional[str] = ...) -> None: ...

class GetResponse(_message.Message):
    __slots__ = ("trajectory",)
    TRAJECTORY_FIELD_NUMBER: _ClassVar[int]
    trajectory: _common_pb2.Trajectory
    def __init__(self, trajectory: _Optional[_Union[_common_pb2.Trajectory, _Mapping]] = ...) -> None: ...

class TrajectoryFilter(_message.Message):
    __slots__ = ("modes", "correctness", "min_reward", "max_reward", "task_source", "model_version", "created_after", "created_before", "run_id", "split", "statuses", "purposes", "feedback_only")
    MODES_FIELD_NUMBER: _ClassVar[int]
    CORRECTNESS_FIELD_NUMBER: _ClassVar[int]
    MIN_REWARD_FIELD_NUMBER: _ClassVar[int]
    MAX_REWARD_FIELD_NUMBER: _ClassVar[int]
    TASK_SOURCE_FIELD_NUMBER: _ClassVar[int]
    MODEL_VERSION_FIELD_NUMBER: _ClassVar[int]
    CREATED_AFTER_FIELD_NUMBER: _ClassVar[int]
    CREATED_BEFORE_FIELD_NUMBER: _ClassVar[int]
    RUN_ID_FIELD_NUMBER: _ClassVar[int]
    SPLIT_FIELD_NUMBER: _ClassVar[int]
    STATUSES_FIELD_NUMBER: _ClassVar[int]
    PURPOSES_FIELD_NUMBER: _ClassVar[int]
    FEEDBACK_ONLY_FIELD_NUMBER: _ClassVar[int]
    modes: _containers.RepeatedScalarFieldContainer[_common_pb2.Mode]
    correctness: Correctness
    min_reward: float
    max_reward: float
    task_source: str
    model_version: str
    created_after: _timestamp_pb2.Timestamp
    created_before: _timestamp_pb2.Timestamp
    run_id: str
    split: str
    statuses: _containers.RepeatedScalarFieldContainer[_common_pb2.TrajectoryStatus]
    purposes: _containers.RepeatedScalarFieldContainer[_common_pb2.Purpose]
    feedback_only: bool
    def __init__(self, modes: _Optional[_Iterable[_Union[_common_pb2.Mode, str]]] = ..., correctness: _Optional[_Union[Correctness, str]] = ..., min_reward: _Optional[float] = ..., max_reward: _Optional[float] = ..., task_source: _Optional[str] = ..., model_version: _Optional[str] = ..., created_after: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ..., created_before: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ..., run_id: _Optional[str] = ..., split: _Optional[str] = ..., statuses: _Optional[_Iterable[_Union[_common_pb2.TrajectoryStatus, str]]] = ..., purposes: _Optional[_Iterable[_Union[_common_pb2.Purpose, str]]] = ..., feedback_only: _Optional[bool] = ...) -> None: ...

class QueryRequest(_message.Message):
    __slots__ = ("filter", "page_size", "page_token", "include_turns")
    FILTER_FIELD_NUMBER: _ClassVar[int]
    PAGE_SIZE_FIELD_NUMBER: _ClassVar[int]
    PAGE_TOKEN_FIELD_NUMBER: _ClassVar[int]
    INCLUDE_TURNS_FIELD_NUMBER: _ClassVar[int]
    filter: TrajectoryFilter
    page_size: int
    page_token: str
    include_turns: bool
    def __init__(self, filter: _Optional[_Union[TrajectoryFilter, _Mapping]] = ..., page_size: _Optional[int] = ..., page_token: _Optional[str] = ..., include_turns: _Optional[bool] = ...) -> None: ...

class QueryResponse(_message.Message):
    __slots__ = ("trajectories", "next_page_token")
    TRAJECTORIES_FIELD_NUMBER: _ClassVar[int]
    NEXT_PAGE_TOKEN_FIELD_NUMBER: _ClassVar[int]
    trajectories: _containers.RepeatedCompositeFieldContainer[_common_pb2.Trajectory]
    next_page_token: str
    def __init__(self, trajectories: _Optional[_Iterable[_Union[_common_pb2.Trajectory, _Mapping]]] = ..., next_page_token: _Optional[str] = ...) -> None: ...

class ExportRequest(_message.Message):
    __slots__ = ("filter", "include_turns", "limit")
    FILTER_FIELD_NUMBER: _ClassVar[int]
    INCLUDE_TURNS_FIELD_NUMBER: _ClassVar[int]
    LIMIT_FIELD_NUMBER: _ClassVar[int]
    filter: TrajectoryFilter
    include_turns: bool
    limit: int
    def __init__(self, filter: _Optional[_Union[TrajectoryFilter, _Mapping]] = ..., include_turns: _Optional[bool] = ..., limit: _Optional[int] = ...) -> None: ...

class SetRewardRequest(_message.Message):
    __slots__ = ("id", "reward")
    ID_FIELD_NUMBER: _ClassVar[int]
    REWARD_FIELD_NUMBER: _ClassVar[int]
    id: str
    reward: _common_pb2.Reward
    def __init__(self, id: _Optional[str] = ..., reward: _Optional[_Union[_common_pb2.Reward, _Mapping]] = ...) -> None: ...

class SetRewardResponse(_message.Message):
    __slots__ = ("replaced", "previous")
    REPLACED_FIELD_NUMBER: _ClassVar[int]
    PREVIOUS_FIELD_NUMBER: _ClassVar[int]
    replaced: bool
    previous: _common_pb2.Reward
    def __init__(self, replaced: _Optional[bool] = ..., previous: _Optional[_Union[_common_pb2.Reward, _Mapping]] = ...) -> None: ...

class RegisterCheckpointRequest(_message.Message):
    __slots__ = ("checkpoint",)
    CHECKPOINT_FIELD_NUMBER: _ClassVar[int]
    checkpoint: _common_pb2.Checkpoint
    def __init__(self, checkpoint: _Optional[_Union[_common_pb2.Checkpoint, _Mapping]] = ...) -> None: ...

class GetCheckpointRequest(_message.Message):
    __slots__ = ("id", "include_lineage")
    ID_FIELD_NUMBER: _ClassVar[int]
    INCLUDE_LINEAGE_FIELD_NUMBER: _ClassVar[int]
    id: str
    include_lineage: bool
    def __init__(self, id: _Optional[str] = ..., include_lineage: _Optional[bool] = ...) -> None: ...

class ListCheckpointsRequest(_message.Message):
    __slots__ = ("kind", "status", "limit")
    KIND_FIELD_NUMBER: _ClassVar[int]
    STATUS_FIELD_NUMBER: _ClassVar[int]
    LIMIT_FIELD_NUMBER: _ClassVar[int]
    kind: str
    status: _common_pb2.CheckpointStatus
    limit: int
    def __init__(self, kind: _Optional[str] = ..., status: _Optional[_Union[_common_pb2.CheckpointStatus, str]] = ..., limit: _Optional[int] = ...) -> None: ...

class ListCheckpointsResponse(_message.Message):
    __slots__ = ("checkpoints",)
    CHECKPOINTS_FIELD_NUMBER: _ClassVar[int]
    checkpoints: _containers.RepeatedCompositeFieldContainer[_common_pb2.Checkpoint]
    def __init__(self, checkpoints: _Optional[_Iterable[_Union[_common_pb2.Checkpoint, _Mapping]]] = ...) -> None: ...

class UpdateCheckpointRequest(_message.Message):
    __slots__ = ("id", "status", "eval_metrics")
    class EvalMetricsEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: float
        def __init__(self, key: _Optional[str] = ..., value: _Optional[float] = ...) -> None: ...
    ID_FIELD_NUMBER: _ClassVar[int]
    STATUS_FIELD_NUMBER: _ClassVar[int]
    EVAL_METRICS_FIELD_NUMBER: _ClassVar[int]
    id: str
    status: _common_pb2.CheckpointStatus
    eval_metrics: _containers.ScalarMap[str, float]
    def __init__(self, id: _Optional[str] = ..., status: _Optional[_Union[_common_pb2.CheckpointStatus, str]] = ..., eval_metrics: _Optional[_Mapping[str, float]] = ...) -> None: ...
