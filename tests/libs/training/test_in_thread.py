"""The learn thread of an asynchronous job runs on its rank's device: CUDA's current device is per
thread, so a worker thread that does not set it sends its kernels and collectives to cuda:0."""

import threading

import torch
from gearshift.training import distributed


async def test_the_worker_thread_sets_its_ranks_cuda_device_before_it_runs(monkeypatch):
    calls = []
    monkeypatch.setattr(torch.cuda, "set_device", lambda device: calls.append((device, threading.get_ident())))
    rank_device = torch.device("cuda", 3)  # rank 3 of a node: not cuda:0
    thread = await distributed.in_thread(rank_device, threading.get_ident)
    assert thread != threading.get_ident()  # ran in a worker thread
    assert calls == [(rank_device, thread)]  # which set the rank's device first


async def test_on_the_cpu_it_sets_no_device(monkeypatch):
    calls = []
    monkeypatch.setattr(torch.cuda, "set_device", calls.append)
    assert await distributed.in_thread(torch.device("cpu"), sum, [1, 2]) == 3
    assert calls == []
