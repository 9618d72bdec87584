"""The peak bytes of live tensors while some code runs (forward and backward), counted op by op
through a dispatch mode: exact on any device, the CPU included, where torch keeps no memory
statistics. A storage counts from the op that made it until its last reference goes."""

from __future__ import annotations

import weakref

import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_leaves


class LiveTensors(TorchDispatchMode):
    """with LiveTensors() as live: ...; then live.peak: the most bytes that ops made and that were
    alive at once (inputs made before the block are not counted)."""

    def __init__(self):
        super().__init__()
        self.live = self.peak = 0
        self._seen: set[int] = set()

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        for value in tree_leaves(out):
            if isinstance(value, torch.Tensor):
                self._count(value.untyped_storage())
        return out

    def _count(self, storage: torch.UntypedStorage) -> None:
        key = storage._cdata
        if key in self._seen:
            return
        self._seen.add(key)
        self.live += storage.nbytes()
        self.peak = max(self.peak, self.live)
        weakref.finalize(storage, self._free, key, storage.nbytes())

    def _free(self, key: int, size: int) -> None:
        self._seen.discard(key)
        self.live -= size
