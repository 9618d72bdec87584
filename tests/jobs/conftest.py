"""Fixtures for the training jobs: tiny checkpoints, a real trajectory store on loopback (in a
thread with its own event loop, since the trainers are synchronous), and job configs."""

import asyncio
import contextlib
import threading
from collections.abc import Iterator

import pytest
from gearshift.api.store.v1 import store_pb2, store_pb2_grpc
from gearshift.clients import channel
from gearshift.server import running
from gearshift.settings import Settings
from gearshift.training.tiny import tiny_checkpoint, tiny_moe_checkpoint


@pytest.fixture(scope="session")
def tiny_dir(tmp_path_factory):
    return tiny_checkpoint(tmp_path_factory.mktemp("jobs") / "tiny")


@pytest.fixture(scope="session")
def moe_dir(tmp_path_factory):
    """A tiny Qwen3-MoE (4 experts, 2 per token) as save_pretrained writes it."""
    return tiny_moe_checkpoint(tmp_path_factory.mktemp("jobs") / "tiny-moe")


@pytest.fixture(scope="session")
def teacher_dir(tmp_path_factory):
    """Another tiny model with peaked next-token distributions (a random tiny model's are nearly
    uniform, so there would be almost nothing to distil)."""
    import torch
    from transformers import AutoModelForCausalLM

    path = tiny_checkpoint(tmp_path_factory.mktemp("jobs") / "teacher", seed=1)
    model = AutoModelForCausalLM.from_pretrained(path)
    with torch.no_grad():
        model.get_output_embeddings().weight.mul_(6)
    model.save_pretrained(path)
    return path


@pytest.fixture(autouse=True)
def isolated_data_dir(tmp_path, monkeypatch):
    """Trainers read Settings(): keep their data dir (SQLite store, model cache) in tmp."""
    monkeypatch.setenv("GEARSHIFT_DATA_DIR", str(tmp_path / "data"))
    monkeypatch.setenv("GEARSHIFT_METRICS_PORT", "0")


class StoreThread:
    """The store service serving on a free port from a background thread."""

    def __init__(self, settings: Settings):
        self.settings = settings
        self.loop = asyncio.new_event_loop()
        self.ready = threading.Event()
        self.address = ""
        self.thread = threading.Thread(target=self.loop.run_until_complete, args=(self._serve(),), daemon=True)

    async def _serve(self):
        from gearshift.services.store.service import build

        self.stop = asyncio.Event()
        async with running(await build(self.settings), self.settings) as server:
            self.address = f"127.0.0.1:{server.port}"
            self.ready.set()
            await self.stop.wait()

    def call(self, coroutine):
        return asyncio.run_coroutine_threadsafe(coroutine, self.loop).result(30)

    def put(self, trajectories):
        async def put():
            async with channel(self.address, self.settings) as ch:
                return await store_pb2_grpc.TrajectoryStoreStub(ch).Put(store_pb2.PutRequest(trajectories=trajectories))

        return self.call(put())

    def export(self, **fields):
        async def export():
            async with channel(self.address, self.settings) as ch:
                request = store_pb2.ExportRequest(filter=store_pb2.TrajectoryFilter(**fields), include_turns=True)
                return [t async for t in store_pb2_grpc.TrajectoryStoreStub(ch).Export(request)]

        return self.call(export())

    def checkpoint(self, checkpoint_id):
        async def get():
            async with channel(self.address, self.settings) as ch:
                request = store_pb2.GetCheckpointRequest(id=checkpoint_id, include_lineage=True)
                return await store_pb2_grpc.TrajectoryStoreStub(ch).GetCheckpoint(request)

        return self.call(get())


@contextlib.contextmanager
def running_store(settings: Settings) -> Iterator[StoreThread]:
    """The store service on its own thread for the duration of a block."""
    server = StoreThread(settings)
    server.thread.start()
    assert server.ready.wait(30)
    try:
        yield server
    finally:
        server.loop.call_soon_threadsafe(server.stop.set)
        server.thread.join(10)


@pytest.fixture(scope="module")
def store(tmp_path_factory):
    with running_store(Settings(data_dir=tmp_path_factory.mktemp("store"), metrics_port=0, log_level="WARNING")) as server:
        yield server
