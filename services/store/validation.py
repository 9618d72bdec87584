"""Input checks of the store: every refusal is an InvalidArgument that names the field."""

from __future__ import annotations

import json
import math
import re

from gearshift.api.common.v1.common_pb2 import (
    Checkpoint,
    CheckpointStatus,
    Mode,
    PlanDecision,
    Purpose,
    Reward,
    RoutingStrategy,
    Trajectory,
    TrajectoryStatus,
)
from gearshift.errors import InvalidArgument
from gearshift.settings import Limits, StoreSettings
from gearshift.storage.models import CHECKPOINT_ID_CHARS
from gearshift.storage.repository import Correctness, TrajectoryFilter
from google.protobuf.timestamp_pb2 import Timestamp

MODES = frozenset(Mode.values())
STRATEGIES = frozenset(RoutingStrategy.values())
PLAN_DECISIONS = frozenset(PlanDecision.values())
STATUSES = frozenset(TrajectoryStatus.values()) - {TrajectoryStatus.TRAJECTORY_STATUS_UNSPECIFIED}
PURPOSES = frozenset(Purpose.values())
CHECKPOINT_STATUSES = frozenset(CheckpointStatus.values())
CHECKPOINT_KINDS = ("policy", "router")

_UUID = re.compile(r"[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}")
# google.protobuf.Timestamp's valid range: 0001-01-01 to 9999-12-31.
_MIN_SECONDS, _MAX_SECONDS = -62_135_596_800, 253_402_300_799
_LABELS = ("task_source", "split", "run_id", "model_version")


def check_trajectory_id(value: str, field: str = "id") -> None:
    if not value:
        raise InvalidArgument(f"{field} is empty")
    if not _UUID.fullmatch(value):
        raise InvalidArgument(f"{field} {value[:64]!r} is not a UUID in canonical lowercase form")


def check_label(value: str, field: str, max_chars: int) -> None:
    """Short texts stored in indexed columns: bounded, and no NUL (Postgres text refuses it)."""
    if len(value) > max_chars:
        raise InvalidArgument(f"{field} longer than {max_chars} characters")
    if "\x00" in value:
        raise InvalidArgument(f"{field} contains a NUL character")


def check_timestamp(value: Timestamp, field: str) -> None:
    if not (_MIN_SECONDS <= value.seconds <= _MAX_SECONDS and 0 <= value.nanos < 1_000_000_000):
        raise InvalidArgument(f"{field} is not a valid timestamp")


def check_finite(value: float, field: str) -> None:
    if not math.isfinite(value):
        raise InvalidArgument(f"{field} is not a finite number")


def check_enum(value: int, valid: frozenset[int], field: str) -> None:
    if value not in valid:
        raise InvalidArgument(f"{field} has unknown value {value}")


def check_reward(reward: Reward, field: str = "reward") -> None:
    check_finite(reward.value, f"{field}.value")
    for name, value in reward.components.items():
        check_finite(value, f"{field}.components[{name[:64]!r}]")


def check_trajectory(trajectory: Trajectory, limits: Limits, store: StoreSettings) -> None:
    """Everything Put requires of one trajectory."""
    check_trajectory_id(trajectory.id)
    if not trajectory.query.strip():
        raise InvalidArgument("query is empty")
    if len(trajectory.query) > limits.max_query_chars:
        raise InvalidArgument(f"query longer than {limits.max_query_chars} characters")
    if len(trajectory.answer) > limits.max_answer_chars:
        raise InvalidArgument(f"answer longer than {limits.max_answer_chars} characters")
    if len(trajectory.reference_answer) > limits.max_answer_chars:
        raise InvalidArgument(f"reference_answer longer than {limits.max_answer_chars} characters")
    if len(trajectory.turns) > limits.max_turns:
        raise InvalidArgument(f"more than {limits.max_turns} turns")
    if trajectory.status == TrajectoryStatus.TRAJECTORY_STATUS_UNSPECIFIED:
        raise InvalidArgument("status is UNSPECIFIED")
    check_enum(trajectory.status, STATUSES, "status")
    check_enum(trajectory.mode, MODES, "mode")
    check_enum(trajectory.requested_mode, MODES, "requested_mode")
    check_enum(trajectory.routing_strategy, STRATEGIES, "routing_strategy")
    check_enum(trajectory.purpose, PURPOSES, "purpose")
    for turn in trajectory.turns:
        check_enum(turn.plan_decision, PLAN_DECISIONS, f"turns[{turn.index}].plan_decision")
    for field in _LABELS:
        check_label(getattr(trajectory, field), field, store.max_label_chars)
    if trajectory.HasField("reward"):
        check_reward(trajectory.reward)
    if trajectory.HasField("created_at"):
        check_timestamp(trajectory.created_at, "created_at")


def check_filter(flt: TrajectoryFilter, store: StoreSettings) -> None:
    """Refuses unknown values and filters that can match nothing."""
    for mode in flt.modes:
        check_enum(mode, MODES, "filter.modes")
    for status in flt.statuses:
        check_enum(status, STATUSES, "filter.statuses")
    for purpose in flt.purposes:
        check_enum(purpose, PURPOSES, "filter.purposes")
    for field in ("min_reward", "max_reward"):
        value = getattr(flt, field)
        if value is not None:
            check_finite(value, f"filter.{field}")
    if flt.min_reward is not None and flt.max_reward is not None and flt.min_reward > flt.max_reward:
        raise InvalidArgument("impossible filter: min_reward > max_reward")
    scored_only = flt.min_reward is not None or flt.max_reward is not None
    if scored_only and flt.correctness is Correctness.UNSCORED:
        raise InvalidArgument("impossible filter: a reward range matches only scored trajectories, not UNSCORED")
    if flt.feedback_only and flt.correctness is Correctness.UNSCORED:
        raise InvalidArgument("impossible filter: feedback_only matches only scored trajectories, not UNSCORED")
    after, before = flt.created_after_us, flt.created_before_us
    if after is not None and before is not None and after >= before:
        raise InvalidArgument("impossible filter: created_after is not before created_before")
    for field in _LABELS:
        check_label(getattr(flt, field), f"filter.{field}", store.max_label_chars)


def check_checkpoint_id(value: str, field: str = "id") -> None:
    if not value.strip():
        raise InvalidArgument(f"{field} is empty")
    check_label(value, field, CHECKPOINT_ID_CHARS)


def check_metrics(metrics: dict[str, float], store: StoreSettings) -> None:
    for name, value in metrics.items():
        check_label(name, "eval_metrics key", store.max_label_chars)
        check_finite(value, f"eval_metrics[{name[:64]!r}]")


def check_new_checkpoint(checkpoint: Checkpoint, store: StoreSettings) -> None:
    """Everything RegisterCheckpoint requires."""
    check_checkpoint_id(checkpoint.id)
    if checkpoint.kind not in CHECKPOINT_KINDS:
        raise InvalidArgument(f"kind must be one of {', '.join(CHECKPOINT_KINDS)}, not {checkpoint.kind[:64]!r}")
    if not checkpoint.uri.strip():
        raise InvalidArgument("uri is empty")
    if checkpoint.parent_id:
        check_checkpoint_id(checkpoint.parent_id, "parent_id")
        if checkpoint.parent_id == checkpoint.id:
            raise InvalidArgument("a checkpoint cannot be its own parent")
    for field in ("uri", "job", "code_version", "dataset_snapshot"):
        check_label(getattr(checkpoint, field), field, store.max_label_chars * 16)
    check_label(checkpoint.config_json, "config_json", 1_000_000)
    if checkpoint.config_json:
        try:
            json.loads(checkpoint.config_json)
        except ValueError as exc:
            raise InvalidArgument(f"config_json is not JSON: {exc}") from None
    check_enum(checkpoint.status, CHECKPOINT_STATUSES, "status")
    check_metrics(dict(checkpoint.eval_metrics), store)
    if len(checkpoint.trajectory_ids) > store.max_lineage:
        raise InvalidArgument(f"more than {store.max_lineage} lineage trajectory ids")
    for index, trajectory_id in enumerate(checkpoint.trajectory_ids):
        check_trajectory_id(trajectory_id, f"trajectory_ids[{index}]")
