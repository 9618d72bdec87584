"""The session's vLLM servers take no CPU while no test uses them (tests/vllm_servers.py pauses
them): an idle vLLM CPU server left running polls, and on a two-core machine every other test
would run on what it leaves. Nor does a server's engine core spin while its worker generates
(tests/vllm_site/vllm_no_spin.py)."""

from __future__ import annotations

import os
import time
from pathlib import Path

import httpx

IDLE_SECONDS = 10.0
MAX_SHARE_OF_A_CORE = 0.05
# vLLM names its processes; the kernel keeps 15 characters of a name.
ENGINE_CORE, WORKER = "VLLM::EngineCor", "VLLM::Worker"


def cpu_seconds(groups: set[int], name: str = "") -> float:
    """CPU seconds (user and system) used so far by every live process in these process groups
    whose name starts with name."""
    ticks = 0
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            head, tail = stat.read_text().rsplit(")", 1)
        except OSError:  # gone meanwhile
            continue
        fields = tail.split()
        if int(fields[2]) in groups and head.split("(", 1)[1].startswith(name):  # pgrp; fields after the command name start at state
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


def test_a_servers_engine_core_waits_for_its_worker_without_spinning(vllm_servers, vllm_pair):
    group = {vllm_pair.processes[0].pid}
    before = {name: cpu_seconds(group, name) for name in (ENGINE_CORE, WORKER)}
    body = {"model": "smollm2", "prompt": "Once upon a time", "max_tokens": 64, "temperature": 0, "ignore_eos": True}
    assert httpx.post(f"{vllm_servers[0]}/completions", json=body, timeout=300).json()["usage"]["completion_tokens"] == 64
    used = {name: cpu_seconds(group, name) - before[name] for name in (ENGINE_CORE, WORKER)}
    # Spinning, the engine core took as much CPU as the worker's 64 steps (9.5 CPU-s against 8.7 for 128 tokens).
    assert used[WORKER] > 1 and used[ENGINE_CORE] < 0.2 * used[WORKER], used
