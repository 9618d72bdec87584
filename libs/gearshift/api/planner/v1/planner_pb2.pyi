from gearshift.api.common.v1 import common_pb2 as _common_pb2
from google.protobuf.internal import containers as _containers
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class BeliefState(_message.Message):
    __slots__ = ("query", "history", "current_plan", "plan_progress", "transcript", "conversation", "native_messages_json", "native")
    QUERY_FIELD_NUMBER: _ClassVar[int]
    HISTORY_FIELD_NUMBER: _ClassVar[int]
    CURRENT_PLAN_FIELD_NUMBER: _ClassVar[int]
    PLAN_PROGRESS_FIELD_NUMBER: _ClassVar[int]
    TRANSCRIPT_FIELD_NUMBER: _ClassVar[int]
    CONVERSATION_FIELD_NUMBER: _ClassVar[int]
    NATIVE_MESSAGES_JSON_FIELD_NUMBER: _ClassVar[int]
    NATIVE_FIELD_NUMBER: _ClassVar[int]
    query: str
    history: _containers.RepeatedCompositeFieldContainer[_common_pb2.Turn]
    current_plan: _common_pb2.Plan
    plan_progress: int
    transcript: str
    conversation: _common_pb2.Conversation
    native_messages_json: str
    native: _common_pb2.NativeRequest
    def __init__(self, query: _Optional[str] = ..., history: _Optional[_Iterable[_Union[_common_pb2.Turn, _Mapping]]] = ..., current_plan: _Optional[_Union[_common_pb2.Plan, _Mapping]] = ..., plan_progress: _Optional[int] = ..., transcript: _Optional[str] = ..., conversation: _Optional[_Union[_common_pb2.Conversation, _Mapping]] = ..., native_messages_json: _Optional[str] = ..., native: _Optional[_Union[_common_pb2.NativeRequest, _Mapping]] = ...) -> None: ...

class RegulateRequest(_message.Message):
    __slots__ = ("state", "sampling")
    STATE_FIELD_NUMBER: _ClassVar[int]
    SAMPLING_FIELD_NUMBER: _ClassVar[int]
    state: BeliefState
    sampling: _common_pb2.Sampling
    def __init__(self, state: _Optional[_Union[BeliefState, _Mapping]] = ..., sampling: _Optional[_Union[_common_pb2.Sampling, _Mapping]] = ...) -> None: ...

class RegulateResponse(_message.Message):
    __slots__ = ("decision", "rationale", "usage", "sampled")
    DECISION_FIELD_NUMBER: _ClassVar[int]
    RATIONALE_FIELD_NUMBER: _ClassVar[int]
    USAGE_FIELD_NUMBER: _ClassVar[int]
    SAMPLED_FIELD_NUMBER: _ClassVar[int]
    decision: _common_pb2.PlanDecision
    rationale: str
    usage: _common_pb2.TokenUsage
    sampled: _common_pb2.SampledSpan
    def __init__(self, decision: _Optional[_Union[_common_pb2.PlanDecision, str]] = ..., rationale: _Optional[str] = ..., usage: _Optional[_Union[_common_pb2.TokenUsage, _Mapping]] = ..., sampled: _Optional[_Union[_common_pb2.SampledSpan, _Mapping]] = ...) -> None: ...

class PlanRequest(_message.Message):
    __slots__ = ("state", "max_horizon", "sampling")
    STATE_FIELD_NUMBER: _ClassVar[int]
    MAX_HORIZON_FIELD_NUMBER: _ClassVar[int]
    SAMPLING_FIELD_NUMBER: _ClassVar[int]
    state: BeliefState
    max_horizon: int
    sampling: _common_pb2.Sampling
    def __init__(self, state: _Optional[_Union[BeliefState, _Mapping]] = ..., max_horizon: _Optional[int] = ..., sampling: _Optional[_Union[_common_pb2.Sampling, _Mapping]] = ...) -> None: ...

class PlanResponse(_message.Message):
    __slots__ = ("plan", "text", "usage", "sampled")
    PLAN_FIELD_NUMBER: _ClassVar[int]
    TEXT_FIELD_NUMBER: _ClassVar[int]
    USAGE_FIELD_NUMBER: _ClassVar[int]
    SAMPLED_FIELD_NUMBER: _ClassVar[int]
    plan: _common_pb2.Plan
    text: str
    usage: _common_pb2.TokenUsage
    sampled: _common_pb2.SampledSpan
    def __init__(self, plan: _Optional[_Union[_common_pb2.Plan, _Mapping]] = ..., text: _Optional[str] = ..., usage: _Optional[_Union[_common_pb2.TokenUsage, _Mapping]] = ..., sampled: _Optional[_Union[_common_pb2.SampledSpan, _Mapping]] = ...) -> None: ...
