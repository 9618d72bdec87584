"""Tensor parallelism (training/tensor_parallel.py) on a 2 x 2 mesh: SFT's step code on the tiny
dense Llama (and a tiny Qwen3, whose per-head norms meet only a rank's own heads) with its
projections split over 2 tensor ranks and FSDP2 over the other 2 (4 gloo ranks under torchrun)
learns what one process learns, exports the files it loaded, and leaves a resume state that a
plain FSDP run on 2 ranks continues to one process's weights; and tensor parallel 2 with context
parallel 2. The data are the episodes test_distributed.py's platform ran and stored, as SFT
exports them; the launches go through tests/jobs/ranks_worker.py, every 4-rank case in one launch."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from gearshift.training import distributed, loading
from gearshift.training.config import ModelConfig, RuntimeConfig
from gearshift.training.distributed import Ranks
from safetensors.torch import load_file

from tests.jobs.test_distributed import (  # noqa: F401 - platform, sft_data: the fixtures sft_trajectories stands on
    WEIGHTS_TOLERANCE,
    assert_same_run,
    max_difference,
    metrics,
    out_dir,
    platform,
    run_cases,
    sft_config,
    sft_data,
    sft_trajectories,
)

TENSOR_2X2 = {"tensor_parallel": 2}  # on 4 ranks: 2 FSDP shards x 2 tensor ranks


@pytest.fixture(scope="module")
def qwen3_dir(tiny_dir, tmp_path_factory) -> Path:
    """A tiny Qwen3 (its heads normalised one by one: q_norm, k_norm; its head untied) with the
    tiny Llama's tokenizer."""
    from transformers import AutoTokenizer, Qwen3Config, Qwen3ForCausalLM

    path = tmp_path_factory.mktemp("qwen3") / "tiny-qwen3"
    tokenizer = AutoTokenizer.from_pretrained(tiny_dir)
    torch.manual_seed(0)
    config = Qwen3Config(vocab_size=len(tokenizer), hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
                         num_key_value_heads=2, head_dim=16, max_position_embeddings=2048, tie_word_embeddings=False)
    model = Qwen3ForCausalLM(config)
    with torch.no_grad():
        for name, param in model.named_parameters():
            if name.endswith("norm.weight"):
                param.normal_(1.0, 0.2)  # not all ones: each head's weights matter apart
    model.save_pretrained(path)
    tokenizer.save_pretrained(path)
    return path


@pytest.fixture(scope="module")
def runs(tiny_dir, qwen3_dir, sft_trajectories, tmp_path_factory) -> dict[str, dict]:
    """By name: SFT in one process ("llama", "qwen3"); on 4 ranks with tensor parallelism 2, SFT
    ("llama-tp", "qwen3-tp"), the loaded weights exported ("export"), and 2 steps whose resume
    state "resumed" continues on 2 ranks under plain FSDP to the third; and tensor and context
    parallelism together ("llama-tp-cp": 2 x 2, each packed micro-batch's tokens split over the
    2 ranks of a context pair, their heads over a tensor pair)."""
    folder = tmp_path_factory.mktemp("tp")
    saved = folder / "saved-state"
    models = {"llama": tiny_dir, "qwen3": qwen3_dir}

    def case(ranks: int, name: str, model: str = "llama", **extra) -> tuple[str, dict, Path]:
        return "sft", sft_config(models[model], folder / str(ranks) / name / "out", **extra), sft_trajectories

    done = run_cases(1, {model: case(1, model, model) for model in models}, folder / "1")
    parallel = {f"{model}-tp": case(4, f"{model}-tp", model, runtime=TENSOR_2X2) for model in models}
    parallel["llama-tp-cp"] = case(4, "llama-tp-cp", runtime={"tensor_parallel": 2, "context_parallel": 2})
    parallel["export"] = ("export", *case(4, "export", runtime=TENSOR_2X2)[1:])
    parallel["saved"] = "sft", sft_config(tiny_dir, saved, runtime=TENSOR_2X2, optim={"max_steps": 2}), sft_trajectories
    done |= run_cases(4, parallel, folder / "4")
    done |= run_cases(2, {"resumed": ("sft", sft_config(tiny_dir, saved), sft_trajectories)}, folder / "2")
    return done


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
