"""A rank's share of a step in micro-batches: each forward holds at most micro_batch_tokens
tokens (padding included), and gradients accumulate over the micro-batches to the step's global
batch. And the step's examples split over the ranks by tokens (balanced), not by count.

Two layouts (runtime.packing):
- padded (plan): one example per row, rows padded to the longest;
- packed (pack): the examples laid end to end in rows as wide as the micro-batch's longest
  example, first fit longest first, so a short example fills the room a long row's neighbours
  leave instead of padding. Position ids restart at each example and attention stays inside it
  (block-diagonal), so every example's values are those it has alone. Where every example shares
  a prefix before its first target (APO and distillation: the system prompt, two thirds of a
  short episode), each row holds the prefix once and the rest of each of its examples after it,
  attending to the prefix and to itself: the prefix decoded once per row, in the same decoder call.
  Packed rows are as wide as the longest example, not one row of micro_batch_tokens: on the
  sdpa and eager attentions a custom mask computes every (query, key) pair of a row, so one long
  row would cost the square of its width (see benchmarks/packing.py)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TypeVar

import torch

from gearshift.training.tokenization import PADDING, PREFIX, Batch, Encoded, collate

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
        return len(self.indices) if self.batch.packed else self.batch.input_ids.shape[0]

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


@dataclass
class _Packing:
    """A micro-batch being packed: rows of example indices (each after the prefix), and the room
    left in each."""

    width: int
    prefix: int
    rows: list[list[int]]
    room: list[int]

    def place(self, index: int, length: int, max_tokens: int) -> bool:
        """index into the first row with room for it, or a new row within max_tokens; False if neither."""
        for row, room in enumerate(self.room):
            if room >= length:
                self.rows[row].append(index)
                self.room[row] -= length
                return True
        if max_tokens and (len(self.rows) + 1) * self.width > max_tokens:
            return False
        self.rows.append([index])
        self.room.append(self.width - self.prefix - length)
        return True


def pack(examples: list[Encoded], max_tokens: int, pad_id: int, share_prefix: bool = True) -> list[MicroBatch]:
    """The examples packed (module docstring) in micro-batches of at most max_tokens tokens
    (rows x width, padding included; 0: no bound), each example whole in one row, longest first,
    first fit over every micro-batch so far; an example longer than the bound goes alone. With
    share_prefix, the prefix every example shares before its first target is held once per row
    (where that saves MIN_TOKENS_SAVED tokens or more)."""
    from gearshift.training.forward import MIN_TOKENS_SAVED  # forward imports tokenization, as this module does

    if not examples:
        return []
    prefix = common_prefix(examples) if share_prefix else 0
    rests = [len(example.input_ids) - prefix for example in examples]
    packings: list[_Packing] = []
    for index in sorted(range(len(examples)), key=lambda i: (-rests[i], i)):
        if not any(packing.place(index, rests[index], max_tokens) for packing in packings):  # only the last takes a new row
            packings.append(_Packing(prefix + rests[index], prefix, [[index]], [0]))
    if prefix and prefix * (len(examples) - sum(len(packing.rows) for packing in packings)) < MIN_TOKENS_SAVED:
        return pack(examples, max_tokens, pad_id, share_prefix=False)
    micro_batches = []
    for packing in packings:
        indices = sorted(index for row in packing.rows for index in row)
        local = {index: row for row, index in enumerate(indices)}
        rows = [[local[index] for index in sorted(row)] for row in packing.rows]
        chosen = [examples[index] for index in indices]
        micro_batches.append(MicroBatch(indices, packed(rows, chosen, pad_id, prefix, packing.width), bool(prefix), chosen, pad_id))
    return micro_batches


def packed(rows: list[list[int]], examples: list[Encoded], pad_id: int, prefix: int = 0, width: int = 0) -> Batch:
    """The examples laid out in rows (indices into examples, each row's in order), every row
    starting with the first prefix tokens once (they are every example's first tokens) and
    padded to width (at least the widest row)."""
    lengths = [prefix + sum(len(examples[i].input_ids) - prefix for i in row) for row in rows]
    width = max(width, *lengths)
    ids = torch.full((len(rows), width), pad_id, dtype=torch.long)
    target = torch.zeros((len(rows), width), dtype=torch.bool)
    positions = torch.arange(width).repeat(len(rows), 1)
    sequences = torch.full((len(rows), width), PADDING, dtype=torch.long)
    for row, members in enumerate(rows):
        if prefix:
            ids[row, :prefix] = torch.tensor(examples[members[0]].input_ids[:prefix])
            sequences[row, :prefix] = PREFIX
        at = prefix
        for index in members:
            rest = len(examples[index].input_ids) - prefix
            ids[row, at:at + rest] = torch.tensor(examples[index].input_ids[prefix:])
            target[row, at:at + rest] = torch.tensor(examples[index].target[prefix:])
            positions[row, at:at + rest] = torch.arange(prefix, prefix + rest)
            sequences[row, at:at + rest] = index
            at += rest
        positions[row, at:] = torch.arange(width - at)  # the padding: a sequence of its own
    return Batch(ids, (sequences != PADDING).long(), target, positions, sequences)


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
    row = Encoded([pad_id] * DUMMY_TOKENS, [False] * (DUMMY_TOKENS - 1) + [True])
    return MicroBatch([], collate([row, row], pad_id), share_prefix)


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
    """This rank's items (ranks: distributed.Ranks), the step's items split over the ranks by
    tokens(item) (balance): every loss is normalised by a count over the global batch, so the
    update does not depend on the split."""
    return [items[i] for i in balance([tokens(item) for item in items], ranks.world_size)[ranks.rank]]
