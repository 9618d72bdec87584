"""The padded batch KV cache against the model run one sequence at a time: rows of different
lengths (left padding, masks, position ids), rows joining and leaving mid-way."""

from __future__ import annotations

import pytest
import torch
from gearshift import weights
from gearshift.services.policy_server import runner
from gearshift.services.policy_server.batch_cache import BatchCache

PROMPTS = ["Hi", "The quick brown fox jumps over the lazy dog", "Once upon a time, in a land far away, there lived", "A B C D E F"]
STEPS = 6


@pytest.fixture(scope="module")
def tiny(tiny_checkpoints):
    torch.set_num_threads(1)
    return weights.load(str(tiny_checkpoints[0]), tiny_checkpoints[0].parent)


def solo_logits(model, prompt_ids: list[int], fed: list[int]) -> list[torch.Tensor]:
    """Logits after the prompt and after each fed token, the sequence alone."""
    logits, cache = runner.prefill(model, prompt_ids, None, reserve=len(fed))
    out = [logits]
    for token in fed:
        out.append(runner.decode(model, cache, [token])[0])
    return out


@torch.inference_mode()
def test_rows_of_different_lengths_decode_as_they_would_alone(tiny):
    model, ids = tiny.model, [tiny.tokenizer(p)["input_ids"] for p in PROMPTS]
    assert len({len(i) for i in ids}) == len(ids)  # every row needs a different amount of padding
    fed = [[100 + 7 * row + step for step in range(STEPS)] for row in range(len(ids))]
    expected = [solo_logits(model, prompt, tokens) for prompt, tokens in zip(ids, fed)]

    first = [runner.prefill(model, prompt, None, reserve=STEPS) for prompt in ids[:3]]
    batch = BatchCache.of_rows([cache.row(0) for _, cache in first])
    for step in range(STEPS):
        if step == 2:  # a fourth row joins mid-way; the cache is rebuilt around it
            logits, late = runner.prefill(model, ids[3], None, reserve=STEPS)
            torch.testing.assert_close(logits, expected[3][0])
            batch = BatchCache.of_rows([batch.row(i) for i in range(batch.rows)] + [late.row(0)])
        if step == 4:  # the longest row leaves: the others keep their tokens, padding is trimmed
            batch = BatchCache.of_rows([batch.row(i) for i in (0, 1, 3)])
            assert batch.width == max(batch.lengths)
        rows = [0, 1, 2, 3][: batch.rows] if step < 4 else [0, 1, 3]
        fed_now = [fed[row][step if row < 3 else step - 2] for row in rows]
        logits = runner.decode(model, batch, fed_now)
        for index, row in enumerate(rows):
            position = step + 1 if row < 3 else step - 1
            torch.testing.assert_close(logits[index], expected[row][position], atol=1e-5, rtol=1e-4)


@torch.inference_mode()
def test_a_cached_prefix_gives_the_logits_of_the_whole_prompt(tiny):
    model = tiny.model
    prompt = tiny.tokenizer(PROMPTS[2])["input_ids"]
    whole, cache = runner.prefill(model, prompt, None, reserve=0)
    prefix = [(k[:, :, :5], v[:, :, :5]) for k, v in cache.row(0)]
    resumed, resumed_cache = runner.prefill(model, prompt, prefix, reserve=0)
    torch.testing.assert_close(resumed, whole, atol=1e-5, rtol=1e-4)
    assert resumed_cache.lengths == [len(prompt)]


def test_buffers_grow_when_the_columns_run_out(tiny):
    row = [(torch.ones(1, 2, 3, 4), torch.ones(1, 2, 3, 4)) for _ in range(2)]
    batch = BatchCache.of_rows([row], headroom=0)
    capacity = batch.buffers[0][0].shape[-2]
    batch.advance(capacity - batch.width)
    batch.reserve(1)
    assert batch.buffers[0][0].shape[-2] > capacity
    assert torch.equal(batch.row(0)[0][0][:, :, :3], torch.ones(1, 2, 3, 4))  # the tokens moved with the buffer
