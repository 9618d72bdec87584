"""A rank's share of a step in micro-batches: each forward holds at most micro_batch_tokens
tokens (padding included), and gradients accumulate over the micro-batches to the step's global
batch. And the step's examples split over the ranks by tokens (balanced), not by count.

Two layouts (runtime.packing):
- padded (plan): one example per row, rows padded to the longest;
- packed (pack): the examples laid end to end in one row per micro-batch, first fit longest first,
  with no padding at all. Position ids restart at each example and attention stays inside it
  (varlen: flash attention's cu_seqlens on GPUs, forward.block_attention's per-example blocks on
  the sdpa attention), so every example's values are those it has alone. Where every example
  shares a prefix before its first target (APO and distillation: the system prompt, two thirds of
  a short episode), the row holds the prefix once and the rest of each example after it, each
  attending to the prefix and to itself: the prefix decoded once per micro-batch, in the same call."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TypeVar

import torch

from gearshift.training.tokenization import PREFIX, Batch, Encoded, collate

T = TypeVar("T")

DUMMY_TOKENS = 24  # a filler long enough to share a prefix, so it can match either forward path


@dataclass
class MicroBatch:
    """Rows of the rank's examples (indices into them) in one batch, padded or packed (examples
    then keeps them, to pack a selection of them again). A filler has no rows: it runs so that
    every rank makes the same collective calls, and learns nothing."""

    indices: list[int]
    batch: Batch
    share_prefix: bool = True  # whether the forward may decode a shared prefix once (forward.py)
    examples: list[Encoded] = field(default_factory=list)  # a packed batch's, in the order of indices
    pad_id: int = 0

    @property
    def filler(self) -> bool:
        return not self.indices

    @property
    def rows(self) -> int:
        """The micro-batch's examples (a padded batch's rows, a filler's included)."""
        return len(self.examples) if self.batch.packed else self.batch.input_ids.shape[0]

    def select(self, rows: list[int], share_prefix: bool = True) -> MicroBatch:
        """These rows of the micro-batch alone (packed again, or at the same positions)."""
        if self.batch.packed:
            examples = [self.examples[row] for row in rows]
            # Never a prefix where the micro-batch had none (the attention may take no mask).
            (micro,) = pack(examples, 0, self.pad_id, share_prefix and self.share_prefix)
            micro.indices = [self.indices[row] for row in rows]
            return micro
        batch = Batch(self.batch.input_ids[rows], self.batch.attention_mask[rows], self.batch.target_mask[rows])
        return MicroBatch([self.indices[row] for row in rows], batch, share_prefix)

    def gather(self, values: torch.Tensor) -> torch.Tensor:
        """Per-example values ([examples]) for this micro-batch's rows: zeros for a filler's."""
        return values[self.indices] if self.indices else values.new_zeros(self.rows)


def plan(examples: list[Encoded], max_tokens: int, pad_id: int) -> list[MicroBatch]:
    """The examples in micro-batches of at most max_tokens padded tokens (rows x longest row; 0: no
    bound). Longest rows first, so rows of similar length pad each other little; a row longer
    than the bound goes alone."""
    order = sorted(range(len(examples)), key=lambda i: -len(examples[i].input_ids))
    groups: list[list[int]] = []
    for index in order:
        group = groups[-1] if groups else None
        width = len(examples[group[0]].input_ids) if group else 0  # the group's first row is its longest
        if group is not None and (not max_tokens or width * (len(group) + 1) <= max_tokens):
            group.append(index)
        else:
            groups.append([index])
    return [MicroBatch(sorted(group), collate([examples[i] for i in sorted(group)], pad_id)) for group in groups]


def pack(examples: list[Encoded], max_tokens: int, pad_id: int, share_prefix: bool = True) -> list[MicroBatch]:
    """The examples end to end in one row per micro-batch of at most max_tokens tokens (0: no
    bound), each example whole, longest first, first fit over every micro-batch so far; an example
    longer than the bound goes alone. With share_prefix, the prefix every example shares before its
    first target is held once per micro-batch (where that saves MIN_TOKENS_SAVED tokens or more)."""
    from gearshift.training.forward import MIN_TOKENS_SAVED  # forward imports tokenization, as this module does

    if not examples:
        return []
    prefix = common_prefix(examples) if share_prefix else 0
    rests = [len(example.input_ids) - prefix for example in examples]
    groups: list[list[int]] = []
    tokens: list[int] = []
    for index in sorted(range(len(examples)), key=lambda i: (-rests[i], i)):
        fits = next((g for g, used in enumerate(tokens) if not max_tokens or used + rests[index] <= max_tokens), None)
        if fits is None:
            groups.append([index])
            tokens.append(prefix + rests[index])
        else:
            groups[fits].append(index)
            tokens[fits] += rests[index]
    if prefix and prefix * (len(examples) - len(groups)) < MIN_TOKENS_SAVED:
        return pack(examples, max_tokens, pad_id, share_prefix=False)
    micro_batches = []
    for group in groups:
        chosen = [examples[index] for index in sorted(group)]
        micro_batches.append(MicroBatch(sorted(group), packed(chosen, prefix), bool(prefix), chosen, pad_id))
    return micro_batches


def packed(examples: list[Encoded], prefix: int = 0) -> Batch:
    """The examples end to end in one row, after their first prefix tokens held once (they are
    every example's first tokens); position ids restart with each example, after the prefix."""
    ids, target = list(examples[0].input_ids[:prefix]), [False] * prefix
    positions, sequences = list(range(prefix)), [PREFIX] * prefix
    for index, example in enumerate(examples):
        rest = len(example.input_ids) - prefix
        ids += example.input_ids[prefix:]
        target += example.target[prefix:]
        positions += range(prefix, prefix + rest)
        sequences += [index] * rest
    row = [torch.tensor([values]) for values in (ids, target, positions, sequences)]
    return Batch(row[0], torch.ones_like(row[0]), row[1].bool(), row[2], row[3])


def common_prefix(examples: list[Encoded]) -> int:
    """How many leading tokens every example shares before any of them predicts a target (the
    last prefix token predicts no target); at least one token is always left to each."""
    first = examples[0].input_ids
    length = min(len(example.input_ids) for example in examples) - 1
    for example in examples:
        if True in example.target:
            length = min(length, example.target.index(True) - 1)
        length = min(length, next((i for i, (a, b) in enumerate(zip(first[:length], example.input_ids)) if a != b), length))
    return max(length, 0)


def filler(pad_id: int, share_prefix: bool = True) -> MicroBatch:
    """Two identical rows of padding, the last token a target."""
    return MicroBatch([], collate([_filler_row(pad_id)] * 2, pad_id), share_prefix)


def packed_filler(pad_id: int) -> MicroBatch:
    """filler's two rows packed in one (what context parallelism splits)."""
    rows = [_filler_row(pad_id)] * 2
    return MicroBatch([], packed(rows), False, rows, pad_id)


def _filler_row(pad_id: int) -> Encoded:
    return Encoded([pad_id] * DUMMY_TOKENS, [False] * (DUMMY_TOKENS - 1) + [True])


def balance(tokens: list[int], ranks: int) -> list[list[int]]:
    """Indices of items (tokens[i]: item i's tokens) for each of the ranks, so that their token
    counts are about equal: longest first, each to the rank with the fewest tokens so far (ties:
    fewer items, then the lower rank). Deterministic: every rank computes the same split. Each
    rank's indices ascend."""
    loads, shares = [0] * ranks, [[] for _ in range(ranks)]
    for index in sorted(range(len(tokens)), key=lambda i: (-tokens[i], i)):
        rank = min(range(ranks), key=lambda r: (loads[r], len(shares[r]), r))
        loads[rank] += tokens[index]
        shares[rank].append(index)
    return [sorted(share) for share in shares]


def balanced(ranks, items: list[T], tokens: Callable[[T], int]) -> list[T]:
    """This rank's items (ranks: distributed.Ranks), the step's items split over the data ranks by
    tokens(item) (balance): every loss is normalised by a count over the global batch, so the
    update does not depend on the split."""
    return [items[i] for i in balance([tokens(item) for item in items], ranks.data_ranks)[ranks.data_rank]]
