"""The forward of a Llama-family model (SmolLM2, the tiny test model), written out by hand: the
decode step and prefill of the policy server.

transformers' forward is general; a decode step of a small model on a CPU pays for that. This
one runs five parallel kernels a layer instead of eight (q, k and v are one matmul, gate and up
another; attention is one SDPA call with grouped heads) and about a third of the torch calls.
Each parallel kernel wakes the idle OpenMP thread, which sleeps between kernels on purpose
(see openmp.py), so kernel count is time.

The weights move into the step once, fused, in the layouts their matmuls read fastest (see
_Matmul). transformers' linears are emptied and the rest (norms, embedding) copied:
from_pretrained maps the checkpoint file, and the mapping is released only when no weight lives
in it any more. A prepared model therefore runs through this class only.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from gearshift.services.policy_server.batch_cache import BatchCache
from gearshift.services.policy_server.openmp import spinning

_SPINNING = spinning()  # libgomp read its wait policy when torch loaded, before this import


def supports(model: torch.nn.Module) -> bool:
    """Whether the model is the plain Llama this step implements (no biases, SiLU MLP)."""
    config = model.config
    return (
        getattr(config, "model_type", None) == "llama"
        and not config.attention_bias
        and not config.mlp_bias
        and config.hidden_act == "silu"
        and getattr(config, "pretraining_tp", 1) == 1
    )


class _Matmul:
    """Linears applied as one matmul, x @ [W1; W2; ...].T; each linear's weight is emptied.

    float32 keeps two layouts, twice the memory, for speed: oneDNN's packed matrix for several
    rows (a batch; 1.6-2x faster than MKL reads a plain one) and for one row when OpenMP threads
    spin (1.06-1.09x); MKL's transposed [in, out] for one row otherwise (with a sleeping or no
    partner thread, oneDNN is about 1.25x slower than MKL's gemv). bfloat16 (whose packing needs
    AVX-512 or AVX-NE-CONVERT) keeps the checkpoint's [out, in] rows, which oneDNN reads directly."""

    def __init__(self, *linears: torch.nn.Linear):
        rows = torch.cat([linear.weight.detach() for linear in linears])
        for linear in linears:
            linear.weight = None
        if rows.dtype == torch.float32 and torch.backends.mkldnn.is_available():
            self.rows, self.columns = None, rows.t().contiguous()
            self.packed = torch.ops.mkldnn._reorder_linear_weight(rows, None)
        else:
            self.rows, self.columns, self.packed = rows, None, None

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        if self.packed is None:
            return x @ self.rows.t()
        flat = x.reshape(-1, x.shape[-1])
        if len(flat) == 1 and not _parallel_spinning():
            return (flat @ self.columns).view(*x.shape[:-1], -1)
        return torch.ops.mkldnn._linear_pointwise(flat, self.packed, None, "none", [], "").view(*x.shape[:-1], -1)


def _parallel_spinning() -> bool:
    """Whether this thread's kernels run on several OpenMP threads that spin between kernels."""
    return _SPINNING and torch.get_num_threads() > 1


# The CPU flash kernel itself: unlike F.scaled_dot_product_attention it also returns each query's
# log-sum-exp, which lets attention over two spans of keys be computed apart and merged.
_flash = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu


def _after_prefix(q: torch.Tensor, keys: torch.Tensor, values: torch.Tensor, start: int) -> torch.Tensor:
    """Attention of new tokens that see the `start` cached columns whole and one another causally
    (a prefill after a prefix-cache hit). One SDPA call would need a mask, with which the kernel
    computes every block and converts the mask in every layer; apart, the cached columns need no
    mask and the new ones take the causal kernel, merged by their log-sum-exps. For 550 tokens
    after 1,200 on SmolLM2, attention took 0.93x the time of the masked call."""
    seen, seen_lse = _flash(q, keys[:, :, :start], values[:, :, :start], 0.0, False)[:2]
    own, own_lse = _flash(q, keys[:, :, start:], values[:, :, start:], 0.0, True)[:2]
    total = torch.logaddexp(seen_lse, own_lse)
    return (seen * (seen_lse - total).exp()[..., None] + own * (own_lse - total).exp()[..., None]).to(q.dtype)


def _copied(module: torch.nn.Module) -> torch.Tensor:
    """The module's weight, moved to memory of its own."""
    module.weight = torch.nn.Parameter(module.weight.detach().clone(), requires_grad=False)
    return module.weight


@dataclass
class _Layer:
    input_norm: torch.Tensor
    qkv: _Matmul  # hidden -> (heads + 2 kv_heads) x head_dim
    out: _Matmul  # heads x head_dim -> hidden
    post_norm: torch.Tensor
    gate_up: _Matmul  # hidden -> 2 x intermediate
    down: _Matmul  # intermediate -> hidden


class LlamaDecoder:
    """The forward of one loaded model (built once per model: it takes over its weights)."""

    def __init__(self, model: torch.nn.Module):
        config = model.config
        self.heads, self.kv_heads = config.num_attention_heads, config.num_key_value_heads
        self.head_dim = getattr(config, "head_dim", None) or config.hidden_size // self.heads
        self.hidden, self.intermediate, self.eps = config.hidden_size, config.intermediate_size, config.rms_norm_eps
        self.rotary = model.model.rotary_emb
        self.final_norm = _copied(model.model.norm)
        self.layers = [
            _Layer(
                _copied(layer.input_layernorm),
                _Matmul(layer.self_attn.q_proj, layer.self_attn.k_proj, layer.self_attn.v_proj),
                _Matmul(layer.self_attn.o_proj),
                _copied(layer.post_attention_layernorm),
                _Matmul(layer.mlp.gate_proj, layer.mlp.up_proj),
                _Matmul(layer.mlp.down_proj),
            )
            for layer in model.model.layers
        ]
        tied = model.lm_head.weight is model.model.embed_tokens.weight
        self.head = _Matmul(model.lm_head)
        if tied:  # lookups read the head's own matrix, strided where it is stored [in, out]
            self.embedding = self.head.rows if self.head.rows is not None else self.head.columns.t()
            model.model.embed_tokens.weight = None
        else:
            self.embedding = _copied(model.model.embed_tokens)

    def _norm(self, x: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
        """transformers' LlamaRMSNorm: normalised in float32, scaled in the model's dtype."""
        return weight * F.rms_norm(x.float(), (self.hidden,), eps=self.eps).to(x.dtype)

    def forward(
        self, cache: BatchCache, input_ids: torch.Tensor, positions: torch.Tensor, mask: torch.Tensor | None, keep: int = 1
    ) -> torch.Tensor:
        """Feeds each row its tokens [rows, new] after the cache's columns, at their positions
        [rows, new]; mask [rows, 1, new, width + new] says which columns a token sees (None:
        every column before it, in a cache that was empty). Returns the logits of the last
        `keep` new positions [rows, keep, vocab]."""
        (rows, new), heads, kv_heads, head_dim = input_ids.shape, self.heads, self.kv_heads, self.head_dim
        cache.reserve(new)
        start, end = cache.width, cache.width + new
        x = F.embedding(input_ids, self.embedding)
        cos, sin = (part[:, :, None] for part in self.rotary(x, positions))  # [rows, new, 1, head_dim]
        half, rotated = head_dim // 2, (heads + kv_heads) * head_dim
        causal = mask is None and new > 1  # SDPA's causal kernel: 2x faster than the same mask given
        prefixed = causal and start > 0  # the causal part starts after cached columns
        for layer, (keys, values) in zip(self.layers, cache.buffers):
            qkv = layer.qkv(self._norm(x, layer.input_norm))
            qk = qkv[..., :rotated].view(rows, new, heads + kv_heads, head_dim)  # RoPE once for q and k
            qk = (qk * cos + torch.cat((-qk[..., half:], qk[..., :half]), -1) * sin).transpose(1, 2)
            keys[:, :, start:end] = qk[:, heads:]
            values[:, :, start:end] = qkv[..., rotated:].view(rows, new, kv_heads, head_dim).transpose(1, 2)
            if prefixed:
                attention = _after_prefix(qk[:, :heads], keys[:, :, :end], values[:, :, :end], start)
            else:
                attention = F.scaled_dot_product_attention(
                    qk[:, :heads], keys[:, :, :end], values[:, :, :end], attn_mask=mask, is_causal=causal, enable_gqa=True
                )
            x = x + layer.out(attention.transpose(1, 2).reshape(rows, new, heads * head_dim))
            gate, up = layer.gate_up(self._norm(x, layer.post_norm)).split(self.intermediate, -1)
            x = x + layer.down(F.silu(gate) * up)
        cache.advance(new)
        return self.head(self._norm(x[:, -keep:], self.final_norm))
