"""The padded batch KV cache against the model run one sequence at a time: rows of different
lengths (left padding, masks, position ids), rows joining and leaving mid-way; on transformers'
forward and on the hand-written decode step, which must give transformers' logits."""

from __future__ import annotations

import pytest
import torch
from gearshift import weights
from gearshift.services.policy_server import runner
from gearshift.services.policy_server.batch_cache import BatchCache

PROMPTS = ["Hi", "The quick brown fox jumps over the lazy dog", "Once upon a time, in a land far away, there lived", "A B C D E F"]
STEPS = 6


@pytest.fixture(scope="module", params=["transformers", "hand-written"])
def tiny(request, tiny_checkpoints):
    """The tiny model decoding through transformers' forward, or prepared (relaid weights, the
    hand-written step) as the server prepares what it loads."""
    torch.set_num_threads(1)
    loaded = weights.load(str(tiny_checkpoints[0]), tiny_checkpoints[0].parent)
    if request.param == "hand-written":
        runner.prepare(loaded.model)
    return loaded


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
def test_prompts_prefilled_together_give_the_logits_and_keys_of_each_alone(tiny):
    model, prompts = tiny.model, [tiny.tokenizer(p)["input_ids"] for p in PROMPTS]
    alone = [runner.prefill(model, prompt, None, reserve=STEPS) for prompt in prompts]
    # two resume from cached prefixes of different lengths, as prefix-cache hits do
    prefixes = [None, [(k[:, :, :4], v[:, :, :4]) for k, v in alone[1][1].row(0)], None, [(k[:, :, :2], v[:, :, :2]) for k, v in alone[3][1].row(0)]]
    together = runner.prefill_together(model, prompts, prefixes, [STEPS] * len(prompts))
    for (logits, cache), (solo_logits, solo_cache) in zip(together, alone, strict=True):
        torch.testing.assert_close(logits, solo_logits, atol=1e-5, rtol=1e-4)
        assert cache.lengths == solo_cache.lengths
        for (keys, values), (solo_keys, solo_values) in zip(cache.row(0), solo_cache.row(0)):
            torch.testing.assert_close(keys, solo_keys, atol=1e-5, rtol=1e-4)
            torch.testing.assert_close(values, solo_values, atol=1e-5, rtol=1e-4)


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


@torch.inference_mode()
def test_the_hand_written_step_gives_the_logits_of_transformers(tiny_checkpoints):
    reference = weights.load(str(tiny_checkpoints[0]), tiny_checkpoints[0].parent).model
    prepared = weights.load(str(tiny_checkpoints[0]), tiny_checkpoints[0].parent).model
    runner.prepare(prepared)
    assert prepared.lm_head.weight is None  # the hand-written forward holds the weights now
    ids = [list(range(10 + row, 13 + 6 * row)) for row in range(3)]  # 3, 8 and 13 tokens: padded rows
    caches = {}
    for name, model in (("reference", reference), ("prepared", prepared)):
        rows = [runner.prefill(model, prompt, None, reserve=STEPS)[1].row(0) for prompt in ids]
        caches[name] = BatchCache.of_rows(rows)
    for step in range(STEPS):
        tokens = [200 + 11 * row + step for row in range(3)]
        expected = runner.decode(reference, caches["reference"], tokens)
        got = runner.decode(prepared, caches["prepared"], tokens)
        torch.testing.assert_close(got, expected, atol=1e-5, rtol=1e-4)
    # prefill of a prepared model (the hand-written forward over many tokens) too
    torch.testing.assert_close(runner.prefill(prepared, ids[2], None, 0)[0], runner.prefill(reference, ids[2], None, 0)[0])
