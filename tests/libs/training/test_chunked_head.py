"""The chunked head gives the losses and gradients of the whole-vocabulary logits it replaces, for
SFT (log-probabilities), APO (log-probabilities, entropy, the clipped loss) and distillation (the
reverse KL to a teacher, whole or top-k), in chunks that do not divide the targets; and its peak
memory on a Qwen-sized vocabulary is a fraction of theirs."""

from __future__ import annotations

import pytest
import torch
from gearshift.testing.tensor_memory import LiveTensors
from gearshift.training import forward, losses, tokenization
from gearshift.training.tiny import tiny_checkpoint
from transformers import AutoModelForCausalLM

from tests.libs.training import reference
from tests.libs.training.trajectories import forced_agentic, routed_instant

CHUNK = 7  # divides no row's targets: every chunk boundary falls somewhere new
VALUES = 1e-5  # float32: the same sums in another order
GRADIENTS = 1e-4  # of each parameter's largest gradient (the KL's cancel to 5e-5 of it in another order)


@pytest.fixture
def batch(tokenizer) -> tokenization.Batch:
    examples = [tokenization.encode_trajectory(tokenizer, t, 1024, True) for t in (routed_instant(), forced_agentic(), routed_instant("x"))]
    return tokenization.collate(examples, tokenizer.eos_token_id)


@pytest.fixture
def model(tiny_dir):
    return AutoModelForCausalLM.from_pretrained(tiny_dir, dtype=torch.float32)


@pytest.fixture(scope="module")
def teacher(tmp_path_factory):
    return AutoModelForCausalLM.from_pretrained(tiny_checkpoint(tmp_path_factory.mktemp("teacher"), seed=3), dtype=torch.float32).eval()


def gradients(model, loss: torch.Tensor) -> list[torch.Tensor]:
    model.zero_grad()
    loss.backward()
    return [param.grad.clone() for param in model.parameters()]


def assert_same(chunked: tuple[torch.Tensor, list], whole: tuple[torch.Tensor, list]) -> None:
    assert torch.allclose(chunked[0], whole[0], atol=VALUES, rtol=1e-5)
    assert all((a - b).abs().max() <= GRADIENTS * b.abs().max() for a, b in zip(chunked[1], whole[1], strict=True))


def chunked(model, batch, **asked) -> forward.Targets:
    """Targets through the chunked head; share_prefix off: the reference decodes rows whole."""
    return forward.through(forward.TargetForward(model, CHUNK), batch, share_prefix=False, **asked)


def test_sft_logprobs_and_gradients_equal_the_whole_vocabulary(model, batch):
    logprobs = chunked(model, batch).logprobs
    assert len(logprobs) > 3 * CHUNK and len(logprobs) % CHUNK
    ours = (logprobs.detach(), gradients(model, -logprobs.sum()))
    whole = reference.target_logprobs(model, batch)
    assert_same(ours, (whole.detach(), gradients(model, -whole.sum())))


def test_apo_loss_entropy_and_gradients_equal_the_whole_vocabulary(model, batch):
    generator = torch.Generator().manual_seed(0)
    rows, _ = forward.target_positions(batch)
    advantage = torch.tensor([1.0, -0.5, 0.25])[rows]
    weights = torch.full_like(advantage, 1 / len(rows), dtype=torch.float64)

    def apo(logp: torch.Tensor) -> torch.Tensor:
        old = (logp.detach() + 0.3 * torch.randn(logp.shape, generator=generator.manual_seed(1)))  # some ratios clip
        return losses.policy_loss(logp, old, advantage, weights, kl_coef=0.1, logp_ref=old - 0.1).loss

    out = chunked(model, batch, entropy=True)
    ours = (out.logprobs.detach(), gradients(model, apo(out.logprobs)))
    logits, tokens = reference.target_logits(model, batch)
    whole = losses.token_logprobs(logits, tokens)
    assert_same(ours, (whole.detach(), gradients(model, apo(whole))))
    assert out.entropy is not None and not out.entropy.requires_grad
    assert torch.allclose(out.entropy, losses.entropy(logits.detach()), atol=VALUES)


@pytest.mark.parametrize("top_k", [None, 50])
def test_distillation_kl_and_gradients_equal_the_whole_vocabulary(model, teacher, batch, top_k):
    teacher_forward = forward.TargetForward(teacher, CHUNK)
    with torch.no_grad():
        seen = forward.through(teacher_forward, tokenization.Batch(batch.input_ids[[0, 2]], batch.attention_mask[[0, 2]], batch.target_mask[[0, 2]]),
                               share_prefix=False, hidden_only=True)
    rows, _ = forward.target_positions(batch)
    positions = torch.isin(rows, torch.tensor([0, 2])).nonzero().squeeze(-1)  # row 1 has no teacher: its KL is 0
    views = (forward.Teacher(positions, seen.hidden, forward.whole_weight(teacher_forward.head)),)
    kl = chunked(model, batch, teachers=views, top_k=top_k).kl
    ours = (kl.detach(), gradients(model, kl.sum()))
    student, _ = reference.target_logits(model, batch)
    with torch.no_grad():
        taught = reference.target_logits(teacher, batch)[0]
    whole = losses.reverse_kl(student, taught, top_k) * torch.isin(rows, torch.tensor([0, 2]))
    assert_same(ours, (whole.detach(), gradients(model, whole.sum())))
    assert (kl[rows == 1] == 0).all() and (kl[rows != 1] > 0).all()


def test_the_chunked_head_holds_a_fraction_of_the_whole_vocabularys_memory():
    """Qwen2.5's vocabulary (152,064), 1,024 targets in chunks of 128: the whole logits in float32
    are 0.6 GiB, and the path before the chunked head held about four such tensors at once."""
    vocabulary, width, targets = 152_064, 64, 1024
    head = torch.nn.Linear(width, vocabulary, bias=False)

    def peak(logprobs_of) -> float:
        hidden = torch.randn(targets, width, requires_grad=True)
        tokens = torch.randint(0, vocabulary, (targets,))
        with LiveTensors() as live:
            (-logprobs_of(hidden, tokens)).sum().backward()
        return live.peak

    whole = peak(lambda hidden, tokens: losses.token_logprobs(torch.nn.functional.linear(hidden, head.weight), tokens))
    head.__class__, head.chunk_tokens = forward.Head, 128
    ours = peak(lambda hidden, tokens: head(hidden, tokens)[0])
    assert whole > 3 * targets * vocabulary * 4  # the control: the whole logits, several times over
    assert ours < whole / 4
