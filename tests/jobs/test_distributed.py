"""One job across ranks (torchrun, gloo on the CPU, the tiny model) learns what one process learns.

The data is what the platform produces: episodes the executor ran (a ScriptedPolicy answering
products right with python and by reasoning, wrong at once), scored by the reward service and
stored. SFT runs as users launch it (`torchrun -m gearshift.cli train sft`) and reads the store;
APO and distillation run their trainers' own `learn` on rollouts collected once
(tests/jobs/ranks_worker.py), so 1 rank and 2 learn from the same episodes."""

from __future__ import annotations

import json
import os
import pickle
import re
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from gearshift.api.common.v1.common_pb2 import Mode, Purpose
from gearshift.api.executor.v1 import executor_pb2, executor_pb2_grpc
from gearshift.clients import channel
from gearshift.embedded import embedded
from gearshift.protocol.sr2am import PLAN_HEAD
from gearshift.testing.scripted_policy import serve_scripted
from gearshift.topology import SERVICE_NAMES
from safetensors.torch import load_file

# The worker runs' three launches are the set-up of the first test that uses them: 260 s on the seventh stop's 2-core machine.
pytestmark = [pytest.mark.slow, pytest.mark.ranks, pytest.mark.timeout(900)]

WORKER = Path(__file__).with_name("ranks_worker.py")
ROOT = Path(__file__).parents[2]
PRODUCTS = [(12, 34), (7, 8), (123, 45), (5, 6), (81, 27), (1234, 56)]
# Reduction order differs between 2 ranks and 1 process, and between CPUs: DDP distillation on
# one AMD EPYC (stop 47) ended 1.22e-5 apart after 3 AdamW steps at lr 1e-3, whose normalised
# updates amplify float32 noise on near-zero gradients; ranks that diverge differ by ~lr.
WEIGHTS_TOLERANCE = 2e-5


def products_policy(body: dict) -> str:
    """A stand-in that routes products to tools, multiplies right with python and by reasoning,
    and answers one too many at once."""
    a, b = map(int, re.search(r"What is (\d+)\*(\d+)\?", str(body.get("messages"))).groups())
    last = body["messages"][-1]["content"]
    if "</classification>" in (body.get("stop") or []):
        return "A product is safer with a tool.\n<classification>\ntoolcalling_agent\n</classification>"
    if last.startswith("You regulate"):
        return "ACT"
    if last.endswith(PLAN_HEAD):
        return " None"
    if "<tool_response>" in last:
        return f"The tool printed it.\n<answer>{a * b}</answer>"
    if last.rstrip().endswith("<answer>"):
        return f"{a * b + 1}</answer>"
    if last.rstrip().endswith("<reasoning>"):
        return f"{a} times {b} makes {a * b}.</reasoning>\n<answer>{a * b}</answer>"
    return f"Multiply {a} by {b}.</plan>\n<tool_call>\n{{'id': 1, 'name': 'python', 'arguments': {{'code': 'print({a}*{b})'}}}}\n</tool_call>"


@pytest.fixture(scope="module")
async def platform(store, tmp_path_factory):
    """The executor, router, planner, sandbox and reward service over the scripted policy,
    storing into the module's store."""
    from gearshift.settings import Settings

    settings = Settings(data_dir=tmp_path_factory.mktemp("platform"), metrics_port=0, store_addr=store.address, log_level="WARNING")
    async with serve_scripted(products_policy) as url:
        services = tuple(name for name in SERVICE_NAMES if name != "store")
        async with embedded(settings.with_policy(url), services) as running:
            yield running.settings


@pytest.fixture(scope="module")
async def sft_data(platform):
    """Forced-mode episodes of every product, scored and stored (task_source "ranks")."""
    async with channel(platform.executor_addr, platform) as ch:
        stub = executor_pb2_grpc.ExecutorStub(ch)
        for a, b in PRODUCTS:
            for mode in (Mode.MODE_INSTANT, Mode.MODE_REASONING, Mode.MODE_AGENTIC):
                request = executor_pb2.SolveRequest(query=f"What is {a}*{b}?", mode=mode, reference_answer=str(a * b),
                                                    task_source="ranks", split="train", purpose=Purpose.PURPOSE_TRAINING)
                [item async for item in stub.Solve(request)]
    return "ranks"


@pytest.fixture(scope="module")
async def rollouts(platform, tiny_dir, teacher_dir, tmp_path_factory):
    """APO groups (rho = gamma = 1) of four products and distillation episodes of six, pickled once."""
    from gearshift.jobs.apo.config import APOConfig
    from gearshift.jobs.apo.rollouts import collect
    from gearshift.jobs.distill.config import DistillConfig, Prompt
    from gearshift.jobs.distill.trainer import student_rollouts

    folder = tmp_path_factory.mktemp("rollouts")
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
    return folder


def launch(ranks: int, *args: str, timeout: float = 300, env: dict | None = None) -> subprocess.CompletedProcess:
    """args under torchrun with ranks processes on this machine (ranks 1: a plain process), with env
    added to this process's environment."""
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(ROOT), **(env or {})}
    if ranks == 1:
        command = [sys.executable, *args]
    else:
        command = [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc-per-node={ranks}", *args]
    return subprocess.run(command, capture_output=True, text=True, timeout=timeout, env=env, cwd=ROOT)


def first_error(stderr: str) -> str:
    """The first rank's traceback of a failed launch (each line prefixed [rankN]: by torchrun)."""
    lines = stderr.splitlines()
    start = next((i for i, line in enumerate(lines) if "Traceback" in line), max(0, len(lines) - 40))
    return "\n".join(lines[start:start + 60])


def write_config(path: Path, body: dict) -> Path:
    path.write_text(json.dumps(body))
    return path


def base_config(tiny_dir, out: Path, **extra) -> dict:
    body = {
        "model": {"base": str(tiny_dir)},
        "optim": {"learning_rate": 1e-3, "max_steps": 3, "seed": 3, "threads": 1},
        "output": {"dir": str(out), "save_every": 2, "progress": False},
    }
    for key, value in extra.items():
        body[key] = {**body.get(key, {}), **value} if isinstance(value, dict) else value
    return body


def run_cases(ranks: int, cases: dict[str, tuple[str, dict, Path]], folder: Path, **extra) -> dict[str, dict]:
    """Worker cases, name: (job, config, data), one after another in one launch (a launch's imports
    cost more than a case's steps); each case's losses and final weights."""
    listing = []
    for name, (job, config, data) in cases.items():
        (folder / name).mkdir(parents=True, exist_ok=True)
        config_path = write_config(folder / name / "config.json", config)
        listing.append({"job": job, "config": str(config_path), "data": str(data), "out": str(folder / name / "out.json"), **extra})
    done = launch(ranks, str(WORKER), str(write_config(folder / "cases.json", listing)))
    (folder / "stderr.txt").write_text(done.stderr)
    assert done.returncode == 0, first_error(done.stderr)
    return {name: json.loads((folder / name / "out.json").read_text()) for name in cases}


def run_worker(ranks: int, job: str, config: dict, data: Path, folder: Path) -> dict:
    return run_cases(ranks, {"run": (job, config, data)}, folder)["run"]


def max_difference(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> float:
    assert a.keys() == b.keys()
    return max(float((a[key].float() - b[key].float()).abs().max()) for key in a)


def assert_same_run(one: dict, many: dict) -> None:
    assert many["losses"] == pytest.approx(one["losses"], rel=1e-5, abs=1e-7)
    assert max_difference(torch.load(one["weights"]), torch.load(many["weights"])) < WEIGHTS_TOLERANCE


def sft_config(tiny_dir, out: Path, store=None, **extra) -> dict:
    """SFT on the stored episodes; without store, for the worker, which is given them."""
    data = {"task_source": "ranks", "correctness": "correct"}
    return base_config(tiny_dir, out, store_addr=store.address if store else "", data=data, batch_size=6, **extra)


def train_sft(ranks: int, config: dict, folder: Path) -> subprocess.CompletedProcess:
    folder.mkdir(parents=True, exist_ok=True)
    path = write_config(folder / "sft.json", config)
    return launch(ranks, "-m", "gearshift.cli", "train", "sft", "--config", str(path))


@pytest.fixture(scope="module")
def sft_alone(tiny_dir, store, sft_data, tmp_path_factory):
    """SFT in one process: the reference of every comparison."""
    out = tmp_path_factory.mktemp("sft") / "one"
    done = train_sft(1, sft_config(tiny_dir, out, store), out.parent / "config-one")
    assert done.returncode == 0, done.stderr[-3000:]
    return out


def metrics(out: Path) -> list[dict]:
    return [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]


@pytest.mark.parametrize("parallelism", ["fsdp", "ddp"])
def test_sft_under_torchrun_is_one_job_that_learns_what_one_process_learns(tiny_dir, store, sft_alone, tmp_path, parallelism):
    out = tmp_path / "two"
    config = sft_config(tiny_dir, out, store, runtime={"parallelism": parallelism})
    done = train_sft(2, config, tmp_path)
    assert done.returncode == 0, done.stderr[-3000:]
    assert len(done.stdout.strip().splitlines()) == 1  # one summary: rank 0's
    history, alone = metrics(out), metrics(sft_alone)
    assert [r["step"] for r in history] == [1, 2, 3]  # one line per step, not one per rank
    assert [r["loss"] for r in history] == pytest.approx([r["loss"] for r in alone], rel=1e-5)
    assert [r["grad_norm"] for r in history] == pytest.approx([r["grad_norm"] for r in alone], rel=1e-4)
    assert [r["target_tokens"] for r in history] == [r["target_tokens"] for r in alone]
    assert max_difference(load_file(out / "model.safetensors"), load_file(sft_alone / "model.safetensors")) < WEIGHTS_TOLERANCE
    result = json.loads((out / "result.json").read_text())
    assert store.checkpoint(result["checkpoint_id"]).uri == str(out.resolve())  # registered once, by rank 0
    retried = train_sft(2, config, tmp_path)  # a retry after the registration completes
    assert retried.returncode == 0, retried.stderr[-3000:]
    assert json.loads((out / "result.json").read_text())["checkpoint_id"] == result["checkpoint_id"]
    assert [r["step"] for r in metrics(out)] == [1, 2, 3]


@pytest.fixture(scope="module")
def sft_trajectories(store, sft_data, tmp_path_factory) -> Path:
    """What the SFT job reads from the store, pickled for the worker."""
    from gearshift.training.config import DataConfig
    from gearshift.training.data import load_trajectories

    path = tmp_path_factory.mktemp("sft-data") / "trajectories.pkl"
    path.write_bytes(pickle.dumps(load_trajectories(store.address, DataConfig(task_source=sft_data, correctness="correct"))))
    return path


def test_sft_normalised_per_rank_differs_from_one_process(sft_alone, worker_runs):
    """The comparison above catches a loss normalised by each rank's own token count."""
    per_rank = worker_runs[2]["sft-per-rank"]
    alone = [r["loss"] for r in metrics(sft_alone)]
    assert per_rank["losses"] != pytest.approx(alone, rel=1e-5)  # what the comparison above asserts
    difference = max_difference(torch.load(per_rank["weights"]), load_file(sft_alone / "model.safetensors"))
    assert difference > 10 * WEIGHTS_TOLERANCE, difference


ON_POLICY = {
    "apo": {"rho": 1, "gamma": 1, "updates_per_batch": 2, "kl_coef": 0.05, "prompts": [{"query": "q", "reference_answer": "a"}],
            "rollout": {"exact_tokens": False}},
    "distill": {"top_k": 64, "prompts": [{"query": "q"}], "rollout": {"exact_tokens": False}},
}


def on_policy_config(job: str, tiny_dir, teacher_dir, out: Path, parallelism: str, lora: bool) -> dict:
    """Micro-batches small enough that the ranks hold different numbers of them (fillers keep
    the ranks in step); two steps, the second learning from the first's update."""
    extra = dict(ON_POLICY[job], **({"default_teacher": str(teacher_dir)} if job == "distill" else {}))
    model = {"lora": True, "lora_rank": 4} if lora else {}
    runtime = {"parallelism": parallelism, "micro_batch_tokens": 700}
    return base_config(tiny_dir, out, model=model, runtime=runtime, optim={"max_steps": 2}, **extra)


def on_policy_data(job: str, rollouts: Path, tiny_dir, teacher_dir, lora: bool) -> Path:
    """The fixed rollouts; under LoRA half the distillation episodes are scored by the student's
    own base (the adapter off: it runs through the sharded policy on every micro-batch of every
    rank), the other half by the other teacher."""
    if not (job == "distill" and lora):
        return rollouts / f"{job}.pkl"
    _, episodes = pickle.loads((rollouts / "distill.pkl").read_bytes())
    owners = [str(tiny_dir) if index % 2 else str(teacher_dir) for index in range(len(episodes))]
    path = rollouts / "distill-base.pkl"
    path.write_bytes(pickle.dumps((owners, episodes)))
    return path


PARALLELISMS = [("fsdp", False), ("ddp", False), ("fsdp", True)]  # (parallelism, lora) of the 2-rank on-policy runs


@pytest.fixture(scope="module")
def unbalanced_moe_dir(moe_dir, tmp_path_factory) -> Path:
    """The tiny MoE with router_aux_loss_coef 0: no balancing loss."""
    import shutil

    path = tmp_path_factory.mktemp("moe") / "unbalanced"
    shutil.copytree(moe_dir, path)
    config = json.loads((path / "config.json").read_text())
    (path / "config.json").write_text(json.dumps({**config, "router_aux_loss_coef": 0.0}))
    return path


ATTENTION = ["q_proj", "k_proj", "v_proj", "o_proj"]




def moe_cases(ranks: int, moe_dirs: tuple[Path, Path], teacher_dir, rollouts: Path, sft_trajectories: Path, out) -> dict[str, tuple]:
    """The trainers on the tiny MoE (its balancing loss in the objective): at 1 rank and sharded by
    FSDP on 2; SFT and distillation with expert parallelism on 2 and 4; at 1 rank also SFT without
    the balancing loss and with LoRA on the attention; and an export of the weights as loaded."""
    moe_dir, unbalanced_dir = moe_dirs
    def trainer(job: str, name: str, **extra) -> tuple[str, dict, Path]:
        if job == "sft":
            return "sft", sft_config(moe_dir, out(ranks, name), **extra), sft_trajectories
        config = on_policy_config(job, moe_dir, teacher_dir, out(ranks, name), "fsdp", False)
        config["runtime"].update(extra.get("runtime", {}))
        return job, config, rollouts / f"{job}.pkl"

    expert, context = {"expert_parallel": 2}, {"context_parallel": 2}
    cases = {}
    if ranks < 4:
        cases.update({f"moe-{job}": trainer(job, f"moe-{job}") for job in ("sft", "apo", "distill")})
    if ranks == 1:
        cases["moe-sft-unbalanced"] = "sft", sft_config(unbalanced_dir, out(1, "moe-sft-unbalanced")), sft_trajectories
        lora = {"lora": True, "lora_rank": 4, "lora_target_modules": ATTENTION}
        cases["moe-lora"] = "sft", sft_config(moe_dir, out(1, "moe-lora"), model=lora, optim={"learning_rate": 1e-2}), sft_trajectories
    if ranks == 2:  # experts over the 2 ranks; each micro-batch's tokens split over them, alone and with the experts split
        cases.update({f"moe-{job}-ep2": trainer(job, f"moe-{job}-ep2", runtime=expert) for job in ("sft", "distill")})
        cases.update({f"moe-{job}-cp2": trainer(job, f"moe-{job}-cp2", runtime=context) for job in ("sft", "apo", "distill")})
        cases["moe-sft-cp2-ep2"] = trainer("sft", "moe-sft-cp2-ep2", runtime=context | expert)
        cases["moe-export-ep2"] = "export", sft_config(moe_dir, out(2, "moe-export-ep2"), runtime=expert), sft_trajectories
    if ranks == 4:  # 2 data x 2 expert; and 2 data x 2 context, experts over each context pair (SFT's data x expert
        # case: 4 ranks on 2 cores are the suite's slowest launch, so SFT runs only the mesh that adds context)
        cases["moe-distill-ep2x2"] = trainer("distill", "moe-distill-ep2x2", runtime=expert)
        cases["moe-sft-cp2x2-ep2"] = trainer("sft", "moe-sft-cp2x2-ep2", runtime=context | expert)
    return cases


@pytest.fixture(scope="module")
def worker_runs(tiny_dir, teacher_dir, moe_dir, unbalanced_moe_dir, rollouts, sft_trajectories, tmp_path_factory) -> dict[int, dict[str, dict]]:
    """Every worker run of the tests below, by number of ranks and name: one launch at 1 rank, one
    at 2 (where "resumed" resumes the state "saved" left at 1 rank), one at 4 (expert parallelism
    on a 2 x 2 mesh)."""
    folder = tmp_path_factory.mktemp("worker")
    cases: dict[int, dict[str, tuple[str, dict, Path]]] = {1: {}, 2: {}}

    def out(ranks: int, name: str) -> Path:
        return folder / str(ranks) / name / "out"

    for job in ON_POLICY:
        for lora in (False, True):
            name = f"{job}-lora-{lora}"
            config = on_policy_config(job, tiny_dir, teacher_dir, out(1, name), "fsdp", lora)
            cases[1][name] = job, config, on_policy_data(job, rollouts, tiny_dir, teacher_dir, lora)
        for parallelism, lora in PARALLELISMS:
            name = f"{job}-{parallelism}-lora-{lora}"
            config = on_policy_config(job, tiny_dir, teacher_dir, out(2, name), parallelism, lora)
            cases[2][name] = job, config, on_policy_data(job, rollouts, tiny_dir, teacher_dir, lora)
    cases[2]["sft-per-rank"] = "sft-per-rank", sft_config(tiny_dir, out(2, "sft-per-rank")), sft_trajectories
    for ranks in (1, 2):  # the GPU default for LoRA on gloo: a bf16 base and float32 adapters in one FSDP group
        config = sft_config(tiny_dir, out(ranks, "lora-bf16"), model={"lora": True, "lora_rank": 4}, runtime={"precision": "bf16"},
                            optim={"learning_rate": 1e-2})
        cases[ranks]["lora-bf16"] = "sft", config, sft_trajectories
    cases[1]["saved"] = "sft", sft_config(tiny_dir, folder / "saved", optim={"max_steps": 2}), sft_trajectories
    cases[2]["resumed"] = "sft", sft_config(tiny_dir, folder / "saved"), sft_trajectories
    cases[4] = {}
    for ranks in cases:
        cases[ranks].update(moe_cases(ranks, (moe_dir, unbalanced_moe_dir), teacher_dir, rollouts, sft_trajectories, out))
    return {ranks: run_cases(ranks, named, folder / str(ranks)) for ranks, named in cases.items()}


@pytest.mark.parametrize("job", ["apo", "distill"])
@pytest.mark.parametrize("parallelism, lora", PARALLELISMS)
def test_on_policy_updates_on_two_ranks_equal_one_process(worker_runs, job, parallelism, lora):
    """Under LoRA, APO's KL reference is the base with the adapter off."""
    one, two = worker_runs[1][f"{job}-lora-{lora}"], worker_runs[2][f"{job}-{parallelism}-lora-{lora}"]
    assert_same_run(one, two)
    assert one["losses"][0] != one["losses"][-1]  # it learned something to compare


def test_a_rank_that_dies_fails_the_job_and_a_rerun_on_one_rank_resumes_to_the_same_weights(
    tiny_dir, store, sft_alone, sft_trajectories, tmp_path
):
    config = sft_config(tiny_dir, tmp_path / "out")  # saves every 2 steps
    with pytest.raises(AssertionError):  # the launch failed
        run_cases(2, {"died": ("sft", config, sft_trajectories)}, tmp_path / "died", die_at=3, die_rank=1)
    died = (tmp_path / "died" / "stderr.txt").read_text()
    assert re.search(r"rank\s*:\s*1 \(local_rank: 1\)\n\s*exitcode\s*:\s*-9", died), died[-3000:]  # torchrun names it
    assert not (tmp_path / "out" / "result.json").exists()
    resumed = run_worker(1, "sft", config, sft_trajectories, tmp_path)  # saved at 2 ranks, loaded at 1
    assert resumed["resumed_from"] == 2
    assert resumed["losses"] == pytest.approx([r["loss"] for r in metrics(sft_alone)], rel=1e-5)  # one line per step
    assert max_difference(torch.load(resumed["weights"]), load_file(sft_alone / "model.safetensors")) < WEIGHTS_TOLERANCE


def test_state_saved_at_one_rank_resumes_at_two(sft_alone, worker_runs):
    resumed = worker_runs[2]["resumed"]
    assert resumed["resumed_from"] == 2
    assert max_difference(torch.load(resumed["weights"]), load_file(sft_alone / "model.safetensors")) < WEIGHTS_TOLERANCE


def test_distillation_under_torchrun_rolls_out_on_rank_zero_and_learns_on_every_rank(tiny_dir, teacher_dir, store, tmp_path):
    """The whole job: rank 0's in-process stack runs the episodes with a copy of the sharded
    student (refreshed after each update), both ranks learn their share, rank 0 stores and registers."""
    out = tmp_path / "out"
    prompts = [{"query": f"What is {a}*{b}?", "mode": mode} for (a, b), mode in zip(PRODUCTS, ["instant", "agentic"] * 3)]
    config = base_config(tiny_dir, out, store_addr=store.address, default_teacher=str(teacher_dir), prompts=prompts, batch_size=4,
                         rollout={"max_tokens_per_turn": 12, "max_steps": 1, "temperature": 0.0}, optim={"max_steps": 2})
    done = launch(2, "-m", "gearshift.cli", "train", "distill", "--config", str(write_config(tmp_path / "distill.json", config)))
    assert done.returncode == 0, first_error(done.stderr)
    history = metrics(out)
    assert [r["step"] for r in history] == [1, 2] and all(r["updated"] and r["sampled_tokens"] > 0 for r in history)
    result = json.loads((out / "result.json").read_text())
    assert len(result["trajectory_ids"]) == 8  # 4 episodes a step, run once (on rank 0), not once per rank
    assert sorted(t.id for t in store.export(run_id=f"distill-{result['checkpoint_id']}")) == result["trajectory_ids"]
    assert store.checkpoint(result["checkpoint_id"]).job == "distill"


def test_lora_in_bf16_under_fsdp_learns_what_one_process_learns(worker_runs):
    """The GPU default for LoRA on gloo: a bf16 base and float32 adapters in one FSDP group."""
    one, two = worker_runs[1]["lora-bf16"], worker_runs[2]["lora-bf16"]
    assert two["losses"] == pytest.approx(one["losses"], rel=1e-2)  # bf16 rounding differs with the split
    assert one["losses"][-1] < one["losses"][0]
    assert {v.dtype for k, v in torch.load(two["weights"]).items() if "lora_" not in k} == {torch.bfloat16}


def out_dir(run: dict) -> Path:
    return Path(run["weights"]).parent / "out"


@pytest.mark.parametrize("job, ranks, layout", [("sft", 2, ""), ("apo", 2, ""), ("distill", 2, ""), ("sft", 2, "-ep2"),
                                                ("distill", 2, "-ep2"), ("distill", 4, "-ep2x2"),
                                                ("sft", 2, "-cp2"), ("apo", 2, "-cp2"), ("distill", 2, "-cp2"), ("sft", 2, "-cp2-ep2"),
                                                ("sft", 4, "-cp2x2-ep2")])
def test_a_moe_trains_on_several_ranks_as_in_one_process_with_its_balancing_loss(worker_runs, job, ranks, layout):
    """The tiny Qwen3-MoE sharded by FSDP, with its experts spread over 2 ranks (expert
    parallelism) on 2 ranks and on a 2 x 2 mesh, or each micro-batch's tokens split over 2 ranks
    (context parallelism), alone, with expert parallelism and beside 2 data ranks: the same losses
    (the balancing loss in them), gradients (weights after the steps), per-expert counts and
    exported files as one process."""
    one, two = worker_runs[1][f"moe-{job}"], worker_runs[ranks][f"moe-{job}{layout}"]
    assert_same_run(one, two)
    if job == "sft":  # the job whose worker run exports (the others run their learn() alone)
        exported = [load_file(out_dir(run) / "model.safetensors") for run in (one, two)]
        assert "model.layers.1.mlp.experts.3.down_proj.weight" in exported[1]  # the checkpoint layout: a matrix per expert
        assert max_difference(*exported) < WEIGHTS_TOLERANCE
    alone, many = metrics(out_dir(one)), metrics(out_dir(two))
    assert [r["expert_tokens"] for r in many] == [r["expert_tokens"] for r in alone]
    assert [r["balance_loss"] for r in many] == pytest.approx([r["balance_loss"] for r in alone], rel=1e-5)
    counts = alone[0]["expert_tokens"]
    assert len(counts) == 2 and all(len(layer) == 4 for layer in counts)  # per layer, per expert
    assert len({sum(layer) for layer in counts}) == 1 and sum(counts[0]) > 0  # every token counted twice (top-2) in each layer


def test_the_balancing_loss_trains_the_routers(worker_runs):
    """With router_aux_loss_coef at 0 the routers learn otherwise: the loss is in their gradient."""
    balanced, unbalanced = (torch.load(worker_runs[1][name]["weights"]) for name in ("moe-sft", "moe-sft-unbalanced"))
    routers = [name for name in balanced if name.endswith("mlp.gate.weight")]
    assert routers and all(not torch.equal(balanced[name], unbalanced[name]) for name in routers)
    assert metrics(out_dir(worker_runs[1]["moe-sft"]))[0]["balance_loss"] > 0


def test_lora_on_a_moe_exports_an_adapter_the_built_in_server_loads(worker_runs, tmp_path):
    """LoRA on the attention of the tiny MoE: the adapter peft wrote loads in the built-in server's
    loader (weights.load folds it into its base) and answers the merged export's greedy tokens."""
    from gearshift import weights
    from transformers import AutoModelForCausalLM

    out = out_dir(worker_runs[1]["moe-lora"])
    served = weights.load(str(out / "adapter"), tmp_path)
    merged = AutoModelForCausalLM.from_pretrained(out, local_files_only=True, dtype=torch.float32)
    prompt = served.tokenizer("What is 12*34?", return_tensors="pt").input_ids
    tokens = [model.generate(prompt, max_new_tokens=12, do_sample=False)[0].tolist() for model in (served.model, merged)]
    assert tokens[0] == tokens[1]
    assert max_difference(served.model.state_dict(), merged.state_dict()) < 1e-5


def test_a_moe_loaded_with_its_experts_spread_over_two_ranks_exports_its_files(worker_runs, moe_dir):
    """Each rank read its own experts (and its FSDP shard of the rest); the export gathers them
    back to the checkpoint's tensors, unchanged; the loaded state is from_pretrained's."""
    from gearshift.training.loading import SafetensorsDirectory
    from transformers import AutoModelForCausalLM

    run = worker_runs[2]["moe-export-ep2"]
    source, exported = SafetensorsDirectory(moe_dir), SafetensorsDirectory(out_dir(run))
    assert exported.entries.keys() == source.entries.keys()
    assert all(torch.equal(exported.rows(name), source.rows(name)) for name in source.entries)
    reference = AutoModelForCausalLM.from_pretrained(moe_dir, local_files_only=True, dtype=torch.float32).state_dict()
    assert max_difference(torch.load(run["weights"]), reference) == 0


async def test_an_exported_moe_answers_transformers_greedy_tokens_on_the_builtin_server_and_vllm(worker_runs, tmp_path):
    """The checkpoint SFT exported after training with its experts spread over 2 ranks, served."""
    from tests.jobs.greedy import transformers_and_builtin_greedy
    from tests.vllm_servers import VLLM_PYTHON, vllm_environment

    out, prompt, count = out_dir(worker_runs[2]["moe-sft-ep2"]), "What is 12*34?", 12
    expected, served = await transformers_and_builtin_greedy(out, tmp_path, prompt, count)
    assert served == expected
    vllm = subprocess.run([str(VLLM_PYTHON), str(Path(__file__).with_name("vllm_greedy.py")), str(out), prompt, str(count)],
                          capture_output=True, text=True, timeout=300, env=vllm_environment(0))
    assert vllm.returncode == 0, (vllm.stdout + vllm.stderr)[-3000:]
    (tokens,) = [line.removeprefix("TOKENS ") for line in vllm.stdout.splitlines() if line.startswith("TOKENS ")]
    assert json.loads(tokens) == expected
