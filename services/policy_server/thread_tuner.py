"""The scheduler thread's OpenMP thread count, chosen by timing decode steps.

Two threads spinning between kernels (openmp.py) decode an 8-row SmolLM2 step 1.7x faster than
one thread on two idle cores (70 against 119 ms), and 2.5x slower when another process holds one
of the cores (302 against 122 ms): the spinning thread burns its turn waiting for a partner that
is not running. Which case holds changes while a server runs, so it is measured, not configured.
"""

import statistics
import time
from collections import deque
from collections.abc import Callable
from typing import TypeVar

import torch

T = TypeVar("T")


class ThreadTuner:
    """Runs decode steps on `most` threads, or on one while one is clearly faster.

    Every `every` steps the other count runs `trial` steps, compared with the `trial` steps just
    before at the same batch size, nothing else between them (reset() drops a trial). One thread is
    chosen only when it beats `most` by `margin`: for one row the two are close on idle cores,
    and prefill, big kernels that run on the same count, wants every thread. `every` 0 never
    tries. The scheduler thread owns it: OpenMP's thread count is per thread."""

    def __init__(self, most: int, every: int = 128, trial: int = 3, margin: float = 0.2):
        self.most, self.every, self.trial, self.margin = max(1, most), every, trial, margin
        self.threads = self.most
        self.switches = 0
        self._steps = 0
        self._before: deque[tuple[int, float]] = deque(maxlen=trial)  # (rows, seconds) on self.threads
        self._trying: list[tuple[int, float]] | None = None

    @property
    def other(self) -> int:
        return 1 if self.threads == self.most else self.most

    def run(self, rows: int, step: Callable[[], T]) -> T:
        """Runs one decode step of `rows` rows, timed."""
        started = time.perf_counter()
        result = step()
        self._record(rows, time.perf_counter() - started)
        return result

    def reset(self) -> None:
        """Forgets the steps so far and ends a trial: what ran between steps (a prefill) makes
        the next ones incomparable with them."""
        self._before.clear()
        if self._trying is not None:
            self._trying = None
            torch.set_num_threads(self.threads)

    def _record(self, rows: int, seconds: float) -> None:
        if self._trying is not None:
            self._trying.append((rows, seconds))
            if len(self._trying) == self.trial:
                self._decide()
            return
        self._before.append((rows, seconds))
        self._steps += 1
        if self.every and self.most > 1 and self._steps % self.every == 0 and len(self._before) == self.trial:
            self._trying = []
            torch.set_num_threads(self.other)

    def _decide(self) -> None:
        trying, before, self._trying = self._trying, list(self._before), None
        self._before.clear()
        if len({rows for rows, _ in trying + before}) == 1:
            seconds = {self.other: statistics.median(s for _, s in trying), self.threads: statistics.median(s for _, s in before)}
            chosen = 1 if seconds[1] < (1 - self.margin) * seconds[self.most] else self.most
            self.switches += chosen != self.threads
            self.threads = chosen
        torch.set_num_threads(self.threads)
