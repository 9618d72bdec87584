"""Distillation: the student's episodes run through the executor; each prompt's tokens are scored
by its own domain's teacher; the reverse KL to the teachers falls on the student's own samples."""

import pytest
import torch
from gearshift.jobs.distill import trainer
from gearshift.jobs.distill.config import DistillConfig, Prompt
from gearshift.training.on_policy import encode_rollouts
from gearshift.training import losses, tokenization
from gearshift.training.batching import MicroBatch
from gearshift.training.config import RolloutConfig
from gearshift.training.results import read_metrics
from gearshift.training.runtime import Run
from transformers import AutoModelForCausalLM, AutoTokenizer

from tests.libs.training import reference


def config(student, teachers: dict, out, **extra) -> DistillConfig:
    return DistillConfig.model_validate(
        {
            "model": {"base": str(student)},
            "optim": {"learning_rate": 3e-3, "max_steps": 8, "seed": 0, "threads": 1},
            "output": {"dir": str(out), "save_every": 4, "progress": False},
            "teachers": {domain: str(path) for domain, path in teachers.items()},
            "prompts": [{"query": "What is 2+2?", "domain": "math", "mode": "instant"},
                        {"query": "Capital of France?", "domain": "qa", "mode": "agentic"}],
            "batch_size": 2,
            "rollout": {"max_tokens_per_turn": 12, "max_steps": 1, "temperature": 0.0},
            **extra,
        }
    )


@pytest.fixture(scope="module")
def second_teacher(tmp_path_factory):
    """A second peaked tiny teacher, different from the first."""
    from gearshift.training.tiny import tiny_checkpoint

    path = tiny_checkpoint(tmp_path_factory.mktemp("jobs") / "teacher-2", seed=2)
    model = AutoModelForCausalLM.from_pretrained(path)
    with torch.no_grad():
        model.get_output_embeddings().weight.mul_(6)
    model.save_pretrained(path)
    return path


@pytest.mark.parametrize("top_k", [None, 2048])
def test_reverse_kl_to_the_teachers_falls_on_executor_episodes(tiny_dir, teacher_dir, second_teacher, tmp_path, top_k):
    result = trainer.train(config(tiny_dir, {"math": teacher_dir, "qa": second_teacher}, tmp_path / "out", top_k=top_k))
    history = read_metrics(tmp_path / "out")
    assert len(history) == 8 and all(r["sampled_tokens"] > 0 for r in history)
    assert history[-1]["loss"] < 0.7 * history[0]["loss"]
    assert result["job"] == "distill" and result["config"]["top_k"] == top_k
    assert len(result["trajectory_ids"]) == 16  # one stored episode per prompt and step


def test_each_prompt_is_scored_by_its_own_teacher(tiny_dir, teacher_dir, second_teacher, tmp_path):
    run = Run.start("distill", config(tiny_dir, {}, tmp_path / "out", runtime={"loss_chunk_tokens": 3}))
    teachers = {str(path): run.frozen(str(path)) for path in (teacher_dir, second_teacher)}
    rows = [tokenization.encode(run.tokenizer, query, [tokenization.Segment(answer, True)], end_of_turn=False)
            for query, answer in (("What is 2+2?", "4</answer>"), ("Capital of France?", "It is Paris, a city.</answer>"),
                                  ("What is 3+3?", "6</answer>"))]
    micro = MicroBatch([0, 1, 2], tokenization.collate(rows, pad_id=0))
    owners = [str(teacher_dir), str(second_teacher), str(teacher_dir)]  # math, qa, math
    models = {str(path): AutoModelForCausalLM.from_pretrained(path) for path in (teacher_dir, second_teacher)}
    with torch.no_grad():
        out = run.forward(micro, teachers=trainer.teacher_views(run, micro, owners, teachers))
        for row, owner in enumerate(owners):
            alone = tokenization.collate([rows[row]], pad_id=0)
            student, _ = reference.target_logits(run.model, alone)
            expected = losses.reverse_kl(student, reference.target_logits(models[owner], alone)[0])
            other = losses.reverse_kl(student, reference.target_logits(models[owners[1] if owner == owners[0] else owners[0]], alone)[0])
            got = out.kl[out.rows == row]
            assert torch.allclose(got, expected, atol=1e-4) and not torch.allclose(got, other, atol=1e-2)


def test_tool_responses_and_injected_text_are_never_targets(tiny_dir):
    from tests.libs.training.trajectories import forced_agentic

    tokenizer = AutoTokenizer.from_pretrained(tiny_dir)
    encoded = encode_rollouts(tokenizer, [forced_agentic()], RolloutConfig(exact_tokens=False), 4096)[0]
    learned = tokenizer.decode([t for t, target in zip(encoded.input_ids, encoded.target) if target])
    assert "Results for tool call" not in learned and "toolcalling_agent" not in learned and "<plan>" not in learned
    assert learned.startswith("Plan: None\nmultiply</plan>")


def test_unknown_domain_without_default_is_an_error(tiny_dir, teacher_dir):
    cfg = config(tiny_dir, {"math": teacher_dir}, "/tmp/unused")
    with pytest.raises(ValueError, match="no teacher"):
        trainer.teacher_of(Prompt(query="q", domain="law"), cfg)
