"""Fixtures for the training jobs: tiny checkpoints, a real trajectory store on loopback (in a
thread with its own event loop, since the trainers are synchronous), job configs, and the
trainer-rank tests' episodes and launches (tests/jobs/rank_runs.py)."""

import asyncio
import contextlib
import threading
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

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


# --- The trainer-rank tests' data and launches (tests/jobs/rank_runs.py) ---


@pytest.fixture(scope="session")
def ranks_store(tmp_path_factory):
    """The store of the rank tests' episodes (task_source "ranks")."""
    with running_store(Settings(data_dir=tmp_path_factory.mktemp("ranks-store"), metrics_port=0, log_level="WARNING")) as server:
        yield server


@dataclass(frozen=True)
class RanksData:
    rollouts: Path  # apo.pkl: APO groups (rho = gamma = 1) of four products; distill.pkl: distillation episodes of six
    sft_trajectories: Path  # what the SFT job reads from the store, pickled for the worker


@pytest.fixture(scope="session")
async def ranks_data(ranks_store, tiny_dir, teacher_dir, tmp_path_factory) -> RanksData:
    """What the platform produces, once: the executor, router, planner, sandbox and reward service
    over a scripted policy (rank_runs.products_policy) run forced-mode episodes of every product,
    scored and stored in ranks_store, and APO and distillation rollouts, pickled."""
    import pickle

    from gearshift.api.common.v1.common_pb2 import Mode, Purpose
    from gearshift.api.executor.v1 import executor_pb2, executor_pb2_grpc
    from gearshift.embedded import embedded
    from gearshift.jobs.apo.config import APOConfig
    from gearshift.jobs.apo.rollouts import collect
    from gearshift.jobs.distill.config import DistillConfig, Prompt
    from gearshift.jobs.distill.trainer import student_rollouts
    from gearshift.testing.scripted_policy import serve_scripted
    from gearshift.topology import SERVICE_NAMES
    from gearshift.training.config import DataConfig
    from gearshift.training.data import load_trajectories

    from tests.jobs.rank_runs import PRODUCTS, products_policy

    folder = tmp_path_factory.mktemp("ranks-data")
    settings = Settings(data_dir=folder / "platform", metrics_port=0, store_addr=ranks_store.address, log_level="WARNING")
    async with serve_scripted(products_policy) as url:
        async with embedded(settings.with_policy(url), tuple(name for name in SERVICE_NAMES if name != "store")) as running:
            platform = running.settings
            async with channel(platform.executor_addr, platform) as ch:
                stub = executor_pb2_grpc.ExecutorStub(ch)
                for a, b in PRODUCTS:
                    for mode in (Mode.MODE_INSTANT, Mode.MODE_REASONING, Mode.MODE_AGENTIC):
                        request = executor_pb2.SolveRequest(query=f"What is {a}*{b}?", mode=mode, reference_answer=str(a * b), task_source="ranks",
                                                            split="train", purpose=Purpose.PURPOSE_TRAINING)
                        [item async for item in stub.Solve(request)]
            prompts = [{"query": f"What is {a}*{b}?", "reference_answer": str(a * b)} for a, b in PRODUCTS]
            apo = APOConfig.model_validate({"output": {"dir": str(folder)}, "prompts": prompts, "rho": 1, "gamma": 1})
            groups = await collect(platform, platform.executor_addr, platform.reward_addr, apo.prompts[:4], apo, "ranks-apo", 1)
            assert all(len(set(group.rewards)) > 1 for group in groups)  # every group informative: all are learned
            distill = DistillConfig.model_validate({"output": {"dir": str(folder)}, "default_teacher": str(teacher_dir)})
            modes = ["instant", "reasoning", "agentic"]
            episodes = await student_rollouts(platform, [Prompt(query=p["query"], mode=modes[i % 3]) for i, p in enumerate(prompts)],
                                              distill, "ranks-distill", 1)
    (folder / "apo.pkl").write_bytes(pickle.dumps(groups))
    (folder / "distill.pkl").write_bytes(pickle.dumps(([str(teacher_dir)] * len(episodes), episodes)))
    trajectories = folder / "trajectories.pkl"
    trajectories.write_bytes(pickle.dumps(load_trajectories(ranks_store.address, DataConfig(task_source="ranks", correctness="correct"))))
    return RanksData(folder, trajectories)


@pytest.fixture(scope="session")
def unbalanced_moe_dir(moe_dir, tmp_path_factory) -> Path:
    """The tiny MoE with router_aux_loss_coef 0: no balancing loss."""
    import json
    import shutil

    path = tmp_path_factory.mktemp("moe") / "unbalanced"
    shutil.copytree(moe_dir, path)
    config = json.loads((path / "config.json").read_text())
    (path / "config.json").write_text(json.dumps({**config, "router_aux_loss_coef": 0.0}))
    return path


@pytest.fixture(scope="session")
def qwen3_dir(tiny_dir, tmp_path_factory) -> Path:
    """A tiny Qwen3 (its heads normalised one by one: q_norm, k_norm; its head untied) with the
    tiny Llama's tokenizer."""
    import torch
    from transformers import AutoTokenizer, Qwen3Config, Qwen3ForCausalLM

    path = tmp_path_factory.mktemp("qwen3") / "tiny-qwen3"
    tokenizer = AutoTokenizer.from_pretrained(tiny_dir)
    torch.manual_seed(0)
    config = Qwen3Config(vocab_size=len(tokenizer), hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
                         num_key_value_heads=2, head_dim=16, max_position_embeddings=2048, tie_word_embeddings=False)
    model = Qwen3ForCausalLM(config)
    with torch.no_grad():
        for name, param in model.named_parameters():
            if name.endswith("norm.weight"):
                param.normal_(1.0, 0.2)  # not all ones: each head's weights matter apart
    model.save_pretrained(path)
    tokenizer.save_pretrained(path)
    return path


@pytest.fixture(scope="session")
def worker_runs(request, tiny_dir, tmp_path_factory) -> dict[int, dict[str, dict]]:
    """Every worker case of the collected modules among test_distributed, test_tensor_parallel and
    test_layout (tests/jobs/rank_runs.py), by number of ranks and name: one launch of forked ranks
    per number of ranks (rank_runs.fork_cases), in rank_runs.RANKS' order."""
    from tests.jobs import rank_runs

    folder = tmp_path_factory.mktemp("worker")
    modules = {Path(item.fspath).stem for item in request.session.items}
    groups = []
    if {"test_distributed", "test_tensor_parallel"} & modules:
        data = request.getfixturevalue("ranks_data")
    if "test_distributed" in modules:
        teacher_dir = request.getfixturevalue("teacher_dir")
        groups.append(rank_runs.distributed_cases(tiny_dir, teacher_dir, data.rollouts, data.sft_trajectories, folder))
        groups.append(rank_runs.moe_cases(request.getfixturevalue("moe_dir"), request.getfixturevalue("unbalanced_moe_dir"), teacher_dir,
                                          data.rollouts, data.sft_trajectories, folder))
    if "test_tensor_parallel" in modules:
        groups.append(rank_runs.tensor_parallel_cases(tiny_dir, request.getfixturevalue("qwen3_dir"), data.sft_trajectories, folder))
    if "test_layout" in modules:
        groups.append(rank_runs.layout_cases(tiny_dir, folder))
    cases: dict[int, dict] = {ranks: {} for ranks in rank_runs.RANKS}
    for group in groups:
        for ranks, named in group.items():
            assert not cases[ranks].keys() & named.keys(), "a case name taken twice"
            cases[ranks].update(named)
    return {ranks: rank_runs.fork_cases(ranks, cases[ranks], folder / str(ranks)) if cases[ranks] else {} for ranks in rank_runs.RANKS}
