"""Continuous batching: one thread owns the model calls and decodes every running generation
together, one token per step; requests join the batch at the next step and leave as soon as
they finish, are cancelled or fail.

The shape is vLLM's scheduler, made small for a CPU: a waiting queue served first come, first
served (its cap answers 429), a running set capped in rows and in KV-cache token slots, and a
step that first admits what fits (prefill, with the prefix cache) and then decodes every running
row in one forward per set of weights (a lone greedy row with a draft of the tokens to come, see
speculation.py). Generations stay on the weights they were accepted with:
after a hot switch the old weights' batch drains while new requests start a batch on the new
ones, and the old model is freed when its last row leaves.

Everything the thread touches besides the waiting queue (guarded by a lock) belongs to it; the
event loop only reads counters and sets cancellation flags.
"""

from __future__ import annotations

import logging
import threading
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field

import torch
from gearshift.errors import ResourceExhausted
from gearshift.services.policy_server import runner, speculation
from gearshift.services.policy_server.batch_cache import BatchCache
from gearshift.services.policy_server.generation import (
    Delta,
    GenerationResult,
    OutputText,
    SamplingParams,
    TokenLogprob,
    penalised,
    pick_token,
    token_logprob,
)
from gearshift.services.policy_server.prefix_cache import PrefixCache
from gearshift.services.policy_server.thread_tuner import ThreadTuner
from gearshift.settings import PolicyServerSettings
from gearshift.weights import LoadedModel

log = logging.getLogger("gearshift.policy_server.scheduler")
MIB = 1024 * 1024
PREFILL_TOKENS = 2048  # padded prompt tokens one prefill forward takes: its activations stay small
CLOSE_WAIT_SECONDS = 60.0  # a step or a repacking of weights takes seconds at most


class QueueFull(ResourceExhausted):
    """Every batch slot is taken and the waiting queue is full: retry after a while."""

    def __init__(self, message: str, retry_after_seconds: int):
        super().__init__(message)
        self.retry_after_seconds = retry_after_seconds


def _prefill_groups(sequences: list[Sequence]) -> list[list[Sequence]]:
    """Consecutive sequences on the same weights, as many per group as keep the group's padded
    prompt tokens within PREFILL_TOKENS (a longer prompt is a group of its own). A prompt that
    several sequences share (a request's n choices, a group of rollouts) counts once: it is
    computed once."""
    groups: list[list[Sequence]] = []
    for sequence in sequences:
        group = groups[-1] if groups else []
        if group and group[0].loaded is sequence.loaded:
            distinct = {tuple(s.prompt_ids) for s in group} | {tuple(sequence.prompt_ids)}
            if len(distinct) * max(len(prompt) for prompt in distinct) <= PREFILL_TOKENS:
                group.append(sequence)
                continue
        groups.append([sequence])
    return groups


@dataclass(eq=False)  # compared by identity: rows are found in and removed from lists
class Sequence:
    """One generation from its acceptance to its end. deliver() hands the requester each Delta
    of text, then the GenerationResult (or an exception); it runs on the scheduler thread."""

    loaded: LoadedModel
    prompt_ids: list[int]
    params: SamplingParams
    deliver: Callable[[object], None]
    cancelled: bool = False  # set by the requester that went away
    output: OutputText = field(init=False)
    sampled: list[int] = field(default_factory=list)  # every token picked, stop tokens included
    cached_tokens: int = 0
    generator: torch.Generator | None = field(init=False)
    logprobs: list[TokenLogprob] = field(default_factory=list)  # per sampled token, when the params ask
    logprobs_sent: int = 0  # of them, handed out with a Delta

    def __post_init__(self) -> None:
        self.output = OutputText(self.loaded.tokenizer, self.params, self.loaded.stop_token_ids)
        self.generator = torch.Generator().manual_seed(self.params.seed) if self.params.seed is not None else None

    @property
    def reserved_tokens(self) -> int:
        """KV slots this sequence may come to need: its prompt and every token it may add."""
        return len(self.prompt_ids) + self.params.max_tokens

    @property
    def finished(self) -> bool:
        return self.output.finish_reason is not None

    def take(self, logits: torch.Tensor) -> None:
        """Picks the next token from logits and passes on the text that became safe to send."""
        token = pick_token(penalised(logits, self.params, self.output.tokens), self.params, self.generator)
        self.sampled.append(token)
        if self.params.logprobs is not None:  # off the path unless asked: a softmax over the vocabulary
            self.logprobs.append(token_logprob(logits, token, self.params.logprobs))
        piece = self.output.add(token)
        if piece:
            self.deliver(Delta(piece, self._unsent_logprobs()))

    def _unsent_logprobs(self) -> list[TokenLogprob] | None:
        """The output tokens' log-probabilities not handed out yet (a stop token is no output)."""
        if self.params.logprobs is None:
            return None
        end = len(self.output.tokens)
        unsent, self.logprobs_sent = self.logprobs[self.logprobs_sent : end], end
        return unsent

    def result(self) -> GenerationResult:
        out = self.output
        logprobs = self.logprobs[: len(out.tokens)] if self.params.logprobs is not None else None
        return GenerationResult(
            out.text, out.finish_reason or "length", len(self.prompt_ids), len(out.tokens), self.cached_tokens, list(out.tokens),
            logprobs,
        )


@dataclass
class RunningBatch:
    """The rows decoded together on one set of weights."""

    loaded: LoadedModel
    rows: list[Sequence] = field(default_factory=list)
    cache: BatchCache | None = None


@dataclass
class SchedulerStats:
    steps: int = 0  # decode forwards
    drafted: int = 0  # draft tokens checked (prompt lookup)
    accepted: int = 0  # draft tokens the model agreed with: tokens beyond one per step
    rejected: int = 0  # requests answered 429
    largest_batch: int = 0  # most rows one decode step ran


class Scheduler:
    """The waiting queue, the running batches and the thread that steps them."""

    def __init__(self, settings: PolicyServerSettings, current: LoadedModel):
        self.settings = settings
        self.current = current  # the model new generations start on (the engine swaps it on a hot switch)
        self.prefix_cache = PrefixCache(settings.prefix_cache_mib * MIB)
        self.stats = SchedulerStats()
        self.tuner = ThreadTuner(settings.threads, every=settings.thread_trial_every)
        self._waiting: deque[Sequence] = deque()
        self._admitting: list[Sequence] = []  # taken from the queue, being prefilled
        self._batches: dict[int, RunningBatch] = {}  # by id() of the weights
        self._cache_owner: LoadedModel | None = None
        self._to_prepare: list[LoadedModel] = []
        self._wake = threading.Condition()
        self._closed = False
        self._thread = threading.Thread(target=self._loop, name="policy-scheduler", daemon=True)
        self._thread.start()

    # The event loop's side

    def submit(self, sequences: list[Sequence]) -> None:
        """Queues sequences (all or none); QueueFull when the queue cannot take them all."""
        with self._wake:
            if len(self._waiting) + len(sequences) > self.settings.max_queue:
                self.stats.rejected += 1
                raise QueueFull(
                    f"the policy server is at capacity ({self.running} running, {len(self._waiting)} waiting): retry later",
                    self.settings.retry_after_seconds,
                )
            self._waiting.extend(sequences)
            self._wake.notify()

    def cancel(self, sequence: Sequence) -> None:
        sequence.cancelled = True
        with self._wake:
            self._wake.notify()

    def prepare(self, loaded: LoadedModel) -> None:
        """Has the thread build the hand-written decode step of weights this server loaded, before
        its next step. On this thread, not the loader's: relaid on the loading thread, the same
        weights decoded 1.1-1.8x slower in the server (measured, docs/policy-server.md)."""
        with self._wake:
            self._to_prepare.append(loaded)
            self._wake.notify()

    @property
    def waiting(self) -> int:
        return len(self._waiting)

    def _running(self) -> list[Sequence]:
        """Sequences being prefilled or decoded, each once: read from other threads without the
        scheduler's lock, a sequence joining its batch is briefly in both lists."""
        rows = [*self._admitting, *(row for batch in list(self._batches.values()) for row in batch.rows)]
        return list({id(row): row for row in rows}.values())

    @property
    def running(self) -> int:
        return len(self._running())

    def in_flight(self, loaded: LoadedModel | None = None) -> int:
        """Sequences queued or running (on the given weights only, when given)."""
        sequences = list(self._waiting) + self._running()
        return sum(1 for s in sequences if loaded is None or s.loaded is loaded)

    def close(self) -> None:
        """Stops the thread after its current step and waits for it: a daemon thread still inside a
        torch kernel when the interpreter exits aborts the process (as the repacking of weights
        just switched to did, at the end of a `gearshift loop` that published its candidate)."""
        with self._wake:
            self._closed = True
            self._wake.notify()
        self._thread.join(timeout=CLOSE_WAIT_SECONDS)
        if not self._thread.is_alive():
            # FastAPI caches a process's endpoints (closures over the engine, so over this scheduler)
            # after their app is gone: drop the weights, or every closed server keeps ~1 GiB alive.
            self.current = self._cache_owner = None
            self._batches.clear()
            self._to_prepare.clear()
            self.prefix_cache = PrefixCache(0)

    # The scheduler thread

    def _loop(self) -> None:
        torch.set_num_threads(self.tuner.threads)  # per thread: OpenMP's setting is thread-local
        with torch.inference_mode():
            while self._next_work():
                try:
                    self._step()
                except Exception as exc:  # a bug, not a request's fault: fail what runs, keep serving
                    log.exception("scheduler step failed")
                    self._fail_running(exc)

    def _step(self) -> None:
        self._prepare_loaded()
        self._drop_cancelled()
        self._admit()
        for key, batch in list(self._batches.items()):
            if batch.rows:
                self._decode(batch)
            if not batch.rows:
                del self._batches[key]  # old weights are freed with their last row

    def _prepare_loaded(self) -> None:
        with self._wake:
            loaded, self._to_prepare = self._to_prepare, []
        for model in loaded:
            runner.prepare(model.model)

    def _fail_running(self, exc: Exception) -> None:
        failed = self._admitting + [row for batch in self._batches.values() for row in batch.rows]
        self._admitting, self._batches = [], {}
        for sequence in failed:
            sequence.deliver(exc)

    def _next_work(self) -> bool:
        with self._wake:
            while not self._closed and not self._waiting and not self._batches and not self._to_prepare:
                self._wake.wait()
            return not self._closed

    def _drop_cancelled(self) -> None:
        with self._wake:
            if any(s.cancelled for s in self._waiting):
                self._waiting = deque(s for s in self._waiting if not s.cancelled)
        for batch in self._batches.values():
            if any(row.cancelled for row in batch.rows):
                self._retire(batch, [row for row in batch.rows if row.cancelled])

    def _fits(self, sequence: Sequence) -> bool:
        """Whether one more row stays within the caps. The KV slots of a padded batch are its rows
        times its longest row, so that product is what max_batch_tokens bounds; a request alone
        is always admitted (it was checked against the context length when accepted)."""
        rows = self._admitting + [row for batch in self._batches.values() for row in batch.rows]
        if not rows:
            return True
        if len(rows) >= self.settings.max_batch_size:
            return False
        longest = max([sequence.reserved_tokens] + [row.reserved_tokens for row in rows])
        return (len(rows) + 1) * longest <= self.settings.max_batch_tokens

    def _admit(self) -> None:
        """Prefills waiting sequences, first come first served, while they fit (newcomers on the
        same weights together, up to PREFILL_TOKENS); then adds the ones that go on to their batches."""
        self._forget_old_prefixes()
        while True:
            with self._wake:
                if not self._waiting or not self._fits(self._waiting[0]):
                    break
                self._admitting.append(self._waiting.popleft())  # counted against the caps and in flight from now on
        prefilled: list[tuple[Sequence, BatchCache]] = []
        for group in _prefill_groups(self._admitting):
            for sequence, cache in zip(group, self._prefill(group)):
                if cache is not None and not sequence.finished:
                    prefilled.append((sequence, cache))
                    continue
                self._admitting.remove(sequence)
                if cache is not None:
                    sequence.deliver(sequence.result())
        for sequence, cache in prefilled:
            batch = self._batches.setdefault(id(sequence.loaded), RunningBatch(sequence.loaded))
            batch.rows.append(sequence)
        for batch in self._batches.values():
            newcomers = [cache for sequence, cache in prefilled if sequence.loaded is batch.loaded]
            if newcomers:
                self._join(batch, newcomers)
        self._admitting = []

    def _forget_old_prefixes(self) -> None:
        current = self.current
        if current is not self._cache_owner:
            self.prefix_cache.keep_only(current)
            self._cache_owner = current

    def _prefill(self, group: list[Sequence]) -> list[BatchCache | None]:
        """Computes the group's prompts (after any cached prefixes) in one forward, each distinct
        prompt once, and picks each sequence's first token; returns their one-row caches (one
        prompt's sequences share theirs: joining a batch copies it), or Nones when it failed (the
        requesters got the exception)."""
        self.tuner.reset()  # the decode steps after a prefill are not comparable with those before
        try:
            keys = [tuple(sequence.prompt_ids) for sequence in group]
            slots: dict[tuple[int, ...], int] = {}
            for key in keys:
                slots.setdefault(key, len(slots))
            distinct = [group[keys.index(key)] for key in slots]
            reserves = [0] * len(slots)
            for key, sequence in zip(keys, group):
                reserves[slots[key]] = max(reserves[slots[key]], sequence.params.max_tokens)
            prefixes = [self.prefix_cache.lookup(sequence.loaded, sequence.prompt_ids) for sequence in distinct]
            computed = runner.prefill_together(group[0].loaded.model, [s.prompt_ids for s in distinct], prefixes, reserves)
            for sequence, (_, cache) in zip(distinct, computed):
                if sequence.loaded is self._cache_owner:
                    self.prefix_cache.store(sequence.loaded, sequence.prompt_ids, cache.row(0))
            for key, sequence in zip(keys, group):
                prefix, (logits, _) = prefixes[slots[key]], computed[slots[key]]
                sequence.cached_tokens = prefix[0][0].shape[-2] if prefix else 0
                sequence.take(logits)
        except Exception as exc:  # handed to the requesters, which report it; the others go on
            log.exception("prefill failed")
            for sequence in group:
                sequence.deliver(exc)
            return [None] * len(group)
        return [computed[slots[key]][1] for key in keys]

    def _join(self, batch: RunningBatch, newcomers: list[BatchCache]) -> None:
        """Rebuilds the batch's cache with the newcomers' rows after its own (one copy for all)."""
        old = [batch.cache.row(i) for i in range(batch.cache.rows)] if batch.cache else []
        batch.cache = BatchCache.of_rows(old + [cache.row(0) for cache in newcomers])

    def _decode(self, batch: RunningBatch) -> None:
        """One step: every row's last token in, every row's next token out; or a lone greedy
        row's last token and a draft in, and its next tokens out as far as they agree with it."""
        draft = self._draft(batch)
        tokens = [batch.rows[0].sampled[-1], *draft] if draft else [row.sampled[-1] for row in batch.rows]
        forward = runner.verify if draft else runner.decode
        try:
            logits = self.tuner.run(len(tokens), lambda: forward(batch.loaded.model, batch.cache, tokens))
        except Exception as exc:
            log.exception("decode step failed")
            for row in batch.rows:
                row.deliver(exc)
            batch.rows, batch.cache = [], None
            return
        self.stats.steps += 1
        self.stats.largest_batch = max(self.stats.largest_batch, len(batch.rows))
        if draft:
            self._take_agreeing(batch, draft, logits)
        else:
            for row, row_logits in zip(batch.rows, logits):
                row.take(row_logits)
        done = [row for row in batch.rows if row.finished]
        for row in done:
            self._remember(batch, row)
        if done:
            self._retire(batch, done)  # before delivering: a requester that has its result no longer counts
        for row in done:
            row.deliver(row.result())

    def _draft(self, batch: RunningBatch) -> list[int]:
        """Tokens to check along with a lone greedy row's next one; [] for any other batch.
        Several rows are decoded together already, and a sampled row would need the draft's
        probabilities to stay exact."""
        row = batch.rows[0]
        if len(batch.rows) > 1 or row.params.temperature > 0:
            return []
        room = row.params.max_tokens - len(row.output.tokens) - 1  # the step adds a token of its own
        wanted = min(self.settings.speculative_tokens, room)
        return speculation.propose(row.prompt_ids + row.sampled, wanted) if wanted > 0 else []

    def _take_agreeing(self, batch: RunningBatch, draft: list[int], logits: torch.Tensor) -> None:
        """The row takes its pick after its last token, and after each draft token for as long
        as its picks are the draft's; the keys and values past the first disagreement go."""
        row, taken = batch.rows[0], 0
        for guess, position_logits in zip([*draft, None], logits):
            row.take(position_logits)
            taken += 1
            if row.finished or row.sampled[-1] != guess:
                break
        batch.cache.drop(len(draft) + 1 - taken)
        self.stats.drafted += len(draft)
        self.stats.accepted += taken - 1

    def _remember(self, batch: RunningBatch, row: Sequence) -> None:
        """Offers a finished row's KV (prompt and output so far) to the prefix cache."""
        if row.loaded is not self._cache_owner or not self.prefix_cache.max_bytes:
            return
        kv = batch.cache.row(batch.rows.index(row))
        tokens = (row.prompt_ids + row.sampled)[: kv[0][0].shape[-2]]
        self.prefix_cache.store(row.loaded, tokens, kv)

    def _retire(self, batch: RunningBatch, leaving: list[Sequence]) -> None:
        keep = [i for i, row in enumerate(batch.rows) if row not in leaving]
        batch.cache = BatchCache.of_rows([batch.cache.row(i) for i in keep]) if keep else None
        batch.rows = [batch.rows[i] for i in keep]
