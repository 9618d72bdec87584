"""Trajectories to token ids with loss masks, through the model's own chat template
(docs/protocol.md, section 9).

The prompt is exactly what serving sends: prompts.messages(query, conversation=...) rendered
with the generation prompt, the client's instructions and earlier turns included. The assistant turn is the stored transcript (a2fm.render_transcript), cut into pieces
the model wrote (targets) and pieces the platform wrote (masked):
- tool responses (the environment's text);
- what the executor injects: the mode openers (<answer>, <reasoning>) and, recorded in each
  turn's injected spans, the first <plan> and the forced-answer opener.
SR2AM plan blocks are targets: SR2AM trains plans as part of the agent's reasoning, so the
policy learns when to plan and how far (the planner service asks the same policy).
The routing head (rationale and classification block) is a target when it names the mode the
model should choose (route_targets): one model learns to route, then to answer in that mode
(A^2FM route-then-align). A forced prefix of another mode and a router fallback stay masked.

Each piece is tokenized on its own, so no token straddles a learned and a masked piece (the
whole text tokenized at once merges, e.g., the ">" ending a tool call with the "<" opening the
tool response). Where the trajectory kept what the policy sampled (SampledSpan), a piece gets the
very token ids sampled, as far as they decode to its text; the rest of a learned piece is text
the platform wrote for the policy (the "Plan:" head, a re-rendered plan, a cut rationale), and
on-policy training (exact=True) masks it: the policy ratio is taken on sampled tokens only.

A native trajectory (Trajectory.protocol NATIVE, gearshift.protocol.native) is a chat
conversation instead: the chat template is applied to exactly the messages and tools it was
served, with the same chat_template_kwargs, and each assistant generation (from the template's
generation prompt to its end-of-message marker) is learned with the token ids sampled for it;
the prompt, the SR2AM opening messages, tool messages and the template's text between messages are masked.
Its routing head is not in that conversation (the router asks its own prompt), so it is not learned.
"""

from __future__ import annotations

import functools
import math
from collections import defaultdict
from collections.abc import Iterable
from dataclasses import dataclass

import torch

from gearshift.api.common.v1.common_pb2 import Conversation, RoutingStrategy, Trajectory, TrajectoryStatus
from gearshift.protocol import a2fm, native, prompts


@dataclass(frozen=True)
class Segment:
    """A piece of the assistant turn, whether the loss learns it, and the token ids the policy
    sampled from its start, where kept (with their log-probabilities under the sampling policy,
    where kept: one per id)."""

    text: str
    target: bool
    sampled: tuple[int, ...] | None = None
    logprobs: tuple[float, ...] | None = None


@dataclass
class Encoded:
    """Token ids of prompt + assistant turn; target[i] says token i is learned (predicted from i-1).
    unsampled counts the tokens of learned pieces that the policy did not sample (re-tokenised
    text; masked when encoded exact). behaviour[i] is token i's log-probability under the policy
    that sampled it (NaN where not kept: text the policy did not sample, a server that did not
    return them); None when no token has one. truncated counts the tokens cut at max_length."""

    input_ids: list[int]
    target: list[bool]
    unsampled: int = 0
    behaviour: list[float] | None = None
    truncated: int = 0  # tokens cut at max_length

    @property
    def target_count(self) -> int:
        return sum(self.target)

    def target_behaviour(self) -> list[float]:
        """The behaviour log-probabilities of the target tokens, in order (NaN where not kept)."""
        if self.behaviour is None:
            return [math.nan] * self.target_count
        return [value for value, learned in zip(self.behaviour, self.target) if learned]


def route_targets(trajectories: Iterable[Trajectory]) -> set[str]:
    """Ids of the trajectories whose routing head is learned. For an item with correct forced-mode
    trajectories, the classification to learn is the item's cheapest correct mode (by mean cost,
    ties to the cheaper mode): every correct trajectory in that mode learns its head, forced or
    not. Elsewhere a trajectory the model routed itself learns its own. A fallback never does."""
    by_item: dict[str, list[Trajectory]] = defaultdict(list)
    for trajectory in trajectories:
        by_item[trajectory.labels.get("item_id") or trajectory.query].append(trajectory)
    learned = set()
    for group in by_item.values():
        correct = [t for t in group if t.reward.correct and t.routing_strategy != RoutingStrategy.ROUTING_STRATEGY_FALLBACK]
        forced = [t for t in correct if t.routing_strategy == RoutingStrategy.ROUTING_STRATEGY_FORCED]
        if forced:
            costs = defaultdict(list)
            for t in forced:
                costs[t.mode].append(t.cost.total_usd)
            best = min(costs, key=lambda mode: (sum(costs[mode]) / len(costs[mode]), mode))
            learned |= {t.id for t in correct if t.mode == best}
        else:
            learned |= {t.id for t in group if t.routing_strategy == RoutingStrategy.ROUTING_STRATEGY_MODEL}
    return learned


def assistant_segments(trajectory: Trajectory, learn_routing: bool | None = None) -> list[Segment]:
    """The assistant turn of a stored trajectory in target and masked pieces; joined, they equal
    a2fm.render_transcript(trajectory). The routing head is learned when learn_routing says so
    (default: when the model routed itself)."""
    if learn_routing is None:
        learn_routing = trajectory.routing_strategy == RoutingStrategy.ROUTING_STRATEGY_MODEL
    head = f"{trajectory.routing_rationale}\n" if trajectory.routing_rationale else ""
    pieces = _cut(head + a2fm.classification_block(trajectory.mode), learn_routing, trajectory.routing_sampled, [])
    pieces.append(Segment(prompts.MODE_OPENERS[trajectory.mode], target=False))
    for turn in trajectory.turns:
        pieces += turn_segments(turn)
        pieces.append(Segment(a2fm.tool_response_of(turn.tool_results), target=False))
    return [piece for piece in pieces if piece.text]


def turn_segments(turn) -> list[Segment]:
    """A turn's output: what the executor injected (its recorded spans: the <plan> opener, the
    forced-answer opener) masked, the rest learned (the SR2AM plan block is the agent's own
    reasoning), cut where the policy's samples begin."""
    return _cut(turn.output, True, turn.sampled, list(zip(turn.injected_spans[::2], turn.injected_spans[1::2])))


def _cut(text: str, target: bool, sampled, injected: list[tuple[int, int]]) -> list[Segment]:
    """text in pieces: the injected spans masked, the sampled spans with their ids, the rest as
    target says. The spans do not overlap (each is a different call's text)."""
    spans = [(start, end, False, None, None) for start, end in injected]
    spans += [(span.start, span.end, target, tuple(span.token_ids), tuple(span.logprobs) or None) for span in sampled]
    pieces, at = [], 0
    for start, end, learned, ids, logprobs in sorted(spans, key=lambda span: span[0]):
        pieces += [Segment(text[at:start], target), Segment(text[start:end], learned, ids, logprobs)]
        at = end
    return pieces + [Segment(text[at:], target)]


def prompt_text(tokenizer, query: str, conversation: Conversation | None = None) -> str:
    """The prompt serving sends for a query in its conversation: system (the platform's prompt,
    then the client's instructions) + earlier turns + user + the assistant turn's opening."""
    return tokenizer.apply_chat_template(prompts.messages(query, conversation=conversation), tokenize=False,
                                         add_generation_prompt=True)


@functools.lru_cache(maxsize=8)
def _end_of_turn(tokenizer) -> str:
    """The text the chat template closes an assistant turn with, without trailing whitespace."""
    chat = prompts.messages("q", "a")
    whole = tokenizer.apply_chat_template(chat, tokenize=False)
    opened = tokenizer.apply_chat_template(chat, tokenize=False, continue_final_message=True)
    return whole[len(opened):].rstrip()


def encode(tokenizer, query: str, segments: list[Segment], end_of_turn: bool, max_length: int | None = None,
           exact: bool = False, conversation: Conversation | None = None) -> Encoded:
    """Tokenizes prompt + segments (+ the end-of-turn marker as a target when end_of_turn). A
    piece's sampled ids are used as far as they decode to its text; exact: only sampled tokens
    are learned."""
    prompt = Segment(prompt_text(tokenizer, query, conversation), target=False)
    pieces = [prompt, *segments] + ([Segment(_end_of_turn(tokenizer), True)] if end_of_turn else [])
    return encode_pieces(tokenizer, pieces, max_length, exact)


def encode_pieces(tokenizer, pieces: list[Segment], max_length: int | None = None, exact: bool = False) -> Encoded:
    """Tokenizes the pieces one by one, each with its target flag; a piece's sampled ids are used
    as far as they decode to its text; exact: only sampled tokens are learned."""
    ids: list[int] = []
    target: list[bool] = []
    behaviour: list[float] = []
    unsampled = 0
    for piece in pieces:
        sampled, chars = sampled_prefix(tokenizer, piece.sampled or (), piece.text)
        rest = _ids(tokenizer, piece.text[chars:]) if chars < len(piece.text) else []
        ids += sampled + rest
        target += [piece.target] * len(sampled) + [piece.target and not exact] * len(rest)
        behaviour += list(piece.logprobs[: len(sampled)]) if piece.logprobs else [math.nan] * len(sampled)
        behaviour += [math.nan] * len(rest)
        unsampled += len(rest) if piece.target else 0
    truncated = max(0, len(ids) - max_length) if max_length is not None else 0
    if truncated:
        ids, target, behaviour = ids[:max_length], target[:max_length], behaviour[:max_length]
    return Encoded(ids, target, unsampled, behaviour if any(value == value for value in behaviour) else None, truncated)


def sampled_prefix(tokenizer, sampled: tuple[int, ...], text: str) -> tuple[list[int], int]:
    """The longest prefix of the sampled ids whose decoding is a prefix of text, and how many
    characters of text it covers. The ids may run past the text (a stop word's last token, a
    plan the platform cut) or part from it (text the platform rewrote)."""
    if not sampled:
        return [], 0

    def decoded(n: int) -> str:
        return tokenizer.decode(sampled[:n], skip_special_tokens=False, clean_up_tokenization_spaces=False)

    low, high = 0, len(sampled)  # decoded(low) is a prefix of text; search the largest such n
    while low < high:
        middle = (low + high + 1) // 2
        if text.startswith(decoded(middle)):
            low = middle
        else:
            high = middle - 1
    return list(sampled[:low]), len(decoded(low))


def _ids(tokenizer, text: str) -> list[int]:
    return list(tokenizer(text, add_special_tokens=False)["input_ids"])


def native_segments(tokenizer, trajectory: Trajectory) -> list[Segment]:
    """The chat template's whole rendering of a native trajectory's conversation, prompt
    included, in pieces: each assistant generation learned, with the ids sampled for it, from
    the template's generation prompt (or the end of the opening it continued) to its
    end-of-message marker, or its end where the turn goes on (whitespace after it masked);
    everything else masked. ValueError for a template that renders a conversation's earlier
    messages differently once later ones follow (the generations could not be told apart)."""
    chat = native.episode(trajectory)
    bodies = native.template_messages([message.body for message in chat])
    tools, kwargs = native.served_tools(trajectory), native.served_kwargs(trajectory)

    def render(count: int, opened: bool = False, continued: bool = False) -> str:
        return tokenizer.apply_chat_template(bodies[:count], tools=tools, tokenize=False, add_generation_prompt=opened,
                                             continue_final_message=continued, **kwargs)

    def prompt_of(index: int, through: str) -> str:
        """Where message index starts in the rendering: after the generation prompt, or, for a
        template that renders it as one message with the opening before it (the turn's SR2AM
        block, which the request continued: the A^2FM template), right after that opening."""
        opened = render(index, opened=True)
        if through.startswith(opened) or bodies[index - 1]["role"] != "assistant":
            return opened
        return render(index, continued=True)

    whole = render(len(bodies))
    pieces, at = [], 0
    for index, message in enumerate(chat):
        if message.generated_by is None:
            continue
        through = render(index + 1)
        before = prompt_of(index, through)
        # Where the message ends: its end-of-message marker, or, where the turn goes on after it
        # (a tool result in the same turn, as the A^2FM template renders it), just before it.
        ended = through.rstrip()
        if not whole.startswith(ended) and tokenizer.eos_token and ended.endswith(tokenizer.eos_token):
            ended = ended.removesuffix(tokenizer.eos_token)
        if not (through.startswith(before) and whole.startswith(ended) and len(ended) > len(before)):
            raise ValueError(f"trajectory {trajectory.id}: the chat template renders message {index} apart from the rest")
        end = len(ended)
        pieces += [Segment(whole[at:len(before)], False), Segment(whole[len(before):end], True, tuple(message.generated_by.token_ids) or None,
                                                               tuple(message.generated_by.token_logprobs) or None)]
        at = end
    pieces.append(Segment(whole[at:], False))
    return [piece for piece in pieces if piece.text]


def encode_trajectory(tokenizer, trajectory: Trajectory, max_length: int | None = None, learn_routing: bool | None = None,
                      exact: bool = False, end_of_turn: bool | None = None) -> Encoded:
    """A stored trajectory with its masks. Text protocol: a completed one also learns to end its
    turn (end_of_turn: whether to, instead). Native: its conversation through the chat template
    (native_segments), every generation learning its own end as the template writes it."""
    if native.is_native(trajectory):
        return encode_pieces(tokenizer, native_segments(tokenizer, trajectory), max_length, exact)
    if end_of_turn is None:
        end_of_turn = trajectory.status == TrajectoryStatus.TRAJECTORY_STATUS_COMPLETED
    return encode(tokenizer, trajectory.query, assistant_segments(trajectory, learn_routing), end_of_turn, max_length, exact,
                  trajectory.conversation)


PADDING = -1  # sequence_ids of a packed batch's padding
PREFIX = -2  # sequence_ids of a packed row's shared prefix, which every sequence of the row continues


@dataclass
class Batch:
    """Right-padded tensors; target_mask[b, t] says token t of row b is learned. A packed batch
    (batching.pack) holds several sequences in a row: sequence_ids[b, t] is the example (the
    micro-batch's row) token t belongs to (PADDING, PREFIX), position_ids[b, t] its position in
    that example, which restarts at each sequence (and continues the prefix's)."""

    input_ids: torch.Tensor
    attention_mask: torch.Tensor
    target_mask: torch.Tensor
    position_ids: torch.Tensor | None = None
    sequence_ids: torch.Tensor | None = None

    @property
    def tokens(self) -> int:
        return int(self.attention_mask.sum())

    @property
    def packed(self) -> bool:
        return self.sequence_ids is not None

    def to(self, device: torch.device) -> Batch:
        return Batch(*(None if tensor is None else tensor.to(device) for tensor in
                       (self.input_ids, self.attention_mask, self.target_mask, self.position_ids, self.sequence_ids)))


def collate(examples: list[Encoded], pad_id: int) -> Batch:
    """Pads a list of encoded examples to the longest one."""
    width = max(len(example.input_ids) for example in examples)
    ids = torch.full((len(examples), width), pad_id, dtype=torch.long)
    attention = torch.zeros((len(examples), width), dtype=torch.long)
    target = torch.zeros((len(examples), width), dtype=torch.bool)
    for row, example in enumerate(examples):
        n = len(example.input_ids)
        ids[row, :n] = torch.tensor(example.input_ids)
        attention[row, :n] = 1
        target[row, :n] = torch.tensor(example.target)
    return Batch(ids, attention, target)
