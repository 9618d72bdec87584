"""Registering a checkpoint id again: a retry with the same content succeeds, other content is
AlreadyExists. On a SQLite file and on Postgres."""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor

import pytest
from gearshift.api.common.v1.common_pb2 import Checkpoint, CheckpointStatus
from gearshift.errors import AlreadyExists
from gearshift.storage import TrajectoryRepository

from tests.libs.storage.helpers import BASE_US, make_trajectory

CANDIDATE = CheckpointStatus.CHECKPOINT_STATUS_CANDIDATE
PUBLISHED = CheckpointStatus.CHECKPOINT_STATUS_PUBLISHED


def trained(repository: TrajectoryRepository, **fields) -> Checkpoint:
    """A registered child checkpoint with a lineage of two trajectories, as a training job
    writes it; returns the request, so a test can send it (or a variant) again."""
    data = [make_trajectory(), make_trajectory()]
    repository.put(data)
    repository.register_checkpoint(Checkpoint(id="base", kind="policy", uri="/ckpt/base", status=CANDIDATE), BASE_US)
    request = Checkpoint(
        id="sft-1",
        kind="policy",
        uri="/ckpt/sft-1",
        parent_id="base",
        job="sft",
        config_json='{"lr": 1e-05}',
        code_version="3d47650",
        dataset_snapshot="export-1",
        trajectory_ids=[t.id for t in data],
        eval_metrics={"train_loss": 0.25},
        status=CANDIDATE,
        **fields,
    )
    repository.register_checkpoint(request, BASE_US + 1)
    return request


def test_a_retry_with_the_same_content_returns_the_stored_checkpoint(repository: TrajectoryRepository):
    request = trained(repository)
    again = Checkpoint()
    again.CopyFrom(request)
    again.trajectory_ids[:] = [*reversed(request.trajectory_ids), request.trajectory_ids[0]]  # a set
    retried = repository.register_checkpoint(again, BASE_US + 2)
    assert retried.created_at.ToMicroseconds() == BASE_US + 1  # the first registration's
    assert (retried.uri, dict(retried.eval_metrics)) == (request.uri, {"train_loss": 0.25})
    assert sorted(repository.get_checkpoint("sft-1", include_lineage=True).trajectory_ids) == sorted(request.trajectory_ids)


def test_a_retry_after_promotion_and_evaluation_still_succeeds(repository: TrajectoryRepository):
    request = trained(repository)
    repository.update_checkpoint("sft-1", PUBLISHED, {"accuracy": 0.6}, at_us=0)
    retried = repository.register_checkpoint(request, BASE_US + 2)  # status CANDIDATE, fewer metrics
    assert retried.status == PUBLISHED
    assert dict(retried.eval_metrics) == {"train_loss": 0.25, "accuracy": 0.6}


@pytest.mark.parametrize(
    ("field", "change"),
    [
        ("kind", lambda c: setattr(c, "kind", "router")),
        ("uri", lambda c: setattr(c, "uri", "/ckpt/elsewhere")),
        ("parent_id", lambda c: c.ClearField("parent_id")),
        ("config_json", lambda c: setattr(c, "config_json", '{"lr": 2e-05}')),
        ("trajectory_ids", lambda c: c.trajectory_ids.pop()),
        (r"eval_metrics\[train_loss\]", lambda c: c.eval_metrics.__setitem__("train_loss", 0.5)),
        (r"eval_metrics\[accuracy\]", lambda c: c.eval_metrics.__setitem__("accuracy", 0.6)),
    ],
    ids=["kind", "uri", "parent_id", "config_json", "trajectory_ids", "metric_changed", "metric_not_stored"],
)
def test_a_reused_id_with_other_content_names_the_field(repository: TrajectoryRepository, field, change):
    request = trained(repository)
    other = Checkpoint()
    other.CopyFrom(request)
    change(other)
    with pytest.raises(AlreadyExists, match=f"checkpoint sft-1 already exists with a different {field}$"):
        repository.register_checkpoint(other, BASE_US + 2)
    stored = repository.get_checkpoint("sft-1", include_lineage=True)
    assert (stored.kind, stored.uri, len(stored.trajectory_ids)) == ("policy", "/ckpt/sft-1", 2)


def test_a_metric_evaluation_changed_makes_the_retry_a_conflict(repository: TrajectoryRepository):
    request = trained(repository)
    repository.update_checkpoint("sft-1", 0, {"train_loss": 0.3}, at_us=0)
    with pytest.raises(AlreadyExists, match=r"eval_metrics\[train_loss\]"):
        repository.register_checkpoint(request, BASE_US + 2)


def test_concurrent_registrations_of_one_checkpoint_all_succeed(repository: TrajectoryRepository):
    repository.register_checkpoint(Checkpoint(id="base", kind="policy", uri="/ckpt/base", status=CANDIDATE), BASE_US)
    data = [make_trajectory() for _ in range(3)]
    repository.put(data)
    request = Checkpoint(
        id="sft-1", kind="policy", uri="/ckpt/sft-1", parent_id="base", trajectory_ids=[t.id for t in data], status=CANDIDATE
    )

    def register(attempt: int) -> int:
        return repository.register_checkpoint(request, BASE_US + 1 + attempt).created_at.ToMicroseconds()

    with ThreadPoolExecutor(max_workers=4) as pool:
        stamps = set(pool.map(register, range(16)))
    assert len(stamps) == 1  # every caller got the one stored row
    assert len(repository.get_checkpoint("sft-1", include_lineage=True).trajectory_ids) == 3
