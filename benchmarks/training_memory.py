"""Device memory one rank needs under this code, computed from a model's shape (not measured:
benchmarks/training_speed.py measures what SmolLM2 takes on this CPU, and --check sets this
computation beside that measurement).

Per rank, with N ranks under FSDP2 (parameters, gradients and AdamW's two moments sharded N ways;
float32 master weights, gradients and moments, bf16 compute; gearshift.training.distributed):
- state: trainable parameters x (4 weight + 4 gradient + 8 moments) bytes / N, plus frozen weights
  (LoRA's base) in their dtype / N;
- gathered: the layers FSDP holds whole at once (the one computing and the one prefetched) in bf16,
  and the largest embedding group (the embeddings or the head, one group when tied) in bf16 with
  its float32 gradient under a full fine-tune;
- activations of one micro-batch (runtime.micro_batch_tokens): per token and layer, the bf16
  tensors a Llama layer keeps for its backward, 2 (8h + 3kv + 4i) bytes; under activation
  checkpointing the layer inputs (2h) and one layer's recompute;
- logits: the head runs on target tokens only, runtime.loss_chunk_tokens (1,024) at a time; bf16
  logits, their float32 upcast and its gradient, 10 bytes per chunk token and vocabulary entry.

benchmarks/load_memory.py adds what a rank holds at load and sets this beside larger shapes.

    .venv/bin/python benchmarks/training_memory.py            # 7B full and LoRA, 1 and 8 GPUs
    .venv/bin/python benchmarks/training_memory.py --check    # SmolLM2 here, set beside the measured peak
"""

from __future__ import annotations

import argparse
import json
from dataclasses import dataclass

GIB = 2**30


@dataclass(frozen=True)
class Shape:
    name: str
    vocab: int
    hidden: int
    layers: int
    intermediate: int
    kv: int  # key/value width (hidden / heads * kv heads)
    tied: bool

    @property
    def layer_parameters(self) -> int:
        return 2 * self.hidden * self.hidden + 2 * self.hidden * self.kv + 3 * self.hidden * self.intermediate

    @property
    def embedding_parameters(self) -> int:
        return self.vocab * self.hidden

    @property
    def parameters(self) -> int:
        return self.layers * self.layer_parameters + self.embedding_parameters * (1 if self.tied else 2)


LLAMA2_7B = Shape("Llama-2-7B", 32000, 4096, 32, 11008, 4096, tied=False)
QWEN25_7B = Shape("Qwen2.5-7B", 152064, 3584, 28, 18944, 512, tied=False)
QWEN25_32B = Shape("Qwen2.5-32B", 152064, 5120, 64, 27648, 1024, tied=False)
LLAMA3_70B = Shape("Llama-3-70B", 128256, 8192, 80, 28672, 1024, tied=False)
SMOLLM2 = Shape("SmolLM2-135M", 49152, 576, 30, 1536, 192, tied=True)


def lora_parameters(shape: Shape, rank: int) -> int:
    """LoRA on q, k, v, o, gate, up and down: r (in + out) per matrix."""
    h, kv, i = shape.hidden, shape.kv, shape.intermediate
    per_layer = rank * ((h + h) + (h + kv) * 2 + (h + h) + (h + i) * 3)
    return shape.layers * per_layer


def per_rank(shape: Shape, ranks: int, micro_batch_tokens: int, target_share: float, lora_rank: int = 0,
             checkpointing: bool = False, compute_bytes: int = 2, loss_chunk_tokens: int = 1024) -> dict[str, float]:
    """Bytes one rank holds at its peak, by part, the state sharded `ranks` ways."""
    trainable = lora_parameters(shape, lora_rank) if lora_rank else shape.parameters
    frozen = shape.parameters if lora_rank else 0
    state = trainable * 16 / ranks + frozen * compute_bytes / ranks
    gathered = 0.0
    if ranks > 1:
        gathered = 2 * shape.layer_parameters * compute_bytes + shape.embedding_parameters * (compute_bytes + (0 if lora_rank else 4))
    h, kv, i = shape.hidden, shape.kv, shape.intermediate
    per_token_layer = compute_bytes * (8 * h + 3 * kv + 4 * i)
    if checkpointing:
        activations = micro_batch_tokens * (shape.layers * compute_bytes * h + per_token_layer)
    else:
        activations = micro_batch_tokens * shape.layers * per_token_layer
    targets = micro_batch_tokens * target_share
    logits = min(targets, loss_chunk_tokens or targets) * shape.vocab * 10
    parts = {"state": state, "gathered": gathered, "activations": activations, "logits": logits}
    return parts | {"total": sum(parts.values())}


def table() -> list[dict]:
    rows = []
    for shape in (LLAMA2_7B, QWEN25_7B):
        for lora_rank in (0, 16):
            for ranks in (1, 8):
                for checkpointing in (False, True):
                    parts = per_rank(shape, ranks, 8192, 0.75, lora_rank, checkpointing)
                    rows.append({"model": shape.name, "params_b": round(shape.parameters / 1e9, 2), "lora_rank": lora_rank,
                                 "gpus": ranks, "checkpointing": checkpointing,
                                 **{key: round(value / GIB, 1) for key, value in parts.items()}})
    return rows


def check() -> dict:
    """SmolLM2 in float32 on this CPU (training_speed.py's batch: 4 rows of ~133 tokens, 3/4 targets),
    one process against 2 FSDP2 ranks; this machine adds the interpreter and its libraries (~0.4 GiB)."""
    tokens = 529
    one = per_rank(SMOLLM2, 1, tokens, 0.75, compute_bytes=4)
    two = per_rank(SMOLLM2, 2, tokens // 2, 0.75, compute_bytes=4)
    return {"one_rank_gib": round(one["total"] / GIB, 2), "two_ranks_gib": round(two["total"] / GIB, 2),
            "ratio": round(two["total"] / one["total"], 2), "parts_one": {k: round(v / GIB, 2) for k, v in one.items()},
            "parts_two": {k: round(v / GIB, 2) for k, v in two.items()}}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--check", action="store_true", help="SmolLM2 on this CPU, to set beside training_speed.py's peak")
    args = parser.parse_args()
    print(json.dumps(check() if args.check else table(), indent=1))


if __name__ == "__main__":
    main()
