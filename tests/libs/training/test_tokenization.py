"""Loss masks on literal trajectories: the decoded target tokens are exactly the model's text."""

from gearshift.api.common.v1.common_pb2 import Mode, RoutingStrategy
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
    expected = "Plan: None\nmultiply</plan>\n" + TOOL_CALL + "\nPlan: None\n<answer>391</answer><|im_end|>"
    assert targets(tokenizer, encoded) == expected
    whole = tokenizer.decode(encoded.input_ids)
    assert "Results for tool call 1:\n391" in whole  # present in the input, just not learned
    assert "toolcalling_agent" in whole


def variant(trajectory, ident: str, mode: int, strategy: int, cost: float, correct: bool = True):
    copy = type(trajectory)()
    copy.CopyFrom(trajectory)
    copy.id, copy.mode, copy.routing_strategy = ident, mode, strategy
    copy.cost.total_usd, copy.reward.correct = cost, correct
    copy.labels["item_id"] = "item-1"
    return copy


def test_route_then_align_learns_the_cheapest_correct_mode_of_each_item():
    base = routed_instant()
    instant, reasoning, agentic = Mode.MODE_INSTANT, Mode.MODE_REASONING, Mode.MODE_AGENTIC
    forced, model, fallback = (RoutingStrategy.ROUTING_STRATEGY_FORCED, RoutingStrategy.ROUTING_STRATEGY_MODEL,
                               RoutingStrategy.ROUTING_STRATEGY_FALLBACK)
    group = [
        variant(base, "f-instant-wrong", instant, forced, 0.1, correct=False),
        variant(base, "f-reasoning", reasoning, forced, 0.4),
        variant(base, "f-agentic", agentic, forced, 0.9),
        variant(base, "m-agentic", agentic, model, 0.9),  # the model chose a dearer correct mode
        variant(base, "m-reasoning", reasoning, model, 0.4),
        variant(base, "fallback", reasoning, fallback, 0.4),
    ]
    assert tokenization.route_targets(group) == {"f-reasoning", "m-reasoning"}
    tie = [variant(base, "a", agentic, forced, 0.2), variant(base, "r", reasoning, forced, 0.2)]
    assert tokenization.route_targets(tie) == {"r"}  # equal cost: the cheaper mode
    alone = [variant(base, "m", agentic, model, 0.9), variant(base, "fb", instant, fallback, 0.1)]
    alone[1].labels["item_id"] = "item-2"
    assert tokenization.route_targets(alone) == {"m"}  # no forced outcomes: the model's own choice, never a fallback


def test_a_forced_trajectory_in_the_learned_mode_learns_its_routing_head(tokenizer):
    encoded = tokenization.encode_trajectory(tokenizer, forced_agentic(), learn_routing=True)
    assert targets(tokenizer, encoded).startswith("This question needs tools to answer reliably.\n<classification>\ntoolcalling_agent")


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
