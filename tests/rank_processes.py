"""Processes for the tests that start gloo ranks themselves rather than through torchrun: forked
from a server that imported torch, transformers and gearshift's training code once, where a
spawned process (torchrun's ranks among them) imports them again, 5 to 7 CPU-s each, more than
most of these tests' work. The server is multiprocessing's forkserver: started by the first such
test of a pytest process, asleep between them, gone with the process. The launches as users run
them stay under torchrun (test_distributed's `gearshift train`)."""

from __future__ import annotations

import multiprocessing
import os
import time
import traceback
from collections.abc import Callable
from multiprocessing.connection import wait
from multiprocessing.context import ForkServerContext

PRELOAD = ["torch", "torch.distributed", "transformers", "gearshift.training.distributed", "gearshift.training.forward",
           "gearshift.training.on_policy"]


def rank_context(*modules: str) -> ForkServerContext:
    """The forkserver context; modules (a test's own, whose functions its ranks run) are imported
    in the server too, where this process starts it."""
    context = multiprocessing.get_context("forkserver")
    context.set_forkserver_preload([*PRELOAD, *modules])
    return context


def _rank(rank: int, world_size: int, port: int, failures, target: Callable, args: tuple) -> None:
    if world_size > 1:  # what torchrun gives each rank (one rank: a plain process, as torchrun's callers run it)
        os.environ.update(RANK=str(rank), LOCAL_RANK=str(rank), WORLD_SIZE=str(world_size), LOCAL_WORLD_SIZE=str(world_size),
                          MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    os.environ["OMP_NUM_THREADS"] = "1"
    import torch

    torch.set_num_threads(1)
    try:
        target(*args)
    except BaseException:
        failures.put(f"rank {rank}: {traceback.format_exc()}")
        raise


def run_ranks(world_size: int, target: Callable, *args, timeout: float = 600) -> None:
    """target(*args) on world_size forked ranks of one gloo group, each with torchrun's environment
    and one thread. Returns when every rank has; the first rank that fails (or the timeout) stops
    the others, as torchrun's agent does, and fails the caller with its traceback."""
    from gearshift.testing.ports import free_port

    context = rank_context(target.__module__)
    failures = context.SimpleQueue()
    port = free_port()  # rank 0's store
    ranks = [context.Process(target=_rank, args=(rank, world_size, port, failures, target, args)) for rank in range(world_size)]
    for process in ranks:
        process.start()
    deadline = time.monotonic() + timeout
    running = list(ranks)
    while running and time.monotonic() < deadline:  # the rest of a failed rank's group would wait in a collective
        for sentinel in wait([process.sentinel for process in running], timeout=max(0.0, deadline - time.monotonic())):
            process = next(p for p in running if p.sentinel == sentinel)
            process.join()
            running = [] if process.exitcode != 0 else [p for p in running if p is not process]
    for process in ranks:
        if process.exitcode is None:
            process.kill()
            process.join()
    codes = [process.exitcode for process in ranks]
    assert codes == [0] * world_size, failures.get() if not failures.empty() else f"the ranks' exit codes: {codes} (timeout {timeout} s)"
