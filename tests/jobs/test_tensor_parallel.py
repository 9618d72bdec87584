"""Tensor parallelism (training/tensor_parallel.py) on a 2 x 2 mesh: SFT's step code on the tiny
dense Llama (and a tiny Qwen3, whose per-head norms meet only a rank's own heads) with its
projections split over 2 tensor ranks and FSDP2 over the other 2 (4 gloo ranks under torchrun)
learns what one process learns, exports the files it loaded, and leaves a resume state that a
plain FSDP run on 2 ranks continues to one process's weights; and tensor parallel 2 with context
parallel 2. The data are the episodes the rank tests' platform ran and stored (ranks_data), as
SFT exports them; the cases (rank_runs.tensor_parallel_cases) run in the rank tests' launches, one per
number of ranks (tests/jobs/conftest.py: worker_runs)."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from gearshift.training import distributed, loading
from gearshift.training.config import ModelConfig, RuntimeConfig
from gearshift.training.distributed import Ranks
from safetensors.torch import load_file

from tests.jobs.rank_runs import WEIGHTS_TOLERANCE, assert_same_run, max_difference, metrics, out_dir


@pytest.fixture(scope="module")
def runs(worker_runs) -> dict[str, dict]:
    """tensor_parallel_cases' runs by name, without their "tp-" (tests/jobs/rank_runs.py)."""
    return {name.removeprefix("tp-"): run for named in worker_runs.values() for name, run in named.items() if name.startswith("tp-")}


def exported(run: dict) -> dict[str, torch.Tensor]:
    return load_file(out_dir(run) / "model.safetensors")


@pytest.mark.slow
@pytest.mark.ranks
@pytest.mark.parametrize("model, layout", [("llama", "tp"), ("qwen3", "tp"), ("llama", "tp-cp")])
def test_tensor_parallel_2_by_fsdp_2_on_4_ranks_learns_what_one_process_learns(runs, model, layout):
    """Tensor parallel 2 with FSDP over the other 2 ranks, or with context parallel 2."""
    one, parallel = runs[model], runs[f"{model}-{layout}"]
    assert_same_run(one, parallel)  # losses and final weights
    assert one["losses"][0] != one["losses"][-1]  # it learned something to compare
    # AdamW's update hardly changes with the gradients' scale: their norm is what shows it.
    norms = [[record["grad_norm"] for record in metrics(out_dir(run))] for run in (one, parallel)]
    assert norms[1] == pytest.approx(norms[0], rel=1e-4)
    assert max_difference(exported(one), exported(parallel)) < WEIGHTS_TOLERANCE  # the files rank 0 wrote from 2-D shards


@pytest.mark.slow
@pytest.mark.ranks
def test_weights_loaded_split_over_tensor_and_fsdp_ranks_export_to_the_files_they_came_from(runs, tiny_dir):
    """Each rank read its own block of each tensor (rows, and columns of o_proj and down_proj); the
    export joins them back."""
    source = loading.SafetensorsDirectory(tiny_dir)
    files = exported(runs["export"])
    assert files.keys() == source.entries.keys()
    assert all(torch.equal(files[name], source.rows(name)) for name in source.entries)


@pytest.mark.slow
@pytest.mark.ranks
def test_a_state_saved_at_tensor_parallel_2_on_4_ranks_resumes_under_fsdp_on_2_ranks(runs):
    resumed = runs["resumed"]
    assert resumed["resumed_from"] == 2
    assert_same_run(runs["llama"], resumed)  # the first two losses are the 4-rank run's, the third its own


@pytest.fixture(scope="module")
def wide_mlp(tmp_path_factory) -> Path:
    """A checkpoint (config alone: the check reads no weights) whose MLP width 2 ranks cannot split."""
    from transformers import LlamaConfig

    path = tmp_path_factory.mktemp("wide") / "model"
    LlamaConfig(hidden_size=64, intermediate_size=129, num_hidden_layers=1, num_attention_heads=4, num_key_value_heads=2).save_pretrained(path)
    return path


@pytest.mark.parametrize("degree, world_size, runtime, message", [
    (3, 4, {}, "runtime.tensor_parallel 3 does not divide the job's 4 ranks"),
    (8, 8, {}, "runtime.tensor_parallel 8 does not divide the model's 4 attention heads"),
    (4, 4, {}, "runtime.tensor_parallel 4 does not divide the model's 2 key-value heads"),
    (2, 2, {"parallelism": "ddp"}, "runtime.tensor_parallel needs runtime.parallelism fsdp"),
    (2, 4, {"mesh_shape": (2, 2)}, "runtime.tensor_parallel with HSDP"),
])
def test_degrees_that_cannot_apply_are_refused_in_one_line(tiny_dir, degree, world_size, runtime, message):
    model, _ = loading.build(tiny_dir, torch.float32)
    with pytest.raises(ValueError, match=message):
        distributed.check_tensor_parallel(model, Ranks(world_size=world_size), RuntimeConfig(tensor_parallel=degree, **runtime))


def test_models_tensor_parallelism_does_not_split_are_refused_in_one_line(tiny_dir, moe_dir, wide_mlp):
    refused = {
        "runtime.tensor_parallel 2 does not divide the model's 129 MLP width": loading.build(wide_mlp, torch.float32)[0],
        "runtime.tensor_parallel is for dense models": loading.build(moe_dir, torch.float32)[0],
        "runtime.tensor_parallel with LoRA is not supported": loading.build(tiny_dir, torch.float32, ModelConfig(base="", lora=True))[0],
    }
    for message, model in refused.items():
        with pytest.raises(ValueError, match=message):
            distributed.check_tensor_parallel(model, Ranks(world_size=2), RuntimeConfig(tensor_parallel=2))
