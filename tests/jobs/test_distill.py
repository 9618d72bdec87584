"""Distillation: the student's reverse KL to its domain's teacher falls on its own samples."""

import pytest
import torch
from gearshift.jobs.distill import trainer
from gearshift.jobs.distill.config import DistillConfig, Prompt
from gearshift.training.results import read_metrics


def config(student, teacher, out, **extra) -> DistillConfig:
    return DistillConfig.model_validate(
        {
            "model": {"base": str(student)},
            "optim": {"learning_rate": 3e-3, "max_steps": 8, "seed": 0, "threads": 1},
            "output": {"dir": str(out), "save_every": 4, "progress": False},
            "teachers": {"math": str(teacher)},
            "default_teacher": str(student),
            "prompts": [{"query": "What is 2+2?", "domain": "math", "mode": "instant"}, {"query": "Capital of France?", "domain": "math"}],
            "batch_size": 2,
            "max_new_tokens": 12,
            "temperature": 1.0,
            **extra,
        }
    )


@pytest.mark.parametrize("top_k", [None, 2048])
def test_reverse_kl_to_the_teacher_falls(tiny_dir, teacher_dir, tmp_path, top_k):
    result = trainer.train(config(tiny_dir, teacher_dir, tmp_path / "out", top_k=top_k, temperature=0.0))
    history = read_metrics(tmp_path / "out")
    assert len(history) == 8 and all(r["sampled_tokens"] > 0 for r in history)
    assert history[-1]["loss"] < 0.7 * history[0]["loss"]
    assert result["job"] == "distill" and result["config"]["top_k"] == top_k


def test_forced_prefix_is_prompt_not_target(tiny_dir):
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(tiny_dir)
    encoded = trainer.prompt_encoding(tokenizer, Prompt(query="What is 2+2?", mode="reasoning"))
    assert not any(encoded.target)
    assert tokenizer.decode(encoded.input_ids).endswith("reasoning_agent\n</classification>\n<reasoning>")
    torch.manual_seed(0)
    model = __import__("transformers").AutoModelForCausalLM.from_pretrained(tiny_dir)
    cfg = config(tiny_dir, tiny_dir, "/tmp/unused", max_new_tokens=5)
    sampled = trainer.sample(model, tokenizer, [encoded], cfg)[0]
    assert sampled.input_ids[: len(encoded.input_ids)] == encoded.input_ids
    assert sampled.target == [False] * len(encoded.input_ids) + [True] * (len(sampled.input_ids) - len(encoded.input_ids))
    assert 1 <= sampled.target_count <= 5


def test_unknown_domain_without_default_is_an_error(tiny_dir, teacher_dir):
    cfg = config(tiny_dir, teacher_dir, "/tmp/unused", default_teacher="")
    with pytest.raises(ValueError, match="no teacher"):
        trainer.teacher_of(Prompt(query="q", domain="law"), cfg)
