from gearshift.api.common.v1 import common_pb2 as _common_pb2
from google.protobuf.internal import containers as _containers
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class Budget(_message.Message):
    __slots__ = ("max_steps", "max_tokens", "max_wall_seconds", "max_output_tokens")
    MAX_STEPS_FIELD_NUMBER: _ClassVar[int]
    MAX_TOKENS_FIELD_NUMBER: _ClassVar[int]
    MAX_WALL_SECONDS_FIELD_NUMBER: _ClassVar[int]
    MAX_OUTPUT_TOKENS_FIELD_NUMBER: _ClassVar[int]
    max_steps: int
    max_tokens: int
    max_wall_seconds: float
    max_output_tokens: int
    def __init__(self, max_steps: _Optional[int] = ..., max_tokens: _Optional[int] = ..., max_wall_seconds: _Optional[float] = ..., max_output_tokens: _Optional[int] = ...) -> None: ...

class SolveRequest(_message.Message):
    __slots__ = ("query", "mode", "strategy", "budget", "reference_answer", "trajectory_id", "task_source", "split", "run_id", "labels", "purpose", "sampling", "conversation")
    class LabelsEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: str
        def __init__(self, key: _Optional[str] = ..., value: _Optional[str] = ...) -> None: ...
    QUERY_FIELD_NUMBER: _ClassVar[int]
    MODE_FIELD_NUMBER: _ClassVar[int]
    STRATEGY_FIELD_NUMBER: _ClassVar[int]
    BUDGET_FIELD_NUMBER: _ClassVar[int]
    REFERENCE_ANSWER_FIELD_NUMBER: _ClassVar[int]
    TRAJECTORY_ID_FIELD_NUMBER: _ClassVar[int]
    TASK_SOURCE_FIELD_NUMBER: _ClassVar[int]
    SPLIT_FIELD_NUMBER: _ClassVar[int]
    RUN_ID_FIELD_NUMBER: _ClassVar[int]
    LABELS_FIELD_NUMBER: _ClassVar[int]
    PURPOSE_FIELD_NUMBER: _ClassVar[int]
    SAMPLING_FIELD_NUMBER: _ClassVar[int]
    CONVERSATION_FIELD_NUMBER: _ClassVar[int]
    query: str
    mode: _common_pb2.Mode
    strategy: _common_pb2.RoutingStrategy
    budget: Budget
    reference_answer: str
    trajectory_id: str
    task_source: str
    split: str
    run_id: str
    labels: _containers.ScalarMap[str, str]
    purpose: _common_pb2.Purpose
    sampling: _common_pb2.Sampling
    conversation: _common_pb2.Conversation
    def __init__(self, query: _Optional[str] = ..., mode: _Optional[_Union[_common_pb2.Mode, str]] = ..., strategy: _Optional[_Union[_common_pb2.RoutingStrategy, str]] = ..., budget: _Optional[_Union[Budget, _Mapping]] = ..., reference_answer: _Optional[str] = ..., trajectory_id: _Optional[str] = ..., task_source: _Optional[str] = ..., split: _Optional[str] = ..., run_id: _Optional[str] = ..., labels: _Optional[_Mapping[str, str]] = ..., purpose: _Optional[_Union[_common_pb2.Purpose, str]] = ..., sampling: _Optional[_Union[_common_pb2.Sampling, _Mapping]] = ..., conversation: _Optional[_Union[_common_pb2.Conversation, _Mapping]] = ...) -> None: ...

class ModeChosen(_message.Message):
    __slots__ = ("mode", "strategy", "rationale")
    MODE_FIELD_NUMBER: _ClassVar[int]
    STRATEGY_FIELD_NUMBER: _ClassVar[int]
    RATIONALE_FIELD_NUMBER: _ClassVar[int]
    mode: _common_pb2.Mode
    strategy: _common_pb2.RoutingStrategy
    rationale: str
    def __init__(self, mode: _Optional[_Union[_common_pb2.Mode, str]] = ..., strategy: _Optional[_Union[_common_pb2.RoutingStrategy, str]] = ..., rationale: _Optional[str] = ...) -> None: ...

class PlanMade(_message.Message):
    __slots__ = ("decision", "plan")
    DECISION_FIELD_NUMBER: _ClassVar[int]
    PLAN_FIELD_NUMBER: _ClassVar[int]
    decision: _common_pb2.PlanDecision
    plan: _common_pb2.Plan
    def __init__(self, decision: _Optional[_Union[_common_pb2.PlanDecision, str]] = ..., plan: _Optional[_Union[_common_pb2.Plan, _Mapping]] = ...) -> None: ...

class OutputChunk(_message.Message):
    __slots__ = ("text", "reasoning", "answer")
    TEXT_FIELD_NUMBER: _ClassVar[int]
    REASONING_FIELD_NUMBER: _ClassVar[int]
    ANSWER_FIELD_NUMBER: _ClassVar[int]
    text: str
    reasoning: str
    answer: str
    def __init__(self, text: _Optional[str] = ..., reasoning: _Optional[str] = ..., answer: _Optional[str] = ...) -> None: ...

class Answer(_message.Message):
    __slots__ = ("text",)
    TEXT_FIELD_NUMBER: _ClassVar[int]
    text: str
    def __init__(self, text: _Optional[str] = ...) -> None: ...

class AnswerAsked(_message.Message):
    __slots__ = ("opener",)
    OPENER_FIELD_NUMBER: _ClassVar[int]
    opener: str
    def __init__(self, opener: _Optional[str] = ...) -> None: ...

class Final(_message.Message):
    __slots__ = ("trajectory",)
    TRAJECTORY_FIELD_NUMBER: _ClassVar[int]
    trajectory: _common_pb2.Trajectory
    def __init__(self, trajectory: _Optional[_Union[_common_pb2.Trajectory, _Mapping]] = ...) -> None: ...

class SolveEvent(_message.Message):
    __slots__ = ("turn", "mode_chosen", "plan", "chunk", "tool_call", "tool_result", "answer", "final", "answer_asked")
    TURN_FIELD_NUMBER: _ClassVar[int]
    MODE_CHOSEN_FIELD_NUMBER: _ClassVar[int]
    PLAN_FIELD_NUMBER: _ClassVar[int]
    CHUNK_FIELD_NUMBER: _ClassVar[int]
    TOOL_CALL_FIELD_NUMBER: _ClassVar[int]
    TOOL_RESULT_FIELD_NUMBER: _ClassVar[int]
    ANSWER_FIELD_NUMBER: _ClassVar[int]
    FINAL_FIELD_NUMBER: _ClassVar[int]
    ANSWER_ASKED_FIELD_NUMBER: _ClassVar[int]
    turn: int
    mode_chosen: ModeChosen
    plan: PlanMade
    chunk: OutputChunk
    tool_call: _common_pb2.ToolCall
    tool_result: _common_pb2.ToolResult
    answer: Answer
    final: Final
    answer_asked: AnswerAsked
    def __init__(self, turn: _Optional[int] = ..., mode_chosen: _Optional[_Union[ModeChosen, _Mapping]] = ..., plan: _Optional[_Union[PlanMade, _Mapping]] = ..., chunk: _Optional[_Union[OutputChunk, _Mapping]] = ..., tool_call: _Optional[_Union[_common_pb2.ToolCall, _Mapping]] = ..., tool_result: _Optional[_Union[_common_pb2.ToolResult, _Mapping]] = ..., answer: _Optional[_Union[Answer, _Mapping]] = ..., final: _Optional[_Union[Final, _Mapping]] = ..., answer_asked: _Optional[_Union[AnswerAsked, _Mapping]] = ...) -> None: ...
