"""SFT: a few steps on a tiny random model, data from a real store, resume, registry."""

import json

import pytest
from gearshift import weights
from gearshift.api.common.v1.common_pb2 import CheckpointStatus
from gearshift.jobs.sft import trainer
from gearshift.jobs.sft.config import SFTConfig
from gearshift.training.data import snapshot_id
from gearshift.training.results import read_metrics

from tests.libs.training.trajectories import forced_agentic, routed_instant


def config(tiny_dir, out, store, **extra) -> SFTConfig:
    body = {
        "model": {"base": str(tiny_dir)},
        "optim": {"learning_rate": 1e-2, "max_steps": 8, "seed": 1, "threads": 1},
        "output": {"dir": str(out), "save_every": 3, "progress": False},
        "store_addr": store.address,
        "data": {"task_source": "unit", "correctness": "correct"},
        "batch_size": 2,
    }
    for key, value in extra.items():
        body[key] = {**body.get(key, {}), **value} if isinstance(value, dict) else value
    return SFTConfig.model_validate(body)


@pytest.fixture(scope="module")
def stored(store):
    trajectories = [routed_instant(), forced_agentic(), routed_instant("00000000-0000-0000-0000-000000000003", correct=False)]
    store.put(trajectories)
    return trajectories


@pytest.fixture(scope="module")
def straight(tiny_dir, tmp_path_factory, store, stored):
    """One uninterrupted run: its output directory and result."""
    out = tmp_path_factory.mktemp("sft") / "straight"
    return out, trainer.train(config(tiny_dir, out, store))


def test_loss_falls_and_checkpoint_is_registered(tmp_path, store, stored, straight):
    out, result = straight
    history = read_metrics(out)
    assert [r["step"] for r in history] == list(range(1, 9))
    assert history[-1]["loss"] < 0.6 * history[0]["loss"]
    correct_ids = sorted(t.id for t in stored if t.reward.correct)
    assert result["trajectory_ids"] == correct_ids  # the incorrect one is never learned
    assert result["dataset_snapshot"] == snapshot_id(correct_ids)
    on_disk = json.loads((out / "result.json").read_text())
    assert on_disk["checkpoint_id"] == result["checkpoint_id"] and on_disk["job"] == "sft"
    registered = store.checkpoint(result["checkpoint_id"])
    assert registered.kind == "policy" and registered.status == CheckpointStatus.CHECKPOINT_STATUS_CANDIDATE
    assert sorted(registered.trajectory_ids) == correct_ids and registered.dataset_snapshot == result["dataset_snapshot"]
    assert weights.load(str(out), tmp_path).model.config.num_hidden_layers == 2


def test_resume_after_an_interrupted_run_continues_from_the_saved_step(tiny_dir, tmp_path, store, stored, straight):
    out = tmp_path / "sft"

    def crash_at_5(step, record):
        if step == 5:
            raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        trainer.train(config(tiny_dir, out, store), on_step=crash_at_5)
    seen = []
    result = trainer.train(config(tiny_dir, out, store), on_step=lambda step, record: seen.append(step))
    assert seen == list(range(4, 9))  # resumed after step 3, the last saved state
    assert result["metrics"]["steps"] == 8
    uninterrupted = {r["step"]: r["loss"] for r in read_metrics(straight[0])}
    resumed = {r["step"]: r["loss"] for r in read_metrics(out)}  # the later line per step wins
    assert resumed[8] == pytest.approx(uninterrupted[8], rel=1e-3)


def test_difficulty_balancing_weights():
    cfg = SFTConfig.model_validate({"output": {"dir": "/tmp/x"}, "difficulty_weights": {"hard": 2.0}})
    trajectories = [routed_instant("a", "easy"), routed_instant("b", "easy"), routed_instant("c", "easy"), forced_agentic("d", "hard")]
    weights_ = trainer.sampling_weights(trajectories, cfg)
    assert weights_ == pytest.approx([1 / 3, 1 / 3, 1 / 3, 2.0])


def test_config_rejects_unknown_keys(tmp_path):
    path = tmp_path / "sft.json"
    path.write_text(json.dumps({"output": {"dir": str(tmp_path)}, "batchsize": 3}))
    with pytest.raises(ValueError, match="batchsize"):
        SFTConfig.from_file(path)
