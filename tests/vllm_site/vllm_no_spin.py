"""vLLM's shared-memory message queues polled with a short sleep instead of a busy wait, for the
tests' CPU servers (sitecustomize.py beside this file installs it).

A reader of vLLM's queue (the engine core waiting for its worker's output, the worker for the
next step) spins on sched_yield for a second after each message before it waits on the queue's
notification socket. On a GPU host the spin costs a spare core; on these 2-core machines it is
half the machine: while a CPU worker computes a step, its engine core spins beside it, taking as
much CPU as the step itself. Polling every half millisecond costs a step of tens of milliseconds
at most that much. (Waiting on the notification socket at once instead lost wake-ups: requests
stalled for the queue's 5-second recheck.)"""

import time

POLL_SECONDS = 0.0005


def install() -> None:
    from vllm.distributed.device_communicators import shm_broadcast

    shm_broadcast.sched_yield = lambda: time.sleep(POLL_SECONDS)  # the queue's only use of it: waiting for the other side
