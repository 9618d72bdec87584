"""Resident memory of the whole embedded stack with the real model loaded: the six services, the
policy server and every process they started (sandbox zygote and workers), summed from
/proc after solving a question in each mode.

    .venv/bin/python benchmarks/stack_memory.py

Goal (issue 3): under 2.5 GB resident in total.
"""

from __future__ import annotations

import asyncio
import tempfile
from pathlib import Path

from gearshift import console
from gearshift.api.common.v1.common_pb2 import Mode
from gearshift.api.executor.v1 import executor_pb2
from gearshift.settings import get_settings
from gearshift.stack import Stack

BASE_PORT = 23300  # below the ephemeral range (32768-60999): no client socket can hold it


def rss_kib(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1])
    return 0


def children(pid: int) -> list[int]:
    found = []
    for task in Path(f"/proc/{pid}/task").iterdir():
        path = task / "children"
        if path.exists():
            found += [int(child) for child in path.read_text().split()]
    return found


def tree(pid: int) -> list[int]:
    pids, pending = [], [pid]
    while pending:
        current = pending.pop()
        try:
            pending += children(current)
        except FileNotFoundError:
            continue
        pids.append(current)
    return pids


def main() -> None:
    stack = Stack(get_settings(), data_dir=tempfile.mkdtemp(prefix="gearshift-mem-"), base_port=BASE_PORT)
    stack.start()
    try:
        stack.wait_ready()
        settings = stack.client_settings()
        for mode in (Mode.MODE_INSTANT, Mode.MODE_REASONING, Mode.MODE_AGENTIC):
            request = executor_pb2.SolveRequest(query="What is 17*23?", mode=mode, budget=executor_pb2.Budget(max_steps=1))
            asyncio.run(console.solve(settings, request, None))
        total = 0
        print(f"{'process':<10} {'processes':>9} {'RSS MiB':>8}")
        for name, process in stack.processes.items():
            pids = tree(process.pid)
            kib = sum(rss_kib(pid) for pid in pids)
            total += kib
            print(f"{name:<10} {len(pids):>9} {kib / 1024:>8.0f}")
        print(f"{'total':<10} {'':>9} {total / 1024:>8.0f}   (goal: under 2560 MiB)")
    finally:
        stack.stop()


if __name__ == "__main__":
    main()
