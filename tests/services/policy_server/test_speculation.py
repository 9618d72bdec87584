"""Prompt lookup: the draft is what followed the latest earlier occurrence of the last tokens,
and a lone greedy generation that checks drafts gives exactly the tokens of one that does not,
through stop words, max_tokens, streaming and the prefix cache."""

from __future__ import annotations

import pytest
import torch
from gearshift.services.policy_server import speculation
from gearshift.services.policy_server.speculation import propose
from gearshift.services.policy_server.schemas import ChatCompletionRequest

from tests.services.policy_server.test_batching import PROMPTS, completion, engine_on

# A prompt whose continuation the model copies from it: drafts get accepted.
QUOTING = "Repeat after me. " + "The tower is 330 metres tall and stands by the river. " * 4


@pytest.mark.parametrize(
    ("context", "tokens", "draft"),
    [
        ([1, 2, 3, 9, 1, 2, 3], 2, [9, 1]),  # the last three tokens occurred before
        ([5, 1, 2, 3, 4, 1, 2], 3, [3, 4, 1]),  # only the last two did
        ([1, 9, 1, 8, 1], 4, [8, 1]),  # the latest occurrence wins
        ([1, 2, 7, 1, 2, 8, 1, 2], 1, [8]),
        ([4, 4, 4, 4], 2, [4]),  # a draft never runs past the context's end
        ([1, 2, 3], 2, []),  # the last token never occurred before
        ([7], 3, []),
        ([1, 2, 1], 0, []),
    ],
)
def test_the_draft_is_what_followed_the_latest_occurrence_of_the_last_tokens(context, tokens, draft):
    assert propose(context, tokens) == draft


async def test_a_lone_greedy_generation_gives_the_same_tokens_with_drafts(tiny_checkpoints):
    prompts = [QUOTING, *PROMPTS]
    async with engine_on(tiny_checkpoints[0], speculative_tokens=0) as plain, engine_on(tiny_checkpoints[0]) as drafting:
        expected = [await plain.generate_all(completion(plain, p, max_tokens=48)) for p in prompts]
        got = [await drafting.generate_all(completion(drafting, p, max_tokens=48)) for p in prompts]
        stats = drafting.scheduler.stats
    assert [r.token_ids for r in got] == [r.token_ids for r in expected]
    assert [r.text for r in got] == [r.text for r in expected]
    assert all(r.completion_tokens == 48 for r in got)
    assert plain.scheduler.stats.drafted == 0
    assert stats.accepted > 0 and stats.steps + stats.accepted == sum(r.completion_tokens - 1 for r in got)


async def test_a_rejected_draft_leaves_no_trace(tiny_checkpoints, monkeypatch):
    """Drafts of two right tokens and a wrong one: each step keeps the two, takes the model's own
    pick instead of the third and drops the keys and values written for it."""
    async with engine_on(tiny_checkpoints[0], speculative_tokens=0) as plain, engine_on(tiny_checkpoints[0]) as drafting:
        for prompt in (PROMPTS[1], PROMPTS[3]):
            expected = await plain.generate_all(completion(plain, prompt, max_tokens=40))
            prompt_tokens = expected.prompt_tokens

            def half_right(context: list[int], tokens: int) -> list[int]:
                done = len(context) - prompt_tokens  # tokens generated so far
                right = expected.token_ids[done : done + 2]
                wrong = (expected.token_ids[done + 2] + 1) % 1000 if done + 2 < len(expected.token_ids) else 0
                return (right + [wrong])[:tokens]

            monkeypatch.setattr(speculation, "propose", half_right)
            stats = drafting.scheduler.stats
            before = (stats.drafted, stats.accepted)
            job = completion(drafting, prompt, max_tokens=40)
            got = await drafting.generate_all(job)
            assert got.token_ids == expected.token_ids
            assert 0 < stats.accepted - before[1] < stats.drafted - before[0]
            # What each kept for the prefix cache: the same keys and values, column for column.
            tokens = job.prompt_ids + got.token_ids + [0]
            kept = [engine.scheduler.prefix_cache.lookup(engine.current, tokens) for engine in (plain, drafting)]
            assert kept[0][0][0].shape == kept[1][0][0].shape
            assert all(torch.allclose(a, b, atol=1e-5) for mine, theirs in zip(*kept) for a, b in zip(mine, theirs))


async def test_drafts_stop_where_a_stop_word_or_max_tokens_does(tiny_checkpoints):
    async with engine_on(tiny_checkpoints[0], speculative_tokens=0) as plain, engine_on(tiny_checkpoints[0]) as drafting:
        reference = (await plain.generate_all(completion(plain, QUOTING, max_tokens=40))).text
        stop = reference[len(reference) // 2 :][:2]
        for fields in ({"stop": [stop], "max_tokens": 40}, {"max_tokens": 7}, {"max_tokens": 1}):
            expected = await plain.generate_all(completion(plain, QUOTING, **fields))
            got = await drafting.generate_all(completion(drafting, QUOTING, **fields))
            assert (got.text, got.finish_reason, got.token_ids) == (expected.text, expected.finish_reason, expected.token_ids)
        assert drafting.scheduler.stats.accepted > 0


async def test_a_drafting_episode_reuses_its_prefixes_and_keeps_its_tokens(tiny_checkpoints):
    """The kept keys and values of a step whose draft was cut short are what the next turn
    finds in the prefix cache."""
    async def episode(engine) -> list:
        transcript, results = "", []
        for turn in range(3):
            messages = [{"role": "user", "content": QUOTING}, {"role": "assistant", "content": transcript}]
            request = ChatCompletionRequest(
                messages=messages, continue_final_message=True, add_generation_prompt=False, max_tokens=24, ignore_eos=True,
                temperature=0,
            )
            results.append(await engine.generate_all(engine.chat_jobs(request).jobs[0]))
            transcript += results[-1].text + f" Then step {turn}. "
        return results

    async with engine_on(tiny_checkpoints[0], speculative_tokens=0, prefix_cache_mib=0) as plain, engine_on(tiny_checkpoints[0]) as drafting:
        expected, got = await episode(plain), await episode(drafting)
        assert drafting.scheduler.stats.accepted > 0
    assert [r.token_ids for r in got] == [r.token_ids for r in expected]
    assert all(r.cached_tokens > 0 for r in got[1:])
