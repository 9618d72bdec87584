from gearshift.api.common.v1 import common_pb2 as _common_pb2
from google.protobuf.internal import containers as _containers
from google.protobuf.internal import enum_type_wrapper as _enum_type_wrapper
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class Verifier(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    VERIFIER_UNSPECIFIED: _ClassVar[Verifier]
    VERIFIER_MATH: _ClassVar[Verifier]
    VERIFIER_EXACT: _ClassVar[Verifier]
    VERIFIER_F1: _ClassVar[Verifier]
    VERIFIER_CHOICE: _ClassVar[Verifier]
    VERIFIER_NUMERIC: _ClassVar[Verifier]
    VERIFIER_JUDGE: _ClassVar[Verifier]
    VERIFIER_PHRASE: _ClassVar[Verifier]

class RewardKind(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    REWARD_KIND_UNSPECIFIED: _ClassVar[RewardKind]
    REWARD_KIND_APO: _ClassVar[RewardKind]
    REWARD_KIND_SR2AM: _ClassVar[RewardKind]
VERIFIER_UNSPECIFIED: Verifier
VERIFIER_MATH: Verifier
VERIFIER_EXACT: Verifier
VERIFIER_F1: Verifier
VERIFIER_CHOICE: Verifier
VERIFIER_NUMERIC: Verifier
VERIFIER_JUDGE: Verifier
VERIFIER_PHRASE: Verifier
REWARD_KIND_UNSPECIFIED: RewardKind
REWARD_KIND_APO: RewardKind
REWARD_KIND_SR2AM: RewardKind

class ScoreRequest(_message.Message):
    __slots__ = ("reference_answer", "verifier", "kind", "rollouts")
    REFERENCE_ANSWER_FIELD_NUMBER: _ClassVar[int]
    VERIFIER_FIELD_NUMBER: _ClassVar[int]
    KIND_FIELD_NUMBER: _ClassVar[int]
    ROLLOUTS_FIELD_NUMBER: _ClassVar[int]
    reference_answer: str
    verifier: Verifier
    kind: RewardKind
    rollouts: _containers.RepeatedCompositeFieldContainer[_common_pb2.Trajectory]
    def __init__(self, reference_answer: _Optional[str] = ..., verifier: _Optional[_Union[Verifier, str]] = ..., kind: _Optional[_Union[RewardKind, str]] = ..., rollouts: _Optional[_Iterable[_Union[_common_pb2.Trajectory, _Mapping]]] = ...) -> None: ...

class ScoredRollout(_message.Message):
    __slots__ = ("trajectory_id", "reward", "cost", "judge_usage")
    TRAJECTORY_ID_FIELD_NUMBER: _ClassVar[int]
    REWARD_FIELD_NUMBER: _ClassVar[int]
    COST_FIELD_NUMBER: _ClassVar[int]
    JUDGE_USAGE_FIELD_NUMBER: _ClassVar[int]
    trajectory_id: str
    reward: _common_pb2.Reward
    cost: _common_pb2.Cost
    judge_usage: _common_pb2.TokenUsage
    def __init__(self, trajectory_id: _Optional[str] = ..., reward: _Optional[_Union[_common_pb2.Reward, _Mapping]] = ..., cost: _Optional[_Union[_common_pb2.Cost, _Mapping]] = ..., judge_usage: _Optional[_Union[_common_pb2.TokenUsage, _Mapping]] = ...) -> None: ...

class ScoreResponse(_message.Message):
    __slots__ = ("scored", "forced_instant_success_rate")
    SCORED_FIELD_NUMBER: _ClassVar[int]
    FORCED_INSTANT_SUCCESS_RATE_FIELD_NUMBER: _ClassVar[int]
    scored: _containers.RepeatedCompositeFieldContainer[ScoredRollout]
    forced_instant_success_rate: float
    def __init__(self, scored: _Optional[_Iterable[_Union[ScoredRollout, _Mapping]]] = ..., forced_instant_success_rate: _Optional[float] = ...) -> None: ...

class PriceRequest(_message.Message):
    __slots__ = ("trajectory",)
    TRAJECTORY_FIELD_NUMBER: _ClassVar[int]
    trajectory: _common_pb2.Trajectory
    def __init__(self, trajectory: _Optional[_Union[_common_pb2.Trajectory, _Mapping]] = ...) -> None: ...

class Outcome(_message.Message):
    __slots__ = ("cost_usd", "correct", "item_id")
    COST_USD_FIELD_NUMBER: _ClassVar[int]
    CORRECT_FIELD_NUMBER: _ClassVar[int]
    ITEM_ID_FIELD_NUMBER: _ClassVar[int]
    cost_usd: float
    correct: bool
    item_id: str
    def __init__(self, cost_usd: _Optional[float] = ..., correct: _Optional[bool] = ..., item_id: _Optional[str] = ...) -> None: ...

class CostOfPassRequest(_message.Message):
    __slots__ = ("outcomes", "bootstrap_samples", "confidence", "seed")
    OUTCOMES_FIELD_NUMBER: _ClassVar[int]
    BOOTSTRAP_SAMPLES_FIELD_NUMBER: _ClassVar[int]
    CONFIDENCE_FIELD_NUMBER: _ClassVar[int]
    SEED_FIELD_NUMBER: _ClassVar[int]
    outcomes: _containers.RepeatedCompositeFieldContainer[Outcome]
    bootstrap_samples: int
    confidence: float
    seed: int
    def __init__(self, outcomes: _Optional[_Iterable[_Union[Outcome, _Mapping]]] = ..., bootstrap_samples: _Optional[int] = ..., confidence: _Optional[float] = ..., seed: _Optional[int] = ...) -> None: ...

class CostOfPassResponse(_message.Message):
    __slots__ = ("cost_of_pass_usd", "ci_low_usd", "ci_high_usd", "attempts", "correct", "total_cost_usd")
    COST_OF_PASS_USD_FIELD_NUMBER: _ClassVar[int]
    CI_LOW_USD_FIELD_NUMBER: _ClassVar[int]
    CI_HIGH_USD_FIELD_NUMBER: _ClassVar[int]
    ATTEMPTS_FIELD_NUMBER: _ClassVar[int]
    CORRECT_FIELD_NUMBER: _ClassVar[int]
    TOTAL_COST_USD_FIELD_NUMBER: _ClassVar[int]
    cost_of_pass_usd: float
    ci_low_usd: float
    ci_high_usd: float
    attempts: int
    correct: int
    total_cost_usd: float
    def __init__(self, cost_of_pass_usd: _Optional[float] = ..., ci_low_usd: _Optional[float] = ..., ci_high_usd: _Optional[float] = ..., attempts: _Optional[int] = ..., correct: _Optional[int] = ..., total_cost_usd: _Optional[float] = ...) -> None: ...
