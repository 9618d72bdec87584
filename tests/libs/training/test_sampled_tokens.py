"""On-policy training learns exactly the tokens the policy sampled. Real episodes through the
executor with the tiny random policy at temperature 1: its samples are often not how the
tokenizer would cut their text, which is what made re-tokenised log-probs off-policy."""

from __future__ import annotations

import pytest
from gearshift.api.common.v1.common_pb2 import Mode, Sampling, Trajectory
from gearshift.api.executor.v1 import executor_pb2, executor_pb2_grpc
from gearshift.clients import channel
from gearshift.embedded import embedded
from gearshift.errors import FailedPrecondition
from gearshift.training.on_policy import encode_rollouts
from gearshift.settings import ExecutorSettings, Settings
from gearshift.training import tokenization
from gearshift.training.config import RolloutConfig

from tests.libs.training.trajectories import forced_agentic


@pytest.fixture(scope="module")
async def rollouts(tmp_path_factory, tiny_dir) -> list[Trajectory]:
    settings = Settings(data_dir=tmp_path_factory.mktemp("sampled"), metrics_port=0,
                        executor=ExecutorSettings(max_tokens_per_turn=16, max_steps_agentic=2, max_steps_other=2))
    async with embedded(settings, policy_model=str(tiny_dir)) as platform, channel(platform.settings.executor_addr, platform.settings) as ch:
        stub = executor_pb2_grpc.ExecutorStub(ch)
        episodes = []
        for seed, mode in enumerate([Mode.MODE_INSTANT, Mode.MODE_REASONING, Mode.MODE_AGENTIC] * 2):
            request = executor_pb2.SolveRequest(query=f"What is {seed} + 17?", mode=mode, sampling=Sampling(temperature=1.0, top_p=1.0))
            episodes.append([event async for event in stub.Solve(request)][-1].final.trajectory)
    return episodes


def longest_sampled_prefix(tokenizer, ids, text: str) -> list[int]:
    """By brute force: the most leading ids whose decoding is a prefix of text."""
    best = []
    for n in range(len(ids) + 1):
        if text.startswith(tokenizer.decode(ids[:n], skip_special_tokens=False, clean_up_tokenization_spaces=False)):
            best = list(ids[:n])
    return best


def test_every_generation_keeps_the_ids_it_sampled(rollouts, tokenizer):
    generated = 0
    for trajectory in rollouts:
        for turn in trajectory.turns:
            for span in turn.sampled:
                text = turn.output[span.start : span.end]
                assert text and span.token_ids
                # What the ids decode to starts the way the kept text does (a stop word the
                # platform closed, or text it wrote after, may part from it only at the end).
                matched = longest_sampled_prefix(tokenizer, span.token_ids, text)
                assert matched, (text, span.token_ids)
                generated += 1
    assert generated >= len(rollouts)


def test_exact_encoding_learns_the_sampled_ids_where_re_tokenising_would_not(rollouts, tokenizer):
    re_tokenised_differs = 0
    for trajectory in rollouts:
        exact = tokenization.encode_trajectory(tokenizer, trajectory, learn_routing=False, exact=True)
        learned = [token for token, target in zip(exact.input_ids, exact.target) if target]
        expected = []
        for turn in trajectory.turns:
            for span in sorted(turn.sampled, key=lambda s: s.start):
                sampled = longest_sampled_prefix(tokenizer, span.token_ids, turn.output[span.start : span.end])
                expected += sampled
                text = tokenizer.decode(sampled, skip_special_tokens=False, clean_up_tokenization_spaces=False)
                re_tokenised_differs += tokenizer(text, add_special_tokens=False)["input_ids"] != sampled
        assert learned == expected  # the sampled tokens, nothing else (the end-of-turn marker was never sampled)
        loose = tokenization.encode_trajectory(tokenizer, trajectory, learn_routing=False, exact=False)
        assert loose.target_count - exact.target_count == exact.unsampled == loose.unsampled
    # The old re-tokenised targets were other tokens than the ones sampled, for some turns.
    assert re_tokenised_differs > 0


def test_training_on_rollouts_that_kept_no_ids_is_refused_unless_asked(tokenizer):
    stored_without_ids = forced_agentic()
    with pytest.raises(FailedPrecondition, match="sampled token ids"):
        encode_rollouts(tokenizer, [stored_without_ids], RolloutConfig(), 4096)
    loose = encode_rollouts(tokenizer, [stored_without_ids], RolloutConfig(exact_tokens=False), 4096)[0]
    assert loose.target_count > 0 and loose.unsampled == loose.target_count


def test_a_sampled_span_past_its_text_learns_only_the_tokens_inside(tokenizer):
    """A plan the platform cut, a stop word's token running past the kept text: the ids beyond
    are not learned, and text the platform rewrote is masked in exact encoding."""
    text = "run python to compute it"
    ids = tokenizer(text + "\n- Expected Outcome: more", add_special_tokens=False)["input_ids"]
    sampled, chars = tokenization.sampled_prefix(tokenizer, tuple(ids), text)
    assert chars == len(text) and tokenizer.decode(sampled) == text
    rewritten = "run python to find it"
    sampled, chars = tokenization.sampled_prefix(tokenizer, tuple(ids), rewritten)
    assert rewritten.startswith(tokenizer.decode(sampled)) and chars < len("run python to f")
    segments = [tokenization.Segment(rewritten, True, tuple(ids))]
    exact = tokenization.encode(tokenizer, "q", segments, end_of_turn=False, exact=True)
    assert tokenizer.decode([t for t, target in zip(exact.input_ids, exact.target) if target]) == rewritten[:chars]
    assert exact.unsampled > 0
