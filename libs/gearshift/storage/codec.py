"""Trajectories and checkpoints <-> table rows."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from google.protobuf.timestamp_pb2 import Timestamp

from gearshift.api.common.v1.common_pb2 import Checkpoint, Reward, Trajectory
from gearshift.rewards.feedback import is_feedback


def microseconds(stamp: Timestamp) -> int:
    """Timestamp.ToMicroseconds, without its per-call overhead (it sits on the ingest path)."""
    return stamp.seconds * 1_000_000 + stamp.nanos // 1_000


def trajectory_row(trajectory: Trajectory) -> dict[str, Any]:
    """The row for a trajectory; created_at must be set (the store fills it in on Put)."""
    scored = trajectory.HasField("reward")
    reward = trajectory.reward
    return {
        "id": trajectory.id,
        "mode": trajectory.mode,
        "status": trajectory.status,
        "correct": reward.correct if scored else None,
        "reward_value": reward.value if scored else None,
        "task_source": trajectory.task_source,
        "split": trajectory.split,
        "run_id": trajectory.run_id,
        "model_version": trajectory.model_version,
        "purpose": trajectory.purpose,
        "feedback": scored and is_feedback(reward.verifier),
        "created_at_us": microseconds(trajectory.created_at),
        "reward": reward.SerializeToString() if scored else None,
        "payload": trajectory.SerializeToString(),
    }


def trajectory_from_row(payload: bytes, reward: bytes | None, include_turns: bool) -> Trajectory:
    """The stored trajectory, with the reward column (the truth for the reward) applied."""
    trajectory = Trajectory.FromString(payload)
    if reward is None:
        trajectory.ClearField("reward")
    else:
        trajectory.reward.ParseFromString(reward)
    if not include_turns:
        trajectory.ClearField("turns")
    return trajectory


def reward_columns(reward: Reward) -> dict[str, Any]:
    """The columns SetReward changes."""
    return {"correct": reward.correct, "reward_value": reward.value, "feedback": is_feedback(reward.verifier),
            "reward": reward.SerializeToString()}


def checkpoint_row(checkpoint: Checkpoint, created_at_us: int) -> dict[str, Any]:
    return {
        "id": checkpoint.id,
        "kind": checkpoint.kind,
        "uri": checkpoint.uri,
        "parent_id": checkpoint.parent_id or None,
        "job": checkpoint.job,
        "config_json": checkpoint.config_json,
        "code_version": checkpoint.code_version,
        "dataset_snapshot": checkpoint.dataset_snapshot,
        "eval_metrics": dict(checkpoint.eval_metrics),
        "status": checkpoint.status,
        "created_at_us": created_at_us,
        "status_at_us": created_at_us,
    }


def checkpoint_from_row(row: Mapping[str, Any], trajectory_ids: list[str] | None = None) -> Checkpoint:
    created_at = Timestamp()
    created_at.FromMicroseconds(row["created_at_us"])
    return Checkpoint(
        id=row["id"],
        kind=row["kind"],
        uri=row["uri"],
        parent_id=row["parent_id"] or "",
        job=row["job"],
        config_json=row["config_json"],
        code_version=row["code_version"],
        dataset_snapshot=row["dataset_snapshot"],
        trajectory_ids=trajectory_ids or [],
        eval_metrics=row["eval_metrics"],
        status=row["status"],
        created_at=created_at,
    )
