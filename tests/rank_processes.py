"""Processes for the tests that start gloo ranks themselves (multiprocessing rather than
torchrun): forked from a server that imported torch, transformers and gearshift's training code
once, where a spawned process imports them again (5 to 7 CPU-s each, more than most of these
tests' work). The server is multiprocessing's forkserver: started by the first such test of a
pytest process, asleep between them, gone with the process."""

from __future__ import annotations

import multiprocessing
from multiprocessing.context import ForkServerContext

PRELOAD = ["torch", "torch.distributed", "transformers", "gearshift.training.distributed", "gearshift.training.forward",
           "gearshift.training.on_policy"]


def rank_context(*modules: str) -> ForkServerContext:
    """The forkserver context; modules (a test's own, whose functions its ranks run) are imported
    in the server too, where this process starts it."""
    context = multiprocessing.get_context("forkserver")
    context.set_forkserver_preload([*PRELOAD, *modules])
    return context
