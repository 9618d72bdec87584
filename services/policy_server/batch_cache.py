"""The KV cache of a running batch: per layer one buffer [rows, kv_heads, capacity, head_dim],
written in place.

Rows are right-aligned: row i's n_i tokens sit in the last n_i of the `width` columns in use and
the columns before them are padding, masked out. So every row's next token goes into the same
column, one decode step is one forward over all rows, and a row's positions (RoPE) are its own
token count, not the column. transformers' DynamicCache would concatenate (copy) the whole cache
on every token; here a step writes one column and the buffer is copied only when rows join or
leave (rebuilt from the rows' views, padding trimmed) or when it runs out of columns.
"""

from __future__ import annotations

import torch
from transformers.cache_utils import Cache, CacheLayerMixin

RowKV = list[tuple[torch.Tensor, torch.Tensor]]  # per layer (keys, values), each [1, kv_heads, n, head_dim]
MIN_HEADROOM = 32  # columns added beyond the current width when a buffer is (re)allocated


class BufferLayer(CacheLayerMixin):
    """One layer's view of the buffers for one forward: new keys and values are written at column
    `width` onward, and attention reads the columns written so far."""

    def __init__(self, keys: torch.Tensor, values: torch.Tensor, width: int):
        super().__init__()
        self.keys, self.values, self.width = keys, values, width
        self.is_initialized = True

    def lazy_initialization(self, key_states: torch.Tensor, value_states: torch.Tensor) -> None:
        raise AssertionError("buffers are allocated before the forward")

    def update(self, key_states: torch.Tensor, value_states: torch.Tensor, *args, **kwargs):
        end = self.width + key_states.shape[-2]
        self.keys[:, :, self.width : end] = key_states
        self.values[:, :, self.width : end] = value_states
        self.width = end
        return self.keys[:, :, :end], self.values[:, :, :end]

    def get_mask_sizes(self, query_length: int) -> tuple[int, int]:
        return self.width + query_length, 0

    def get_seq_length(self) -> int:
        return self.width

    def get_max_length(self) -> int:
        return self.keys.shape[-2]


class BatchCache:
    """The padded, right-aligned KV cache of the rows decoded together."""

    def __init__(self, buffers: RowKV, lengths: list[int], width: int):
        self.buffers = buffers  # per layer (keys, values): [rows, kv_heads, capacity, head_dim]
        self.lengths = lengths  # real tokens per row
        self.width = width  # columns in use (the longest row)

    @classmethod
    def of_rows(cls, rows: list[RowKV], headroom: int = MIN_HEADROOM) -> BatchCache:
        """A fresh cache holding copies of the given rows, right-aligned."""
        lengths = [row[0][0].shape[-2] for row in rows]
        width = max(lengths)
        capacity = width + max(headroom, MIN_HEADROOM)
        buffers = []
        for layer in range(len(rows[0])):
            keys, values = rows[0][layer]
            shape = (len(rows), keys.shape[1], capacity, keys.shape[-1])
            # Columns from `width` on are written before they are read. Padding is read, masked,
            # so it is zeroed: 0 x NaN from stale memory would still be NaN.
            layer_keys, layer_values = keys.new_empty(shape), values.new_empty(shape)
            for index, (row, length) in enumerate(zip(rows, lengths)):
                for buffer, part in ((layer_keys, row[layer][0][0]), (layer_values, row[layer][1][0])):
                    buffer[index, :, : width - length] = 0
                    buffer[index, :, width - length : width] = part
            buffers.append((layer_keys, layer_values))
        return cls(buffers, lengths, width)

    @property
    def rows(self) -> int:
        return len(self.lengths)

    def row(self, index: int) -> RowKV:
        """Row index's keys and values (views into the buffers: clone them to keep them)."""
        start = self.width - self.lengths[index]
        return [(k[index : index + 1, :, start : self.width], v[index : index + 1, :, start : self.width]) for k, v in self.buffers]

    def reserve(self, columns: int) -> None:
        """Makes room for `columns` more tokens per row, growing the buffers by half when full."""
        capacity = self.buffers[0][0].shape[-2]
        if self.width + columns <= capacity:
            return
        grown = self.width + columns + max(MIN_HEADROOM, self.width // 2)
        resized = []
        for keys, values in self.buffers:
            shape = (*keys.shape[:2], grown, keys.shape[-1])
            new_keys, new_values = keys.new_empty(shape), values.new_empty(shape)
            new_keys[:, :, : self.width] = keys[:, :, : self.width]
            new_values[:, :, : self.width] = values[:, :, : self.width]
            resized.append((new_keys, new_values))
        self.buffers = resized

    def for_forward(self) -> Cache:
        """A transformers Cache writing into these buffers (call advance after the forward)."""
        return Cache(layers=[BufferLayer(keys, values, self.width) for keys, values in self.buffers])

    def decode_mask(self) -> torch.Tensor | None:
        """The attention mask of one decode step, [rows, 1, 1, width + 1]: a row sees its own
        tokens and the new one, never another row's padding. None when no row is padded (a
        single row, say): attention without a mask takes the faster kernel."""
        if min(self.lengths) == self.width:
            return None
        columns = torch.arange(self.width + 1)
        first = self.width - torch.tensor(self.lengths)
        return (columns[None, :] >= first[:, None])[:, None, None, :]

    def positions(self) -> torch.Tensor:
        """Position ids of each row's next token, [rows, 1]."""
        return torch.tensor(self.lengths)[:, None]

    def advance(self, columns: int = 1) -> None:
        self.width += columns
        self.lengths = [length + columns for length in self.lengths]

    def drop(self, columns: int) -> None:
        """Forgets every row's last `columns` columns (a rejected draft's keys and values): the
        next forward writes over them."""
        self.width -= columns
        self.lengths = [length - columns for length in self.lengths]

    def nbytes(self) -> int:
        return sum(keys.nbytes + values.nbytes for keys, values in self.buffers)
