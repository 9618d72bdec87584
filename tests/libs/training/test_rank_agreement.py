"""Each step of an on-policy job starts with every rank agreeing that every rank has its batch
(on_policy.Rollouts.agreed): a rank whose rollouts failed raises, and so does every other rank,
instead of leaving them waiting in the step's first collective until its timeout. Two real gloo
ranks, as processes."""

from __future__ import annotations

import asyncio
from datetime import timedelta
from types import SimpleNamespace

import pytest

from tests.rank_processes import rank_context


def rank_main(rank: int, store_path: str, failing: set[int], results) -> None:
    import torch.distributed as dist
    from gearshift.training.distributed import Ranks
    from gearshift.training.on_policy import Rollouts

    dist.init_process_group("gloo", store=dist.FileStore(store_path, 2), rank=rank, world_size=2, timeout=timedelta(seconds=60))
    rollouts = Rollouts(run=SimpleNamespace(ranks=Ranks(rank, 2)), remote=object(), copied=False)  # every rank rolls out

    async def get(step: int):
        if rank in failing:
            raise ConnectionError(f"rank {rank}: the executor is unreachable")
        return f"batch of step {step}"

    try:
        results.put((rank, "ok", asyncio.run(rollouts.agreed(3, get))))
    except Exception as exc:  # noqa: BLE001 - what each rank raised is the result
        results.put((rank, type(exc).__name__, str(exc)))
    dist.destroy_process_group()


def run_ranks(tmp_path, failing: set[int]) -> dict[int, tuple[str, str]]:
    context = rank_context(__name__)
    results = context.Queue()
    processes = [context.Process(target=rank_main, args=(rank, str(tmp_path / "store"), failing, results)) for rank in range(2)]
    for process in processes:
        process.start()
    outcomes = {}
    for _ in processes:
        rank, kind, detail = results.get(timeout=120)  # a rank left waiting would never answer
        outcomes[rank] = (kind, detail)
    for process in processes:
        process.join(timeout=30)
        assert process.exitcode == 0
    return outcomes


@pytest.mark.timeout(180)
def test_a_rank_whose_rollouts_fail_stops_every_rank(tmp_path):
    outcomes = run_ranks(tmp_path, failing={1})
    assert outcomes[1] == ("ConnectionError", "rank 1: the executor is unreachable")  # its own error
    kind, detail = outcomes[0]
    assert kind == "RolloutsFailed" and "step 3" in detail and "1 other rank" in detail


@pytest.mark.timeout(180)
def test_when_every_rank_has_its_batch_each_goes_on(tmp_path):
    assert run_ranks(tmp_path, failing=set()) == {0: ("ok", "batch of step 3"), 1: ("ok", "batch of step 3")}
