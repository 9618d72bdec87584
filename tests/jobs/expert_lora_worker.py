"""LoRA on the tiny MoE's attention and experts, trained a few steps on fixed tokens, under
torchrun or alone (tests/jobs/test_expert_lora.py compares them):

    torchrun --nproc-per-node 2 tests/jobs/expert_lora_worker.py MOE_DIR OUT EXPERT_PARALLEL

or as `main` on ranks forked by tests/rank_processes.run_ranks (the test's way).

Each rank learns the next token of its half of a fixed batch (a mean over equal token counts, so
FSDP's average over the ranks is one process's mean), with SGD; then every rank scores the
whole batch, and the policy is saved as a training job saves it (the adapter, and the merged
checkpoint beside it). Rank 0 writes OUT/run.pt: each step's loss and the final logits."""

import sys
from pathlib import Path

import torch
from gearshift.training import checkpoints, distributed
from gearshift.training.config import ModelConfig, RuntimeConfig

STEPS, ROWS, LENGTH = 3, 4, 12


def main(moe_dir: Path, out: Path, expert_parallel: int) -> None:
    torch.set_num_threads(1)
    runtime = RuntimeConfig(expert_parallel=expert_parallel, device="cpu", precision="fp32")
    ranks = distributed.start(runtime)
    torch.manual_seed(0)  # LoRA's initial A, the same on every rank
    config = ModelConfig(base=str(moe_dir), lora=True, lora_rank=4, lora_target_modules=["q_proj", "v_proj", "gate_proj", "up_proj", "down_proj"])
    policy = checkpoints.load_policy(config, out / "models", ranks=ranks, runtime=runtime)
    tokens = torch.randint(0, 1000, (ROWS, LENGTH), generator=torch.Generator().manual_seed(1))
    mine = tokens.chunk(ranks.world_size)[ranks.rank]
    trainable = [param for param in policy.module.parameters() if param.requires_grad]
    optimizer = torch.optim.SGD(trainable, lr=5.0)  # plain SGD: an update proportional to the gradient (AdamW would hide its scale)
    losses = []
    for _ in range(STEPS):
        logits = policy.module(input_ids=mine).logits[:, :-1]
        loss = torch.nn.functional.cross_entropy(logits.reshape(-1, logits.shape[-1]), mine[:, 1:].reshape(-1))
        loss.backward()
        optimizer.step()
        optimizer.zero_grad()
        losses.append(ranks.sum([loss.item()])[0] / ranks.world_size)
    with torch.no_grad():
        logits = policy.module(input_ids=tokens).logits
    checkpoints.save_weights(policy, out, ranks)
    if ranks.main:
        torch.save({"losses": losses, "logits": logits, "tokens": tokens}, out / "run.pt")


if __name__ == "__main__":
    main(Path(sys.argv[1]), Path(sys.argv[2]), int(sys.argv[3]))
