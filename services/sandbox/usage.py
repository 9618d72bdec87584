"""What a call's processes use, read by the service from /proc: nothing the code could forge.

An isolated worker is pid 1 of its own pid namespace, so everything the call started (orphans
and daemons included, which the kernel hands to pid 1) is a descendant of it. A live process's
utime + stime counts its own CPU; its cutime + cstime counts the children it reaped, which carry
their own reaped children in turn, so the sum over the tree is the CPU of everything the call
ever started. Memory is the proportional set size (shared pages split among their sharers, so
pages the worker still shares with the zygote are not counted once per process).
"""

from __future__ import annotations

import os
from dataclasses import dataclass

CLOCK_TICKS = os.sysconf("SC_CLK_TCK")


@dataclass
class Usage:
    cpu_seconds: float
    memory_bytes: int  # 0 unless asked for


def tree_usage(pid: int, memory: bool = False) -> Usage:
    """CPU seconds (and, if asked, memory) of pid and all its descendants, live or reaped."""
    ticks, pss = 0, 0
    pending, seen = [pid], set()
    while pending:
        current = pending.pop()
        if current in seen:
            continue
        seen.add(current)
        try:
            with open(f"/proc/{current}/stat", "rb") as f:
                fields = f.read().rsplit(b")", 1)[1].split()
        except OSError:  # exited meanwhile: its parent's cutime holds it once reaped
            continue
        ticks += sum(int(value) for value in fields[11:15])  # utime stime cutime cstime
        if memory:
            pss += _pss(current)
        pending += _children(current)
    return Usage(ticks / CLOCK_TICKS, pss)


def _children(pid: int) -> list[int]:
    try:
        threads = os.listdir(f"/proc/{pid}/task")
    except OSError:
        return []
    children = []
    for tid in threads:
        try:
            with open(f"/proc/{pid}/task/{tid}/children") as f:
                children += [int(child) for child in f.read().split()]
        except OSError:
            pass
    return children


def _pss(pid: int) -> int:
    try:
        with open(f"/proc/{pid}/smaps_rollup") as f:
            for line in f:
                if line.startswith("Pss:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return 0
