import datetime

from google.protobuf import timestamp_pb2 as _timestamp_pb2
from google.protobuf.internal import containers as _containers
from google.protobuf.internal import enum_type_wrapper as _enum_type_wrapper
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class Mode(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    MODE_UNSPECIFIED: _ClassVar[Mode]
    MODE_INSTANT: _ClassVar[Mode]
    MODE_REASONING: _ClassVar[Mode]
    MODE_AGENTIC: _ClassVar[Mode]

class RoutingStrategy(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    ROUTING_STRATEGY_UNSPECIFIED: _ClassVar[RoutingStrategy]
    ROUTING_STRATEGY_MODEL: _ClassVar[RoutingStrategy]
    ROUTING_STRATEGY_FORCED: _ClassVar[RoutingStrategy]
    ROUTING_STRATEGY_LEARNED: _ClassVar[RoutingStrategy]
    ROUTING_STRATEGY_FALLBACK: _ClassVar[RoutingStrategy]

class Purpose(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    PURPOSE_UNSPECIFIED: _ClassVar[Purpose]
    PURPOSE_EVALUATION: _ClassVar[Purpose]
    PURPOSE_GATE: _ClassVar[Purpose]
    PURPOSE_TRAINING: _ClassVar[Purpose]

class ChatRole(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    CHAT_ROLE_UNSPECIFIED: _ClassVar[ChatRole]
    CHAT_ROLE_USER: _ClassVar[ChatRole]
    CHAT_ROLE_ASSISTANT: _ClassVar[ChatRole]

class PlanDecision(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    PLAN_DECISION_UNSPECIFIED: _ClassVar[PlanDecision]
    PLAN_DECISION_PLAN_NEW: _ClassVar[PlanDecision]
    PLAN_DECISION_CONTINUE: _ClassVar[PlanDecision]
    PLAN_DECISION_ACT: _ClassVar[PlanDecision]

class TrajectoryStatus(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    TRAJECTORY_STATUS_UNSPECIFIED: _ClassVar[TrajectoryStatus]
    TRAJECTORY_STATUS_COMPLETED: _ClassVar[TrajectoryStatus]
    TRAJECTORY_STATUS_BUDGET_EXHAUSTED: _ClassVar[TrajectoryStatus]
    TRAJECTORY_STATUS_CANCELLED: _ClassVar[TrajectoryStatus]
    TRAJECTORY_STATUS_FAILED: _ClassVar[TrajectoryStatus]

class PolicyProtocol(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    POLICY_PROTOCOL_UNSPECIFIED: _ClassVar[PolicyProtocol]
    POLICY_PROTOCOL_TEXT: _ClassVar[PolicyProtocol]
    POLICY_PROTOCOL_NATIVE: _ClassVar[PolicyProtocol]

class CheckpointStatus(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    CHECKPOINT_STATUS_UNSPECIFIED: _ClassVar[CheckpointStatus]
    CHECKPOINT_STATUS_CANDIDATE: _ClassVar[CheckpointStatus]
    CHECKPOINT_STATUS_PUBLISHED: _ClassVar[CheckpointStatus]
    CHECKPOINT_STATUS_REJECTED: _ClassVar[CheckpointStatus]
MODE_UNSPECIFIED: Mode
MODE_INSTANT: Mode
MODE_REASONING: Mode
MODE_AGENTIC: Mode
ROUTING_STRATEGY_UNSPECIFIED: RoutingStrategy
ROUTING_STRATEGY_MODEL: RoutingStrategy
ROUTING_STRATEGY_FORCED: RoutingStrategy
ROUTING_STRATEGY_LEARNED: RoutingStrategy
ROUTING_STRATEGY_FALLBACK: RoutingStrategy
PURPOSE_UNSPECIFIED: Purpose
PURPOSE_EVALUATION: Purpose
PURPOSE_GATE: Purpose
PURPOSE_TRAINING: Purpose
CHAT_ROLE_UNSPECIFIED: ChatRole
CHAT_ROLE_USER: ChatRole
CHAT_ROLE_ASSISTANT: ChatRole
PLAN_DECISION_UNSPECIFIED: PlanDecision
PLAN_DECISION_PLAN_NEW: PlanDecision
PLAN_DECISION_CONTINUE: PlanDecision
PLAN_DECISION_ACT: PlanDecision
TRAJECTORY_STATUS_UNSPECIFIED: TrajectoryStatus
TRAJECTORY_STATUS_COMPLETED: TrajectoryStatus
TRAJECTORY_STATUS_BUDGET_EXHAUSTED: TrajectoryStatus
TRAJECTORY_STATUS_CANCELLED: TrajectoryStatus
TRAJECTORY_STATUS_FAILED: TrajectoryStatus
POLICY_PROTOCOL_UNSPECIFIED: PolicyProtocol
POLICY_PROTOCOL_TEXT: PolicyProtocol
POLICY_PROTOCOL_NATIVE: PolicyProtocol
CHECKPOINT_STATUS_UNSPECIFIED: CheckpointStatus
CHECKPOINT_STATUS_CANDIDATE: CheckpointStatus
CHECKPOINT_STATUS_PUBLISHED: CheckpointStatus
CHECKPOINT_STATUS_REJECTED: CheckpointStatus

class Sampling(_message.Message):
    __slots__ = ("temperature", "top_p", "seed", "frequency_penalty", "presence_penalty")
    TEMPERATURE_FIELD_NUMBER: _ClassVar[int]
    TOP_P_FIELD_NUMBER: _ClassVar[int]
    SEED_FIELD_NUMBER: _ClassVar[int]
    FREQUENCY_PENALTY_FIELD_NUMBER: _ClassVar[int]
    PRESENCE_PENALTY_FIELD_NUMBER: _ClassVar[int]
    temperature: float
    top_p: float
    seed: int
    frequency_penalty: float
    presence_penalty: float
    def __init__(self, temperature: _Optional[float] = ..., top_p: _Optional[float] = ..., seed: _Optional[int] = ..., frequency_penalty: _Optional[float] = ..., presence_penalty: _Optional[float] = ...) -> None: ...

class ChatMessage(_message.Message):
    __slots__ = ("role", "content")
    ROLE_FIELD_NUMBER: _ClassVar[int]
    CONTENT_FIELD_NUMBER: _ClassVar[int]
    role: ChatRole
    content: str
    def __init__(self, role: _Optional[_Union[ChatRole, str]] = ..., content: _Optional[str] = ...) -> None: ...

class Conversation(_message.Message):
    __slots__ = ("instructions", "messages")
    INSTRUCTIONS_FIELD_NUMBER: _ClassVar[int]
    MESSAGES_FIELD_NUMBER: _ClassVar[int]
    instructions: str
    messages: _containers.RepeatedCompositeFieldContainer[ChatMessage]
    def __init__(self, instructions: _Optional[str] = ..., messages: _Optional[_Iterable[_Union[ChatMessage, _Mapping]]] = ...) -> None: ...

class TokenUsage(_message.Message):
    __slots__ = ("input_tokens", "output_tokens", "cached_input_tokens")
    INPUT_TOKENS_FIELD_NUMBER: _ClassVar[int]
    OUTPUT_TOKENS_FIELD_NUMBER: _ClassVar[int]
    CACHED_INPUT_TOKENS_FIELD_NUMBER: _ClassVar[int]
    input_tokens: int
    output_tokens: int
    cached_input_tokens: int
    def __init__(self, input_tokens: _Optional[int] = ..., output_tokens: _Optional[int] = ..., cached_input_tokens: _Optional[int] = ...) -> None: ...

class Cost(_message.Message):
    __slots__ = ("total_usd", "input_usd", "output_usd", "tools_usd", "sandbox_usd", "flat_total_usd")
    TOTAL_USD_FIELD_NUMBER: _ClassVar[int]
    INPUT_USD_FIELD_NUMBER: _ClassVar[int]
    OUTPUT_USD_FIELD_NUMBER: _ClassVar[int]
    TOOLS_USD_FIELD_NUMBER: _ClassVar[int]
    SANDBOX_USD_FIELD_NUMBER: _ClassVar[int]
    FLAT_TOTAL_USD_FIELD_NUMBER: _ClassVar[int]
    total_usd: float
    input_usd: float
    output_usd: float
    tools_usd: float
    sandbox_usd: float
    flat_total_usd: float
    def __init__(self, total_usd: _Optional[float] = ..., input_usd: _Optional[float] = ..., output_usd: _Optional[float] = ..., tools_usd: _Optional[float] = ..., sandbox_usd: _Optional[float] = ..., flat_total_usd: _Optional[float] = ...) -> None: ...

class ToolCall(_message.Message):
    __slots__ = ("id", "name", "arguments_json")
    ID_FIELD_NUMBER: _ClassVar[int]
    NAME_FIELD_NUMBER: _ClassVar[int]
    ARGUMENTS_JSON_FIELD_NUMBER: _ClassVar[int]
    id: str
    name: str
    arguments_json: str
    def __init__(self, id: _Optional[str] = ..., name: _Optional[str] = ..., arguments_json: _Optional[str] = ...) -> None: ...

class ToolResult(_message.Message):
    __slots__ = ("call_id", "name", "output", "is_error", "error", "wall_seconds", "cpu_seconds", "truncated")
    CALL_ID_FIELD_NUMBER: _ClassVar[int]
    NAME_FIELD_NUMBER: _ClassVar[int]
    OUTPUT_FIELD_NUMBER: _ClassVar[int]
    IS_ERROR_FIELD_NUMBER: _ClassVar[int]
    ERROR_FIELD_NUMBER: _ClassVar[int]
    WALL_SECONDS_FIELD_NUMBER: _ClassVar[int]
    CPU_SECONDS_FIELD_NUMBER: _ClassVar[int]
    TRUNCATED_FIELD_NUMBER: _ClassVar[int]
    call_id: str
    name: str
    output: str
    is_error: bool
    error: str
    wall_seconds: float
    cpu_seconds: float
    truncated: bool
    def __init__(self, call_id: _Optional[str] = ..., name: _Optional[str] = ..., output: _Optional[str] = ..., is_error: _Optional[bool] = ..., error: _Optional[str] = ..., wall_seconds: _Optional[float] = ..., cpu_seconds: _Optional[float] = ..., truncated: _Optional[bool] = ...) -> None: ...

class PlanStep(_message.Message):
    __slots__ = ("state", "action", "expected_outcome")
    STATE_FIELD_NUMBER: _ClassVar[int]
    ACTION_FIELD_NUMBER: _ClassVar[int]
    EXPECTED_OUTCOME_FIELD_NUMBER: _ClassVar[int]
    state: str
    action: str
    expected_outcome: str
    def __init__(self, state: _Optional[str] = ..., action: _Optional[str] = ..., expected_outcome: _Optional[str] = ...) -> None: ...

class Plan(_message.Message):
    __slots__ = ("steps",)
    STEPS_FIELD_NUMBER: _ClassVar[int]
    steps: _containers.RepeatedCompositeFieldContainer[PlanStep]
    def __init__(self, steps: _Optional[_Iterable[_Union[PlanStep, _Mapping]]] = ...) -> None: ...

class Turn(_message.Message):
    __slots__ = ("index", "plan_decision", "plan", "output", "tool_calls", "tool_results", "usage", "wall_seconds", "injected_spans", "sampled", "reasoning_content", "token_ids", "token_logprobs")
    INDEX_FIELD_NUMBER: _ClassVar[int]
    PLAN_DECISION_FIELD_NUMBER: _ClassVar[int]
    PLAN_FIELD_NUMBER: _ClassVar[int]
    OUTPUT_FIELD_NUMBER: _ClassVar[int]
    TOOL_CALLS_FIELD_NUMBER: _ClassVar[int]
    TOOL_RESULTS_FIELD_NUMBER: _ClassVar[int]
    USAGE_FIELD_NUMBER: _ClassVar[int]
    WALL_SECONDS_FIELD_NUMBER: _ClassVar[int]
    INJECTED_SPANS_FIELD_NUMBER: _ClassVar[int]
    SAMPLED_FIELD_NUMBER: _ClassVar[int]
    REASONING_CONTENT_FIELD_NUMBER: _ClassVar[int]
    TOKEN_IDS_FIELD_NUMBER: _ClassVar[int]
    TOKEN_LOGPROBS_FIELD_NUMBER: _ClassVar[int]
    index: int
    plan_decision: PlanDecision
    plan: Plan
    output: str
    tool_calls: _containers.RepeatedCompositeFieldContainer[ToolCall]
    tool_results: _containers.RepeatedCompositeFieldContainer[ToolResult]
    usage: TokenUsage
    wall_seconds: float
    injected_spans: _containers.RepeatedScalarFieldContainer[int]
    sampled: _containers.RepeatedCompositeFieldContainer[SampledSpan]
    reasoning_content: str
    token_ids: _containers.RepeatedScalarFieldContainer[int]
    token_logprobs: _containers.RepeatedScalarFieldContainer[float]
    def __init__(self, index: _Optional[int] = ..., plan_decision: _Optional[_Union[PlanDecision, str]] = ..., plan: _Optional[_Union[Plan, _Mapping]] = ..., output: _Optional[str] = ..., tool_calls: _Optional[_Iterable[_Union[ToolCall, _Mapping]]] = ..., tool_results: _Optional[_Iterable[_Union[ToolResult, _Mapping]]] = ..., usage: _Optional[_Union[TokenUsage, _Mapping]] = ..., wall_seconds: _Optional[float] = ..., injected_spans: _Optional[_Iterable[int]] = ..., sampled: _Optional[_Iterable[_Union[SampledSpan, _Mapping]]] = ..., reasoning_content: _Optional[str] = ..., token_ids: _Optional[_Iterable[int]] = ..., token_logprobs: _Optional[_Iterable[float]] = ...) -> None: ...

class SampledSpan(_message.Message):
    __slots__ = ("start", "end", "token_ids", "logprobs")
    START_FIELD_NUMBER: _ClassVar[int]
    END_FIELD_NUMBER: _ClassVar[int]
    TOKEN_IDS_FIELD_NUMBER: _ClassVar[int]
    LOGPROBS_FIELD_NUMBER: _ClassVar[int]
    start: int
    end: int
    token_ids: _containers.RepeatedScalarFieldContainer[int]
    logprobs: _containers.RepeatedScalarFieldContainer[float]
    def __init__(self, start: _Optional[int] = ..., end: _Optional[int] = ..., token_ids: _Optional[_Iterable[int]] = ..., logprobs: _Optional[_Iterable[float]] = ...) -> None: ...

class NativeRequest(_message.Message):
    __slots__ = ("tools_json", "chat_template_kwargs_json")
    TOOLS_JSON_FIELD_NUMBER: _ClassVar[int]
    CHAT_TEMPLATE_KWARGS_JSON_FIELD_NUMBER: _ClassVar[int]
    tools_json: str
    chat_template_kwargs_json: str
    def __init__(self, tools_json: _Optional[str] = ..., chat_template_kwargs_json: _Optional[str] = ...) -> None: ...

class Reward(_message.Message):
    __slots__ = ("value", "correct", "format_valid", "kind", "verifier", "components")
    class ComponentsEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: float
        def __init__(self, key: _Optional[str] = ..., value: _Optional[float] = ...) -> None: ...
    VALUE_FIELD_NUMBER: _ClassVar[int]
    CORRECT_FIELD_NUMBER: _ClassVar[int]
    FORMAT_VALID_FIELD_NUMBER: _ClassVar[int]
    KIND_FIELD_NUMBER: _ClassVar[int]
    VERIFIER_FIELD_NUMBER: _ClassVar[int]
    COMPONENTS_FIELD_NUMBER: _ClassVar[int]
    value: float
    correct: bool
    format_valid: bool
    kind: str
    verifier: str
    components: _containers.ScalarMap[str, float]
    def __init__(self, value: _Optional[float] = ..., correct: _Optional[bool] = ..., format_valid: _Optional[bool] = ..., kind: _Optional[str] = ..., verifier: _Optional[str] = ..., components: _Optional[_Mapping[str, float]] = ...) -> None: ...

class PlanningStats(_message.Message):
    __slots__ = ("planning_frequency", "mean_plan_depth", "reasoning_tokens")
    PLANNING_FREQUENCY_FIELD_NUMBER: _ClassVar[int]
    MEAN_PLAN_DEPTH_FIELD_NUMBER: _ClassVar[int]
    REASONING_TOKENS_FIELD_NUMBER: _ClassVar[int]
    planning_frequency: float
    mean_plan_depth: float
    reasoning_tokens: int
    def __init__(self, planning_frequency: _Optional[float] = ..., mean_plan_depth: _Optional[float] = ..., reasoning_tokens: _Optional[int] = ...) -> None: ...

class Trajectory(_message.Message):
    __slots__ = ("id", "query", "mode", "requested_mode", "routing_strategy", "routing_rationale", "turns", "answer", "reference_answer", "status", "usage", "cost", "reward", "planning", "task_source", "split", "run_id", "model_version", "labels", "created_at", "wall_seconds", "purpose", "routing_sampled", "conversation", "protocol", "native")
    class LabelsEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: str
        def __init__(self, key: _Optional[str] = ..., value: _Optional[str] = ...) -> None: ...
    ID_FIELD_NUMBER: _ClassVar[int]
    QUERY_FIELD_NUMBER: _ClassVar[int]
    MODE_FIELD_NUMBER: _ClassVar[int]
    REQUESTED_MODE_FIELD_NUMBER: _ClassVar[int]
    ROUTING_STRATEGY_FIELD_NUMBER: _ClassVar[int]
    ROUTING_RATIONALE_FIELD_NUMBER: _ClassVar[int]
    TURNS_FIELD_NUMBER: _ClassVar[int]
    ANSWER_FIELD_NUMBER: _ClassVar[int]
    REFERENCE_ANSWER_FIELD_NUMBER: _ClassVar[int]
    STATUS_FIELD_NUMBER: _ClassVar[int]
    USAGE_FIELD_NUMBER: _ClassVar[int]
    COST_FIELD_NUMBER: _ClassVar[int]
    REWARD_FIELD_NUMBER: _ClassVar[int]
    PLANNING_FIELD_NUMBER: _ClassVar[int]
    TASK_SOURCE_FIELD_NUMBER: _ClassVar[int]
    SPLIT_FIELD_NUMBER: _ClassVar[int]
    RUN_ID_FIELD_NUMBER: _ClassVar[int]
    MODEL_VERSION_FIELD_NUMBER: _ClassVar[int]
    LABELS_FIELD_NUMBER: _ClassVar[int]
    CREATED_AT_FIELD_NUMBER: _ClassVar[int]
    WALL_SECONDS_FIELD_NUMBER: _ClassVar[int]
    PURPOSE_FIELD_NUMBER: _ClassVar[int]
    ROUTING_SAMPLED_FIELD_NUMBER: _ClassVar[int]
    CONVERSATION_FIELD_NUMBER: _ClassVar[int]
    PROTOCOL_FIELD_NUMBER: _ClassVar[int]
    NATIVE_FIELD_NUMBER: _ClassVar[int]
    id: str
    query: str
    mode: Mode
    requested_mode: Mode
    routing_strategy: RoutingStrategy
    routing_rationale: str
    turns: _containers.RepeatedCompositeFieldContainer[Turn]
    answer: str
    reference_answer: str
    status: TrajectoryStatus
    usage: TokenUsage
    cost: Cost
    reward: Reward
    planning: PlanningStats
    task_source: str
    split: str
    run_id: str
    model_version: str
    labels: _containers.ScalarMap[str, str]
    created_at: _timestamp_pb2.Timestamp
    wall_seconds: float
    purpose: Purpose
    routing_sampled: _containers.RepeatedCompositeFieldContainer[SampledSpan]
    conversation: Conversation
    protocol: PolicyProtocol
    native: NativeRequest
    def __init__(self, id: _Optional[str] = ..., query: _Optional[str] = ..., mode: _Optional[_Union[Mode, str]] = ..., requested_mode: _Optional[_Union[Mode, str]] = ..., routing_strategy: _Optional[_Union[RoutingStrategy, str]] = ..., routing_rationale: _Optional[str] = ..., turns: _Optional[_Iterable[_Union[Turn, _Mapping]]] = ..., answer: _Optional[str] = ..., reference_answer: _Optional[str] = ..., status: _Optional[_Union[TrajectoryStatus, str]] = ..., usage: _Optional[_Union[TokenUsage, _Mapping]] = ..., cost: _Optional[_Union[Cost, _Mapping]] = ..., reward: _Optional[_Union[Reward, _Mapping]] = ..., planning: _Optional[_Union[PlanningStats, _Mapping]] = ..., task_source: _Optional[str] = ..., split: _Optional[str] = ..., run_id: _Optional[str] = ..., model_version: _Optional[str] = ..., labels: _Optional[_Mapping[str, str]] = ..., created_at: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ..., wall_seconds: _Optional[float] = ..., purpose: _Optional[_Union[Purpose, str]] = ..., routing_sampled: _Optional[_Iterable[_Union[SampledSpan, _Mapping]]] = ..., conversation: _Optional[_Union[Conversation, _Mapping]] = ..., protocol: _Optional[_Union[PolicyProtocol, str]] = ..., native: _Optional[_Union[NativeRequest, _Mapping]] = ...) -> None: ...

class Checkpoint(_message.Message):
    __slots__ = ("id", "kind", "uri", "parent_id", "job", "config_json", "code_version", "dataset_snapshot", "trajectory_ids", "eval_metrics", "status", "created_at")
    class EvalMetricsEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: float
        def __init__(self, key: _Optional[str] = ..., value: _Optional[float] = ...) -> None: ...
    ID_FIELD_NUMBER: _ClassVar[int]
    KIND_FIELD_NUMBER: _ClassVar[int]
    URI_FIELD_NUMBER: _ClassVar[int]
    PARENT_ID_FIELD_NUMBER: _ClassVar[int]
    JOB_FIELD_NUMBER: _ClassVar[int]
    CONFIG_JSON_FIELD_NUMBER: _ClassVar[int]
    CODE_VERSION_FIELD_NUMBER: _ClassVar[int]
    DATASET_SNAPSHOT_FIELD_NUMBER: _ClassVar[int]
    TRAJECTORY_IDS_FIELD_NUMBER: _ClassVar[int]
    EVAL_METRICS_FIELD_NUMBER: _ClassVar[int]
    STATUS_FIELD_NUMBER: _ClassVar[int]
    CREATED_AT_FIELD_NUMBER: _ClassVar[int]
    id: str
    kind: str
    uri: str
    parent_id: str
    job: str
    config_json: str
    code_version: str
    dataset_snapshot: str
    trajectory_ids: _containers.RepeatedScalarFieldContainer[str]
    eval_metrics: _containers.ScalarMap[str, float]
    status: CheckpointStatus
    created_at: _timestamp_pb2.Timestamp
    def __init__(self, id: _Optional[str] = ..., kind: _Optional[str] = ..., uri: _Optional[str] = ..., parent_id: _Optional[str] = ..., job: _Optional[str] = ..., config_json: _Optional[str] = ..., code_version: _Optional[str] = ..., dataset_snapshot: _Optional[str] = ..., trajectory_ids: _Optional[_Iterable[str]] = ..., eval_metrics: _Optional[_Mapping[str, float]] = ..., status: _Optional[_Union[CheckpointStatus, str]] = ..., created_at: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ...) -> None: ...
