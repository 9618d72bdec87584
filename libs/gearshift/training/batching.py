"""A rank's share of a step in micro-batches: each forward holds at most micro_batch_tokens padded
tokens, and gradients accumulate over the micro-batches to the step's global batch."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from gearshift.training.tokenization import Batch, Encoded, collate

DUMMY_TOKENS = 24  # a filler long enough to share a prefix, so it can match either forward path


@dataclass
class MicroBatch:
    """Rows of the rank's examples (indices into them), padded into one batch. A filler has no
    rows: it runs so that every rank makes the same collective calls, and learns nothing."""

    indices: list[int]
    batch: Batch
    share_prefix: bool = True  # whether the forward may decode a shared prefix once (forward.py)

    @property
    def filler(self) -> bool:
        return not self.indices

    @property
    def rows(self) -> int:
        return self.batch.input_ids.shape[0]

    def select(self, rows: list[int], share_prefix: bool = True) -> MicroBatch:
        """These rows of the micro-batch alone (at the same positions)."""
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


def filler(pad_id: int, share_prefix: bool = True) -> MicroBatch:
    """Two identical rows of padding, the last token a target."""
    row = Encoded([pad_id] * DUMMY_TOKENS, [False] * (DUMMY_TOKENS - 1) + [True])
    return MicroBatch([], collate([row, row], pad_id), share_prefix)
