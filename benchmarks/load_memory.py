"""A rank's peak memory loading and training a model under this code (meta-device build, each rank
reading only its shards, the export streamed): measured on this CPU, and computed for large shapes.

Measured: a random Llama of 0.36B parameters (24 layers, hidden 1024, tied, bf16 files), SFT as
users run it (Run.start, one step, the export: tests/jobs/sft_memory_worker.py), 1 rank against 2
under torchrun, LoRA and full fine-tune, the four runs interleaved each round; per rank the peak
resident memory (VmHWM) after loading and over the whole run; medians over the rounds, and the
ratio of 2 ranks' largest rank to 1 rank.

Computed (not measured), per GPU, for Llama-2-7B, Qwen2.5-7B, Qwen2.5-32B and Llama-3-70B on 8,
16 and 64 GPUs (nodes of 8), sharded over the mesh's shard dimension (HSDP across nodes by
default: 8 ways; runtime.mesh_shape [1, N]: N ways): at load, the device holds the rank's shards
(full fine-tune: float32 master weights; LoRA: the base in bf16 and the adapters in float32) and
the host one shard-sized read (the largest tensor's rows, bf16) plus LoRA's initial adapters
(whole, float32), where the code before it held the whole model in float32 on each rank's host
and then on its GPU. Training's peak: benchmarks/training_memory.py (FSDPMemTracker).

    .venv/bin/python benchmarks/load_memory.py --rounds 3      # measured here and computed, as JSON
    .venv/bin/python benchmarks/load_memory.py --computed-only
"""

from __future__ import annotations

import argparse
import json
import os
import pickle
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

from dataclasses import dataclass

ROOT = Path(__file__).parents[1]
WORKER = ROOT / "tests" / "jobs" / "sft_memory_worker.py"
GIB = 2**30
MIB = 2**20


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


def lora_parameters(shape: Shape, rank: int) -> int:
    """LoRA on q, k, v, o, gate, up and down: r (in + out) per matrix."""
    h, kv, i = shape.hidden, shape.kv, shape.intermediate
    per_layer = rank * ((h + h) + (h + kv) * 2 + (h + h) + (h + i) * 3)
    return shape.layers * per_layer


SHAPES = (LLAMA2_7B, QWEN25_7B, QWEN25_32B, LLAMA3_70B)
GPUS_PER_NODE = 8
LORA_RANK = 16


def computed(shape: Shape, gpus: int, lora: bool, shards: int) -> dict:
    """GiB per GPU at load (this code and the code before it), sharded `shards` ways."""
    trainable = lora_parameters(shape, LORA_RANK) if lora else shape.parameters
    frozen = shape.parameters if lora else 0
    largest_tensor = max(shape.embedding_parameters, shape.hidden * shape.intermediate)
    load_device = (frozen * 2 + trainable * 4) / shards if lora else trainable * 4 / shards
    load_host = largest_tensor * 2 / shards + (trainable * 4 if lora else 0)
    before_host = shape.parameters * (2 if lora else 4) + (trainable * 4 if lora else 0)
    return {
        "model": shape.name, "params_b": round(shape.parameters / 1e9, 1), "mode": "lora" if lora else "full", "gpus": gpus,
        "shards": shards, "load_device_gib": round(load_device / GIB, 1), "load_host_gib": round(load_host / GIB, 2),
        "before_load_host_gib": round(before_host / GIB, 1),
    }


def computed_table() -> list[dict]:
    rows = []
    for shape in SHAPES:
        for lora in (False, True):
            for gpus in (8, 16, 64):
                rows.append(computed(shape, gpus, lora, min(gpus, GPUS_PER_NODE)))  # HSDP: a replica per node
                if gpus > GPUS_PER_NODE:
                    rows.append(computed(shape, gpus, lora, gpus))  # runtime.mesh_shape [1, gpus]
    return rows


def random_llama(folder: Path) -> Path:
    import torch
    from gearshift.training.tiny import tiny_checkpoint
    from transformers import AutoTokenizer, LlamaConfig, LlamaForCausalLM

    tokenizer = AutoTokenizer.from_pretrained(tiny_checkpoint(folder / "tiny"))
    config = LlamaConfig(vocab_size=len(tokenizer), hidden_size=1024, intermediate_size=2816, num_hidden_layers=24,
                         num_attention_heads=16, num_key_value_heads=4, max_position_embeddings=1024, tie_word_embeddings=True)
    torch.manual_seed(0)
    path = folder / "random-llama"
    LlamaForCausalLM(config).to(torch.bfloat16).save_pretrained(path)
    tokenizer.save_pretrained(path)
    return path


def run(ranks: int, model: Path, lora: bool, folder: Path, trajectories: Path) -> list[dict]:
    body = {"model": {"base": str(model), "lora": lora}, "optim": {"max_steps": 1, "threads": 1},
            "output": {"dir": str(folder / "out"), "progress": False}, "batch_size": 4}
    folder.mkdir(parents=True)
    (folder / "config.json").write_text(json.dumps(body))
    launcher = [sys.executable] if ranks == 1 else [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc-per-node={ranks}"]
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(ROOT), "GEARSHIFT_DATA_DIR": str(folder / "data")}
    done = subprocess.run([*launcher, str(WORKER), str(folder / "config.json"), str(trajectories), str(folder / "memory")],
                          capture_output=True, text=True, env=env, cwd=ROOT)
    if done.returncode:
        raise RuntimeError(done.stderr[-3000:])
    return [json.loads((folder / "memory" / f"memory-{rank}.json").read_text()) for rank in range(ranks)]


def measured(rounds: int) -> dict:
    sys.path.insert(0, str(ROOT))
    from tests.libs.training.trajectories import routed_instant

    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp)
        model = random_llama(folder)
        trajectories = folder / "trajectories.pkl"
        trajectories.write_bytes(pickle.dumps([routed_instant()]))
        samples: dict[tuple[str, int], list[list[dict]]] = {}
        for index in range(rounds):
            for lora in (False, True):
                for ranks in (1, 2):
                    key = ("lora" if lora else "full", ranks)
                    samples.setdefault(key, []).append(run(ranks, model, lora, folder / f"{key[0]}-{ranks}-{index}", trajectories))
    result = {}
    for mode in ("full", "lora"):
        figures = {}
        for field in ("load_peak_kib", "run_peak_kib"):
            one = statistics.median(max(rank[field] for rank in sample) for sample in samples[mode, 1])
            two = statistics.median(max(rank[field] for rank in sample) for sample in samples[mode, 2])
            name = field.removesuffix("_kib")
            figures[name] = {"one_rank_mib": round(one * 1024 / MIB), "two_ranks_mib": round(two * 1024 / MIB), "ratio": round(two / one, 2)}
        exports = [rank["export_peak_kib"] - rank["before_export_kib"] for sample in samples[mode, 2] for rank in sample]
        figures["export_added_at_2_ranks_mib"] = round(max(exports) * 1024 / MIB)
        result[mode] = figures
    return {"model_params_b": 0.36, "rounds": rounds, **result}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--computed-only", action="store_true")
    args = parser.parse_args()
    report = {"computed": computed_table()}
    if not args.computed_only:
        report["measured_cpu"] = measured(args.rounds)
    print(json.dumps(report, indent=1))


if __name__ == "__main__":
    main()
