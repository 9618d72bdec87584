from gearshift.api.common.v1 import common_pb2 as _common_pb2
from google.protobuf.internal import containers as _containers
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class RouteRequest(_message.Message):
    __slots__ = ("query", "strategy", "forced_mode", "sampling", "conversation")
    QUERY_FIELD_NUMBER: _ClassVar[int]
    STRATEGY_FIELD_NUMBER: _ClassVar[int]
    FORCED_MODE_FIELD_NUMBER: _ClassVar[int]
    SAMPLING_FIELD_NUMBER: _ClassVar[int]
    CONVERSATION_FIELD_NUMBER: _ClassVar[int]
    query: str
    strategy: _common_pb2.RoutingStrategy
    forced_mode: _common_pb2.Mode
    sampling: _common_pb2.Sampling
    conversation: _common_pb2.Conversation
    def __init__(self, query: _Optional[str] = ..., strategy: _Optional[_Union[_common_pb2.RoutingStrategy, str]] = ..., forced_mode: _Optional[_Union[_common_pb2.Mode, str]] = ..., sampling: _Optional[_Union[_common_pb2.Sampling, _Mapping]] = ..., conversation: _Optional[_Union[_common_pb2.Conversation, _Mapping]] = ...) -> None: ...

class ModeScore(_message.Message):
    __slots__ = ("mode", "score", "expected_cost_of_pass_usd")
    MODE_FIELD_NUMBER: _ClassVar[int]
    SCORE_FIELD_NUMBER: _ClassVar[int]
    EXPECTED_COST_OF_PASS_USD_FIELD_NUMBER: _ClassVar[int]
    mode: _common_pb2.Mode
    score: float
    expected_cost_of_pass_usd: float
    def __init__(self, mode: _Optional[_Union[_common_pb2.Mode, str]] = ..., score: _Optional[float] = ..., expected_cost_of_pass_usd: _Optional[float] = ...) -> None: ...

class RouteResponse(_message.Message):
    __slots__ = ("mode", "strategy", "rationale", "scores", "usage", "assistant_prefix", "attempts", "router_version", "sampled")
    MODE_FIELD_NUMBER: _ClassVar[int]
    STRATEGY_FIELD_NUMBER: _ClassVar[int]
    RATIONALE_FIELD_NUMBER: _ClassVar[int]
    SCORES_FIELD_NUMBER: _ClassVar[int]
    USAGE_FIELD_NUMBER: _ClassVar[int]
    ASSISTANT_PREFIX_FIELD_NUMBER: _ClassVar[int]
    ATTEMPTS_FIELD_NUMBER: _ClassVar[int]
    ROUTER_VERSION_FIELD_NUMBER: _ClassVar[int]
    SAMPLED_FIELD_NUMBER: _ClassVar[int]
    mode: _common_pb2.Mode
    strategy: _common_pb2.RoutingStrategy
    rationale: str
    scores: _containers.RepeatedCompositeFieldContainer[ModeScore]
    usage: _common_pb2.TokenUsage
    assistant_prefix: str
    attempts: int
    router_version: str
    sampled: _common_pb2.SampledSpan
    def __init__(self, mode: _Optional[_Union[_common_pb2.Mode, str]] = ..., strategy: _Optional[_Union[_common_pb2.RoutingStrategy, str]] = ..., rationale: _Optional[str] = ..., scores: _Optional[_Iterable[_Union[ModeScore, _Mapping]]] = ..., usage: _Optional[_Union[_common_pb2.TokenUsage, _Mapping]] = ..., assistant_prefix: _Optional[str] = ..., attempts: _Optional[int] = ..., router_version: _Optional[str] = ..., sampled: _Optional[_Union[_common_pb2.SampledSpan, _Mapping]] = ...) -> None: ...
