"""Under torchrun: each model loaded sharded over the ranks (FSDP2, gloo), exported with
save_weights into OUT/export-K (wrapped as a run wraps it: TargetForward), then streamed (weight_stream.to_receivers) to a receiver process
in a gloo group of its own at ADDRESS, in buckets of BUCKET_BYTES; each rank writes what it saw of
every stream (weight_stream.Streamed) to OUT/rank-R.json.

    torchrun --nproc-per-node 2 tests/libs/training/weight_stream_worker.py ADDRESS BUCKET_BYTES OUT MODEL:DTYPE...

or as `main` on ranks forked by tests/rank_processes.run_ranks (the test's way).
"""

from __future__ import annotations

import asyncio
import json
import sys
from pathlib import Path

import torch
from gearshift.training import checkpoints, distributed, forward, weight_stream
from gearshift.training.config import ModelConfig, RuntimeConfig


def main(address: str, bucket_bytes: str, out: str, *cases: str) -> None:
    out = Path(out)
    runtime = RuntimeConfig(device="cpu")
    ranks = distributed.start(runtime)
    group = weight_stream.GlooGroup(address, 0, 2) if ranks.main else None  # the sender and one receiver
    seen = []
    for index, case in enumerate(cases):
        model, dtype = case.rsplit(":", 1)
        dtype = getattr(torch, dtype)
        policy = checkpoints.load_policy(ModelConfig(base=model), Path(model).parent, ranks=ranks, runtime=runtime, wrap=forward.TargetForward)
        assert distributed.is_sharded(policy.module)  # the shards are what the stream starts from
        checkpoints.save_weights(policy, out / f"export-{index}", ranks, dtype)
        tensors = checkpoints.export_tensors(policy, dtype)
        seen.append(asyncio.run(weight_stream.to_receivers(tensors, int(bucket_bytes), group)).as_dict())
    (out / f"rank-{ranks.rank}.json").write_text(json.dumps(seen))


if __name__ == "__main__":
    main(*sys.argv[1:])
