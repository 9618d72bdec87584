"""One decode step of a Llama-family model (SmolLM2, the tiny test model), written out by hand.

transformers' forward is general; a decode step of a small model on a CPU pays for that. This
one runs five parallel kernels a layer instead of eight (q, k and v are one matmul, gate and up
another; attention is one SDPA call with grouped heads) and about a third of the torch calls.
Each parallel kernel wakes the idle OpenMP thread, which sleeps between kernels on purpose
(see openmp.py), so kernel count is time.

The weights are relaid once, in place: the fused matrices are copied together, in float32
transposed ([in, out], contiguous), where a matmul with a few rows reads them 1.5x faster.
transformers' modules are pointed at views of the same storage, so prefill (transformers' model
body, then this step's head) and this step share one copy.
The rest (norms, an untied embedding) is copied too: from_pretrained maps the checkpoint file,
and the mapping, resident once read, is released only when no weight lives in it any more.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from gearshift.services.policy_server.batch_cache import BatchCache


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


def _stacked(*linears: torch.nn.Linear) -> torch.Tensor:
    """The linears' weights stacked as one [in, sum of outs] matrix (x @ it applies them all);
    each linear now holds a view of its own part (the same values, no second copy). float32 is
    stored that way round, contiguous: MKL's matmul with a few rows reads it 1.5x faster. Other
    dtypes keep the [out, in] rows of the checkpoint, which oneDNN's bfloat16 matmul reads faster."""
    rows = torch.cat([linear.weight.detach() for linear in linears])
    stacked = rows.t().contiguous() if rows.dtype == torch.float32 else rows.t()
    start = 0
    for linear in linears:
        end = start + linear.out_features
        linear.weight = torch.nn.Parameter(stacked[:, start:end].t(), requires_grad=False)
        start = end
    return stacked


def _copied(module: torch.nn.Module) -> torch.Tensor:
    """The module's weight, moved to memory of its own."""
    module.weight = torch.nn.Parameter(module.weight.detach().clone(), requires_grad=False)
    return module.weight


@dataclass
class _Layer:
    input_norm: torch.Tensor
    qkv: torch.Tensor  # [hidden, (heads + 2 kv_heads) x head_dim]
    out: torch.Tensor  # [heads x head_dim, hidden]
    post_norm: torch.Tensor
    gate_up: torch.Tensor  # [hidden, 2 x intermediate]
    down: torch.Tensor  # [intermediate, hidden]


class LlamaDecoder:
    """The decode step of one loaded model (built once per model: it relays its weights)."""

    def __init__(self, model: torch.nn.Module):
        config = model.config
        self.heads, self.kv_heads = config.num_attention_heads, config.num_key_value_heads
        self.head_dim = getattr(config, "head_dim", None) or config.hidden_size // self.heads
        self.hidden, self.intermediate, self.eps = config.hidden_size, config.intermediate_size, config.rms_norm_eps
        self.rotary = model.model.rotary_emb
        self.embed = model.model.embed_tokens
        self.final_norm = _copied(model.model.norm)
        self.layers = [
            _Layer(
                _copied(layer.input_layernorm),
                _stacked(layer.self_attn.q_proj, layer.self_attn.k_proj, layer.self_attn.v_proj),
                _stacked(layer.self_attn.o_proj),
                _copied(layer.post_attention_layernorm),
                _stacked(layer.mlp.gate_proj, layer.mlp.up_proj),
                _stacked(layer.mlp.down_proj),
            )
            for layer in model.model.layers
        ]
        tied = model.lm_head.weight is model.model.embed_tokens.weight
        self.lm_head = _stacked(model.lm_head)
        if tied:  # lookups read the embedding's rows from the same storage (strided, in float32)
            model.model.embed_tokens.weight = model.lm_head.weight
        else:
            _copied(model.model.embed_tokens)

    def _norm(self, x: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
        """transformers' LlamaRMSNorm: normalised in float32, scaled in the model's dtype."""
        return weight * F.rms_norm(x.float(), (self.hidden,), eps=self.eps).to(x.dtype)

    def decode(self, cache: BatchCache, tokens: list[int]) -> torch.Tensor:
        """Feeds each row of the cache its next token; returns logits [rows, vocab]."""
        rows, heads, kv_heads, head_dim = len(tokens), self.heads, self.kv_heads, self.head_dim
        cache.reserve(1)
        column, mask = cache.width, cache.decode_mask()
        x = self.embed(torch.tensor(tokens))
        cos, sin = (part.view(rows, 1, head_dim) for part in self.rotary(x, cache.positions()))
        half, rotated = head_dim // 2, (heads + kv_heads) * head_dim
        for layer, (keys, values) in zip(self.layers, cache.buffers):
            qkv = self._norm(x, layer.input_norm) @ layer.qkv
            qk = qkv[:, :rotated].view(rows, heads + kv_heads, head_dim)  # RoPE once for q and k
            qk = qk * cos + torch.cat((-qk[..., half:], qk[..., :half]), -1) * sin
            keys[:, :, column] = qk[:, heads:]
            values[:, :, column] = qkv[:, rotated:].view(rows, kv_heads, head_dim)
            attention = F.scaled_dot_product_attention(
                qk[:, :heads, None], keys[:, :, : column + 1], values[:, :, : column + 1], attn_mask=mask, enable_gqa=True
            )
            x = x + attention.reshape(rows, heads * head_dim) @ layer.out
            gate, up = (self._norm(x, layer.post_norm) @ layer.gate_up).split(self.intermediate, -1)
            x = x + (F.silu(gate) * up) @ layer.down
        cache.advance(1)
        return self.head(self._norm(x, self.final_norm))

    def head(self, hidden: torch.Tensor) -> torch.Tensor:
        """Logits [rows, vocab] of normalised hidden states [rows, hidden]."""
        return hidden @ self.lm_head
