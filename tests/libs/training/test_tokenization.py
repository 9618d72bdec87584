"""Loss masks on literal trajectories: the decoded target tokens are exactly the model's text."""

from gearshift.protocol import a2fm
from gearshift.training import tokenization

from tests.libs.training.trajectories import TOOL_CALL, forced_agentic, routed_instant


def targets(tokenizer, encoded) -> str:
    return tokenizer.decode([token for token, learned in zip(encoded.input_ids, encoded.target) if learned])


def test_segments_rebuild_the_transcript():
    for trajectory in (routed_instant(), forced_agentic()):
        assert "".join(s.text for s in tokenization.assistant_segments(trajectory)) == a2fm.render_transcript(trajectory)


def test_model_routed_learns_classification_and_answer_not_the_opener(tokenizer):
    encoded = tokenization.encode_trajectory(tokenizer, routed_instant())
    expected = "A simple fact.\n<classification>\ndefault_agent\n</classification>\nParis</answer><|im_end|>"
    assert targets(tokenizer, encoded) == expected


def test_forced_prefix_openers_and_tool_responses_are_masked_plans_are_learned(tokenizer):
    encoded = tokenization.encode_trajectory(tokenizer, forced_agentic())
    expected = "Plan: None\nmultiply</plan>\n" + TOOL_CALL + "\nPlan:\n<answer>391</answer><|im_end|>"
    assert targets(tokenizer, encoded) == expected
    whole = tokenizer.decode(encoded.input_ids)
    assert "Results for tool call 1:\n391" in whole  # present in the input, just not learned
    assert "toolcalling_agent" in whole


def test_prompt_is_the_serving_prompt_and_never_learned(tokenizer):
    encoded = tokenization.encode_trajectory(tokenizer, routed_instant())
    prompt = tokenizer(tokenization.prompt_text(tokenizer, "What is the capital of France?"), add_special_tokens=False)["input_ids"]
    assert encoded.input_ids[: len(prompt)] == prompt
    assert not any(encoded.target[: len(prompt)])


def test_truncation_and_collate_pad(tokenizer):
    short = tokenization.encode_trajectory(tokenizer, routed_instant(), max_length=20)
    long = tokenization.encode_trajectory(tokenizer, forced_agentic())
    assert len(short.input_ids) == 20
    batch = tokenization.collate([short, long], pad_id=0)
    assert batch.input_ids.shape == (2, len(long.input_ids))
    assert batch.attention_mask[0].sum() == 20 and not batch.target_mask[0, 20:].any()
    assert batch.tokens == 20 + len(long.input_ids)
