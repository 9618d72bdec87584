"""Model forward passes that compute only what the loss needs.

The language-model head (hidden x vocabulary) is a large share of a small model's compute;
prompts and masked pieces need no logits, so the head runs on the target positions alone. And
every row of a batch starts with the same system prompt (two thirds of a short episode's
tokens): the decoder runs it once and the rows continue from its KV cache, broadcast over the
batch, in two halves by length, each padded only to its own longest row. That is the same
computation, gradients included (they flow back through the shared cache), done once instead of
once per row and without most of the padding. A packed batch (batching.pack: the examples end
to end in one row, the shared prefix once) is one decoder call instead, under activation
checkpointing too, with varlen attention: each example attends to itself (and the prefix) alone,
by flash attention's cu_seqlens on GPUs or block_attention's per-example blocks on sdpa, and no
[tokens, tokens] mask is ever built.

And the head never makes the [tokens, vocabulary] logits whole: Head computes the per-token
values a loss needs (log-probabilities, entropy, KL to a teacher) a chunk of tokens at a time.

TargetForward makes this forward the forward of one module, so that a DDP or FSDP wrapper around
it runs its hooks (gradient reduction, parameter gathering) around the whole computation."""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.utils.checkpoint

from transformers import AttentionInterface
from transformers.integrations.sdpa_attention import sdpa_attention_forward
from transformers.masking_utils import AttentionMaskInterface, sdpa_mask

from gearshift.training import losses
from gearshift.training.balancing import RouterLoad, routers
from gearshift.training.context_parallel import Context
from gearshift.training.tokenization import PREFIX, Batch


@dataclass
class Targets:
    """What a forward gives for the target tokens of a batch, flattened over it (rows ascending):
    per-token values the head computed chunk by chunk, never the [tokens, vocabulary] logits."""

    tokens: torch.Tensor  # [N] the target tokens
    rows: torch.Tensor  # [N] which batch row each came from
    columns: torch.Tensor  # [N] the target token's position in its row
    logprobs: torch.Tensor | None = None  # [N] log p(token) (with teachers: without gradient, NaN where none)
    entropy: torch.Tensor | None = None  # [N] of each predicted distribution (no gradient), when asked for
    kl: torch.Tensor | None = None  # [N] KL(model || teacher), where teachers were given (0 elsewhere)
    hidden: torch.Tensor | None = None  # [N, H] the last hidden states, when asked for (a teacher's)
    router_loss: torch.Tensor | None = None  # an MoE's balancing loss summed over the batch's sequences (balancing.py), with gradients
    expert_tokens: torch.Tensor | None = None  # [layers, experts] the top-k assignments each expert took
    # Under context parallelism: which of the batch's targets (in target_positions' order) these
    # are, this rank's slice of them; None: all of them.
    kept: torch.Tensor | None = None

    def local(self, values: torch.Tensor) -> torch.Tensor:
        """Per-target values of the whole batch ([all its targets]), those of the targets here."""
        return values if self.kept is None else values[self.kept.to(values.device)]

    def per_row(self, values: torch.Tensor, rows: int) -> list[torch.Tensor]:
        """Per-target values ([N], in this order: rows ascending) split into one tensor per row."""
        return list(values.split(torch.bincount(self.rows, minlength=rows).tolist()))


@dataclass
class Teacher:
    """A teacher's view of some of the batch's target tokens, enough to recompute its logits chunk
    by chunk: its last hidden states there and its whole head weight."""

    positions: torch.Tensor  # [n] indices into the batch's N targets
    hidden: torch.Tensor  # [n, H_teacher]
    weight: torch.Tensor  # [V, H_teacher]


class Head(torch.nn.Linear):
    """The language-model head (a transformers model's output embedding, its class swapped, as
    FSDP2 swaps it again): called with hidden states alone it gives logits as before (generation);
    called with target tokens it gives per-token log-probabilities and entropy (or, given teachers,
    the KL to them), chunk_tokens rows at a time, each chunk's logits recomputed in the backward
    (torch.utils.checkpoint), so [tokens, vocabulary] logits never exist whole, in float32 or
    otherwise. Its own forward, so FSDP gathers its weight once for the forward and once for the
    backward whatever the number of chunks."""

    chunk_tokens: int = 1024  # 0: one chunk

    def forward(self, hidden: torch.Tensor, tokens: torch.Tensor | None = None, entropy: bool = False,
                teachers: tuple[Teacher, ...] = (), top_k: int | None = None):
        if tokens is None:
            return super().forward(hidden)
        chunk = self.chunk_tokens or max(1, len(tokens))
        if teachers:  # the KL, and the tokens' log-probabilities without gradient (NaN where no teacher)
            kl = hidden.new_zeros(len(tokens), dtype=torch.float32)
            logprobs = torch.full_like(kl, torch.nan)
            for teacher in teachers:  # each at least once, as below, however few of its targets are here
                for start in range(0, max(len(teacher.positions), 1), chunk):
                    at = teacher.positions[start:start + chunk]
                    part, logp = _checkpointed(self._reverse_kl, hidden[at], tokens[at], teacher.hidden[start:start + chunk], teacher.weight, top_k)
                    kl, logprobs = kl.index_put((at,), part), logprobs.index_put((at,), logp)
            return logprobs, None, kl
        # At least one chunk, empty or not: the loss of a rank with no targets (a context slice of
        # prompt alone) still reaches the weights, so its backward makes the collectives the others do.
        pieces = [_checkpointed(self._logprobs, hidden[start:start + chunk], tokens[start:start + chunk], entropy)
                  for start in range(0, max(len(tokens), 1), chunk)]
        return torch.cat([logp for logp, _ in pieces]), torch.cat([ent for _, ent in pieces]) if entropy else None, None

    def _logprobs(self, hidden: torch.Tensor, tokens: torch.Tensor, entropy: bool) -> tuple[torch.Tensor, torch.Tensor | None]:
        logits = super().forward(hidden)
        return losses.token_logprobs(logits, tokens), losses.entropy(logits).detach() if entropy else None

    def _reverse_kl(self, hidden: torch.Tensor, tokens: torch.Tensor, teacher_hidden: torch.Tensor, teacher_weight: torch.Tensor,
                    top_k: int | None) -> tuple[torch.Tensor, torch.Tensor]:
        logits = super().forward(hidden)
        with torch.no_grad():
            teacher_logits = torch.nn.functional.linear(teacher_hidden.to(teacher_weight.dtype), teacher_weight)
            logprobs = losses.token_logprobs(logits, tokens)
        return losses.reverse_kl(logits, teacher_logits, top_k), logprobs


def _checkpointed(function, *args):
    """function(*args), its intermediate tensors (a chunk's logits) dropped and recomputed in the
    backward when a gradient will flow."""
    if torch.is_grad_enabled() and args[0].requires_grad:
        return torch.utils.checkpoint.checkpoint(function, *args, use_reentrant=False)
    return function(*args)


def chunked_head(model: torch.nn.Module, chunk_tokens: int) -> Head:
    """model's output embedding as a Head (in place: same parameters, same names)."""
    head = model.get_output_embeddings()
    if type(head) not in (torch.nn.Linear, Head):
        raise ValueError(f"the output embedding is a {type(head).__name__}, not a plain linear layer: it cannot be chunked")
    head.__class__ = Head
    head.chunk_tokens = chunk_tokens
    return head


def whole_weight(head: torch.nn.Module) -> torch.Tensor:
    """A head's weight, whole, without gradient: gathered from its shards under FSDP (a collective:
    every rank calls it), else the parameter itself."""
    weight = head.weight.detach()
    return weight.full_tensor() if hasattr(weight, "full_tensor") else weight


def _predicting(batch: Batch) -> torch.Tensor:
    """[B, T] mask of positions whose next token is a target (of the same sequence, where packed)."""
    mask = torch.zeros_like(batch.target_mask)
    mask[:, :-1] = batch.target_mask[:, 1:]
    if batch.packed:
        mask[:, :-1] &= (batch.sequence_ids[:, 1:] == batch.sequence_ids[:, :-1]) & (batch.sequence_ids[:, :-1] >= 0)
    return mask


# Decoding the prefix apart costs a second pass of every weight's gradient (measured on SmolLM2
# with 2 threads: about as much as 70 tokens' compute); below this many tokens saved, it loses.
MIN_TOKENS_SAVED = 128


def shared_prefix(batch: Batch) -> int:
    """How many leading tokens every row shares before any of them predicts a target (0 when
    sharing them saves fewer than MIN_TOKENS_SAVED); at least one token is always left to each row."""
    rows, width = batch.input_ids.shape
    if rows < 2 or width < 2:
        return 0
    same = (batch.input_ids == batch.input_ids[:1]).all(dim=0) & batch.attention_mask.bool().all(dim=0)
    length = int(same.long().cumprod(dim=0).sum())
    predicting = _predicting(batch).any(dim=0).nonzero()
    if len(predicting):
        length = min(length, int(predicting[0]))
    length = min(length, width - 1)
    return length if length * (rows - 1) >= MIN_TOKENS_SAVED else 0


def hidden_states(model: torch.nn.Module, batch: Batch, share_prefix: bool = True, router: RouterLoad | None = None,
                  context: Context | None = None) -> torch.Tensor:
    """[B, T, H] last hidden states. A packed batch in one call (its layout shares any prefix),
    under context parallelism this rank's slice of its tokens alone ([1, T / size, H]); a padded
    one's shared prefix is decoded once where share_prefix allows, except under activation
    checkpointing, whose recomputed layers take no cache. router (an MoE's) gets each call's
    router logits with the sequences its tokens belong to."""
    decoder = model.get_decoder()
    asked = {"output_router_logits": True} if router is not None else {}

    def decode(members: torch.Tensor, **inputs):
        out = decoder(**inputs, **asked)
        if router is not None:
            router.add(out.router_logits, members)
        return out

    if batch.packed:  # one call, whatever the layout (batching.pack)
        ids, positions, inputs = batch.input_ids, batch.position_ids, varlen_inputs(model, batch)
        members = packed_members(batch) if router is not None else None
        if context is not None:  # the slice's tokens; attention exchanges them (block_attention)
            start, end = context.bounds(ids.shape[1])
            ids, positions, inputs["context"] = ids[:, start:end], positions[:, start:end], context
            members = members[start:end] if members is not None else None
        return decode(members, input_ids=ids, position_ids=positions, use_cache=False, **inputs).last_hidden_state
    checkpointing = model.training and getattr(decoder, "gradient_checkpointing", False)  # the flag every transformers sets
    shared = shared_prefix(batch) if share_prefix and not checkpointing else 0
    rows, width = batch.input_ids.shape
    row_members = torch.eye(rows, device=batch.input_ids.device)
    if not shared:
        members = (batch.attention_mask.reshape(-1, 1) * row_members.repeat_interleave(width, dim=0)) if router is not None else None
        return decode(members, input_ids=batch.input_ids, attention_mask=batch.attention_mask).last_hidden_state
    # Embedded once: two lookups would be two backward passes of the embedding, each writing a
    # dense vocabulary-sized gradient (the embedding is tied to the head).
    embeds = model.get_input_embeddings()(batch.input_ids)
    prefix = decode(torch.ones(shared, rows, device=embeds.device), inputs_embeds=embeds[:1, :shared], use_cache=True)  # in every row
    cache = prefix.past_key_values  # each half continues from its keys and values, broadcast over the half's rows
    prefix_kv = [(layer.keys, layer.values) for layer in cache.layers]
    lengths = batch.attention_mask.sum(dim=1).tolist()
    rest = embeds.new_zeros(rows, width - shared, embeds.shape[-1])
    for half in length_halves(lengths):
        end = max(shared + 1, *(lengths[row] for row in half))
        index = torch.tensor(half, device=embeds.device)
        mask = batch.attention_mask[index, :end]
        members = mask[:, shared:].reshape(-1, 1) * row_members[index].repeat_interleave(end - shared, dim=0) if router is not None else None
        half_cache = type(cache)([(keys.expand(len(half), -1, -1, -1), values.expand(len(half), -1, -1, -1)) for keys, values in prefix_kv])
        out = decode(members, inputs_embeds=embeds[index, shared:end], attention_mask=mask, cache=half_cache, use_cache=True)
        rest[index, : end - shared] = out.last_hidden_state  # past a half's longest row: padding, zero, predicting nothing
    return torch.cat([prefix.last_hidden_state.expand(rows, -1, -1), rest], dim=1)


def packed_members(batch: Batch) -> torch.Tensor:
    """[tokens, examples] of a packed batch: each token in its example, a row's shared prefix in
    every example of its row, padding in none."""
    ids = batch.sequence_ids
    own = ids[:, :, None] == torch.arange(int(ids.max()) + 1, device=ids.device)  # [rows, width, examples]
    in_row = own.any(dim=1, keepdim=True)
    return (own | ((ids == PREFIX)[:, :, None] & in_row)).reshape(-1, own.shape[-1])


def length_halves(lengths: list[int]) -> list[list[int]]:
    """The rows (two or more) by length, longest first, in two halves, each decoded padded only to
    its own longest row. Always two, whatever the lengths: FSDP gathers a layer's weights at each
    call of the layer, so every rank must call it as often (Run.micro_batches agrees on the
    prefix). More, smaller halves gained nothing more on the CPU."""
    order = sorted(range(len(lengths)), key=lambda row: -lengths[row])
    return [order[: len(order) // 2], order[len(order) // 2:]]


def target_positions(batch: Batch) -> tuple[torch.Tensor, torch.Tensor]:
    """(rows, columns) of the positions whose next token is a target, rows ascending, each row's
    in order; for a packed batch, the example's row in the micro-batch and its position in the
    example."""
    return _target_coordinates(batch)[2:]


def _target_coordinates(batch: Batch) -> tuple[torch.Tensor, ...]:
    """(rows, columns) of the predicting positions in the batch's tensors, then (rows, columns) as
    target_positions gives them, in the same order."""
    rows, columns = _predicting(batch).nonzero(as_tuple=True)
    if not batch.packed:
        return rows, columns, rows, columns
    examples, positions = batch.sequence_ids[rows, columns], batch.position_ids[rows, columns]
    order = torch.argsort(examples * (int(batch.position_ids.max()) + 1) + positions)
    return rows[order], columns[order], examples[order], positions[order]


BLOCKS = "gearshift_blocks"  # the attention implementation of block_attention
# A mask create_causal_mask hands on as it is: a packed call builds no [tokens, tokens] mask.
NO_MASK = torch.ones(1, 1, 1, 1, dtype=torch.bool)


def varlen_inputs(model: torch.nn.Module, batch: Batch) -> dict:
    """What a packed batch's decoder call takes besides its ids and positions: each sequence's
    bounds in the row (cu_seqlens: the shared prefix, then every example), given to flash
    attention's varlen path, or to block_attention on sdpa. Flash attention's varlen takes one
    row and no prefix shared across sequences: anything else is refused, not run wrong."""
    implementation = model.config._attn_implementation
    if not takes_varlen(implementation):
        raise ValueError(f"a packed batch needs varlen attention: flash attention or {BLOCKS} (TargetForward sets it for sdpa), not {implementation}")
    sequences = batch.sequence_ids
    if sequences.shape[0] != 1:
        raise ValueError(f"a packed batch is one row (batching.pack), not {sequences.shape[0]}: varlen attention takes one")
    starts = torch.ones_like(sequences[0], dtype=torch.bool)
    starts[1:] = sequences[0, 1:] != sequences[0, :-1]
    bounds = torch.cat([starts.nonzero().squeeze(-1), torch.tensor([sequences.shape[1]], device=sequences.device)]).to(torch.int32)
    prefix = int((sequences[0] == PREFIX).sum())
    longest = int((bounds[1:] - bounds[:-1]).max())
    if implementation == BLOCKS:
        return {"attention_mask": NO_MASK, "block_bounds": bounds.tolist(), "prefix_length": prefix}
    if prefix:
        raise ValueError("flash attention's varlen path cannot attend to a prefix shared by the packed sequences: pack with share_prefix off")
    return {"attention_mask": None, "cu_seq_lens_q": bounds, "cu_seq_lens_k": bounds, "max_length_q": longest, "max_length_k": longest}


def takes_varlen(implementation: str) -> bool:
    """Whether an attention implementation runs packed batches (runtime.packing): block_attention,
    or flash attention's varlen path; any other runs padded batches."""
    return implementation == BLOCKS or "flash" in implementation


def block_attention(module: torch.nn.Module, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
                    attention_mask: torch.Tensor | None, dropout: float = 0.0, scaling: float | None = None,
                    block_bounds: list[int] | None = None, prefix_length: int = 0, context: Context | None = None,
                    **kwargs) -> tuple[torch.Tensor, None]:
    """sdpa, block by block on a packed row ([1, heads, tokens, dim]): each sequence between two
    block_bounds attends causally to itself and, after the prefix (prefix_length tokens), to all
    of it; a mask is built per block where a prefix needs one, never [tokens, tokens]. Under
    context parallelism the row is this rank's slice of the pack: the heads are exchanged for the
    whole sequence first, and back after (context_parallel.py). Without block_bounds (a padded
    batch, generation) it is sdpa as transformers runs it."""
    if block_bounds is None:
        return sdpa_attention_forward(module, query, key, value, attention_mask, dropout=dropout, scaling=scaling, **kwargs)
    if context is not None:
        heads = query.shape[1]
        query, key, value = (context.gather_sequence(states) for states in
                             (query, context.with_heads_for(key, heads), context.with_heads_for(value, heads)))
    pieces = []
    for start, end in zip(block_bounds[:-1], block_bounds[1:]):
        keys, values, mask = key[:, :, start:end], value[:, :, start:end], None
        if prefix_length and start >= prefix_length:
            keys = torch.cat([key[:, :, :prefix_length], keys], dim=2)
            values = torch.cat([value[:, :, :prefix_length], values], dim=2)
            mask = torch.ones(end - start, prefix_length + end - start, dtype=torch.bool, device=query.device).tril(prefix_length)
        pieces.append(torch.nn.functional.scaled_dot_product_attention(
            query[:, :, start:end], keys, values, attn_mask=mask, dropout_p=dropout, is_causal=mask is None, scale=scaling, enable_gqa=True))
    out = torch.cat(pieces, dim=2)
    if context is not None:
        out = context.scatter_sequence(out)
    return out.transpose(1, 2).contiguous(), None


AttentionInterface.register(BLOCKS, block_attention)
AttentionMaskInterface.register(BLOCKS, sdpa_mask)  # a padded batch's masks, as sdpa's


def use_block_attention(model: torch.nn.Module) -> None:
    """model's sdpa attention as block_attention: the same outside packed batches, varlen in them."""
    if model.config._attn_implementation == "sdpa":
        model.set_attn_implementation(BLOCKS)


def check_context_parallel(model: torch.nn.Module, runtime) -> None:
    """runtime.context_parallel, refused in one line where the model or the layout cannot take it."""
    size, config = runtime.context_parallel, model.config
    if size == 1:
        return
    heads = config.num_attention_heads // runtime.tensor_parallel  # a rank's, under tensor parallelism
    if heads % size:
        raise ValueError(f"runtime.context_parallel {size} does not divide the {heads} attention heads a rank holds")
    if not runtime.packing:
        raise ValueError("runtime.context_parallel splits packed micro-batches: set runtime.packing true")
    if config._attn_implementation != BLOCKS:
        raise ValueError(f"runtime.context_parallel runs on the sdpa attention (forward.block_attention), not {config._attn_implementation}")


class TargetForward(torch.nn.Module):
    """A causal LM whose forward runs the decoder on the whole batch and the head (a Head) on the
    target positions only: the module DDP and FSDP wrap (their hooks run only around a module's
    own forward, never around calls to its submodules). Returns a tuple: FSDP finds the tensors of
    a tuple; through() reads it as Targets."""

    def __init__(self, model: torch.nn.Module, chunk_tokens: int = Head.chunk_tokens, context: Context | None = None):
        super().__init__()
        self.model = model
        self.context = context  # this rank's context group: packed batches are split over it
        self.routers = routers(model)  # an MoE's: its forward adds what they did (balancing.RouterLoad)
        chunked_head(model, chunk_tokens)
        use_block_attention(model)

    @property
    def head(self) -> Head:
        """The model's own output embedding (a property, not a second registration of it)."""
        return self.model.get_output_embeddings()

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor, target_mask: torch.Tensor, share_prefix: bool = True,
                hidden_only: bool = False, entropy: bool = False, teachers: tuple[Teacher, ...] = (), top_k: int | None = None,
                position_ids: torch.Tensor | None = None, sequence_ids: torch.Tensor | None = None) -> tuple:
        batch, start, kept = context_split(Batch(input_ids, attention_mask, target_mask, position_ids, sequence_ids), self.context)
        at_rows, at_columns, rows, columns = _target_coordinates(batch)
        if kept is not None:  # the targets this rank's slice of the tokens predicts
            at_rows, at_columns, rows, columns = at_rows[kept], at_columns[kept], rows[kept], columns[kept]
        router = None
        if torch.is_grad_enabled() and not hidden_only and self.routers:  # what trains an MoE's routers
            router = RouterLoad(self.model.config.num_experts, self.model.config.num_experts_per_tok, self.context)
        hidden = hidden_states(self.model, batch, share_prefix, router, self.context)[at_rows, at_columns - start]
        tokens = batch.input_ids[at_rows, at_columns + 1]
        if hidden_only:
            return tokens, rows, columns + 1, None, None, None, hidden, None, None, kept
        routed = (router.loss_sum(), router.expert_tokens()) if router is not None else (None, None)
        return tokens, rows, columns + 1, *self.head(hidden, tokens, entropy, teachers, top_k), None, *routed, kept


def context_split(batch: Batch, context: Context | None) -> tuple[Batch, int, torch.Tensor | None]:
    """The batch as a context group splits it: made a multiple of the group's size (padding
    that predicts nothing), this rank's first token, and which of its targets (indices in
    target_positions' order) this rank's slice predicts; without a group, the batch, 0 and None."""
    if context is None:
        return batch, 0, None
    if not batch.packed:
        raise ValueError("context parallelism splits packed batches (batching.pack), not padded rows")
    batch = context.padded(batch)
    start, end = context.bounds(batch.input_ids.shape[1])
    columns = _target_coordinates(batch)[1]
    return batch, start, ((columns >= start) & (columns < end)).nonzero().squeeze(-1)


def through(module: torch.nn.Module, batch: Batch, share_prefix: bool = True, **asked) -> Targets:
    """A TargetForward's Targets (or a DDP or FSDP wrapper's of one); asked: hidden_only, entropy,
    teachers, top_k (TargetForward.forward)."""
    return Targets(*module(batch.input_ids, batch.attention_mask, batch.target_mask, share_prefix, **asked,
                           position_ids=batch.position_ids, sequence_ids=batch.sequence_ids))
