"""The session's vLLM servers take no CPU while no test uses them (tests/vllm_servers.py pauses
them): an idle vLLM CPU server left running polls, and on a two-core machine every other test
would run on what it leaves."""

from __future__ import annotations

import os
import time
from pathlib import Path

import httpx

IDLE_SECONDS = 10.0
MAX_SHARE_OF_A_CORE = 0.05


def cpu_seconds(groups: set[int]) -> float:
    """CPU seconds (user and system) used so far by every live process in these process groups."""
    ticks = 0
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except OSError:  # gone meanwhile
            continue
        if int(fields[2]) in groups:  # pgrp; fields after the command name start at state
            ticks += int(fields[11]) + int(fields[12])  # utime, stime
    return ticks / os.sysconf("SC_CLK_TCK")


def test_the_vllm_servers_use_under_a_twentieth_of_a_core_while_no_test_uses_them(vllm_pair):
    groups = {process.pid for process in vllm_pair.processes}  # each server leads its own group
    vllm_pair.resume()
    try:
        assert all(httpx.get(url.removesuffix("/v1") + "/health", timeout=30).status_code == 200 for url in vllm_pair.urls)
    finally:
        vllm_pair.pause()
    before = cpu_seconds(groups)
    time.sleep(IDLE_SECONDS)
    used = cpu_seconds(groups) - before
    assert used < MAX_SHARE_OF_A_CORE * IDLE_SECONDS, f"{used:.2f} CPU seconds in {IDLE_SECONDS:.0f} s"
