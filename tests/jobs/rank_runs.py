"""The trainer-rank tests' launches and comparisons (test_distributed, test_tensor_parallel,
test_layout, and the modules that launch ranks of their own).

A rank spends 6 to 7 CPU-s importing torch and transformers before any work, more than most
cases' steps. So every worker case of those three modules runs in one launch per number of ranks
(tests/jobs/ranks_worker.py; the `worker_runs` fixture of tests/jobs/conftest.py), each case
seeded from its own config, on ranks forked from a server that imported them once
(fork_cases); torchrun launches (run_cases, launch) are for what tests torchrun itself. A case
is (job, config, data): the data are what the platform produced, pickled once
(tests/jobs/conftest.py: ranks_data)."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from gearshift.protocol.sr2am import PLAN_HEAD

WORKER = Path(__file__).with_name("ranks_worker.py")
ROOT = Path(__file__).parents[2]
PRODUCTS = [(12, 34), (7, 8), (123, 45), (5, 6), (81, 27), (1234, 56)]
# Reduction order differs between 2 ranks and 1 process, and between CPUs: DDP distillation on
# one AMD EPYC (stop 47) ended 1.22e-5 apart after 3 AdamW steps at lr 1e-3, whose normalised
# updates amplify float32 noise on near-zero gradients; ranks that diverge differ by ~lr.
WEIGHTS_TOLERANCE = 2e-5
# The launches' order: tensor parallelism's 2-rank case resumes what its 4-rank launch saved, and
# test_distributed's 2-rank case what its 1-rank launch saved.
RANKS = (1, 4, 2)

Case = tuple[str, dict, Path]  # job (a ranks_worker job name), config, data


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


def sft_config(tiny_dir, out: Path, store=None, **extra) -> dict:
    """SFT on the stored episodes; without store, for the worker, which is given them."""
    data = {"task_source": "ranks", "correctness": "correct"}
    return base_config(tiny_dir, out, store_addr=store.address if store else "", data=data, batch_size=6, **extra)


def listed(cases: dict[str, Case], folder: Path, **extra) -> Path:
    """The cases' configs and their listing (CASES.json of tests/jobs/ranks_worker.py) in folder."""
    listing = []
    for name, (job, config, data) in cases.items():
        (folder / name).mkdir(parents=True, exist_ok=True)
        config_path = write_config(folder / name / "config.json", config)
        listing.append({"job": job, "config": str(config_path), "data": str(data), "out": str(folder / name / "out.json"), **extra})
    return write_config(folder / "cases.json", listing)


def outcomes(cases: dict[str, Case], folder: Path) -> dict[str, dict]:
    return {name: json.loads((folder / name / "out.json").read_text()) for name in cases}


def run_cases(ranks: int, cases: dict[str, Case], folder: Path, **extra) -> dict[str, dict]:
    """Worker cases, name: (job, config, data), one after another in one torchrun launch; each
    case's losses and final weights."""
    done = launch(ranks, str(WORKER), str(listed(cases, folder, **extra)))
    (folder / "stderr.txt").write_text(done.stderr)
    assert done.returncode == 0, first_error(done.stderr)
    return outcomes(cases, folder)


def fork_cases(ranks: int, cases: dict[str, Case], folder: Path) -> dict[str, dict]:
    """run_cases' cases on ranks forked from tests/rank_processes.py's server, which imported torch,
    transformers and the trainers once, where torchrun's ranks import them again (6 to 7 CPU-s
    each): the same process group, by the same environment variables."""
    from tests.jobs import ranks_worker
    from tests.rank_processes import run_ranks

    run_ranks(ranks, ranks_worker.run_all, json.loads(listed(cases, folder).read_text()))
    return outcomes(cases, folder)


def run_worker(ranks: int, job: str, config: dict, data: Path, folder: Path) -> dict:
    return fork_cases(ranks, {"run": (job, config, data)}, folder)["run"]


def metrics(out: Path) -> list[dict]:
    return [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]


def out_dir(run: dict) -> Path:
    return Path(run["weights"]).parent / "out"


def max_difference(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> float:
    assert a.keys() == b.keys()
    return max(float((a[key].float() - b[key].float()).abs().max()) for key in a)


def assert_same_run(one: dict, many: dict) -> None:
    assert many["losses"] == pytest.approx(one["losses"], rel=1e-5, abs=1e-7)
    assert max_difference(torch.load(one["weights"]), torch.load(many["weights"])) < WEIGHTS_TOLERANCE


# --- The cases, by the module whose tests read them ---

ON_POLICY = {
    "apo": {"rho": 1, "gamma": 1, "updates_per_batch": 2, "kl_coef": 0.05, "prompts": [{"query": "q", "reference_answer": "a"}],
            "rollout": {"exact_tokens": False}},
    "distill": {"top_k": 64, "prompts": [{"query": "q"}], "rollout": {"exact_tokens": False}},
}
PARALLELISMS = [("fsdp", False), ("ddp", False), ("fsdp", True)]  # (parallelism, lora) of the 2-rank on-policy runs
ATTENTION = ["q_proj", "k_proj", "v_proj", "o_proj"]


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
    import pickle

    if not (job == "distill" and lora):
        return rollouts / f"{job}.pkl"
    _, episodes = pickle.loads((rollouts / "distill.pkl").read_bytes())
    owners = [str(tiny_dir) if index % 2 else str(teacher_dir) for index in range(len(episodes))]
    path = rollouts / "distill-base.pkl"
    path.write_bytes(pickle.dumps((owners, episodes)))
    return path


def distributed_cases(tiny_dir, teacher_dir, rollouts: Path, sft_trajectories: Path, folder: Path) -> dict[int, dict[str, Case]]:
    """test_distributed's dense cases: APO and distillation at 1 rank and at 2 (FSDP, DDP, LoRA
    under FSDP), SFT normalised per rank (the mistake), LoRA on a bf16 base, and a state saved at
    1 rank ("saved") that 2 resume ("resumed")."""
    def out(ranks: int, name: str) -> Path:
        return folder / str(ranks) / name / "out"

    cases: dict[int, dict[str, Case]] = {1: {}, 2: {}}
    for job in ON_POLICY:
        for lora in (False, True):
            name = f"{job}-lora-{lora}"
            cases[1][name] = job, on_policy_config(job, tiny_dir, teacher_dir, out(1, name), "fsdp", lora), \
                on_policy_data(job, rollouts, tiny_dir, teacher_dir, lora)
        for parallelism, lora in PARALLELISMS:
            name = f"{job}-{parallelism}-lora-{lora}"
            cases[2][name] = job, on_policy_config(job, tiny_dir, teacher_dir, out(2, name), parallelism, lora), \
                on_policy_data(job, rollouts, tiny_dir, teacher_dir, lora)
    cases[2]["sft-per-rank"] = "sft-per-rank", sft_config(tiny_dir, out(2, "sft-per-rank")), sft_trajectories
    for ranks in (1, 2):  # the GPU default for LoRA on gloo: a bf16 base and float32 adapters in one FSDP group
        config = sft_config(tiny_dir, out(ranks, "lora-bf16"), model={"lora": True, "lora_rank": 4}, runtime={"precision": "bf16"},
                            optim={"learning_rate": 1e-2})
        cases[ranks]["lora-bf16"] = "sft", config, sft_trajectories
    cases[1]["saved"] = "sft", sft_config(tiny_dir, folder / "saved", optim={"max_steps": 2}), sft_trajectories
    cases[2]["resumed"] = "sft", sft_config(tiny_dir, folder / "saved"), sft_trajectories
    return cases


def moe_cases(moe_dir, unbalanced_dir, teacher_dir, rollouts: Path, sft_trajectories: Path, folder: Path) -> dict[int, dict[str, Case]]:
    """test_distributed's cases on the tiny MoE (its balancing loss in the objective): at 1 rank and
    sharded by FSDP on 2; SFT and distillation with expert parallelism on 2 and 4; at 1 rank also
    SFT without the balancing loss and with LoRA on the attention; and an export of the weights as
    loaded."""
    def trainer(ranks: int, job: str, name: str, **extra) -> Case:
        out = folder / str(ranks) / name / "out"
        if job == "sft":
            return "sft", sft_config(moe_dir, out, **extra), sft_trajectories
        config = on_policy_config(job, moe_dir, teacher_dir, out, "fsdp", False)
        config["runtime"].update(extra.get("runtime", {}))
        return job, config, rollouts / f"{job}.pkl"

    expert, context = {"expert_parallel": 2}, {"context_parallel": 2}
    cases: dict[int, dict[str, Case]] = {1: {}, 2: {}, 4: {}}
    for ranks in (1, 2):
        cases[ranks].update({f"moe-{job}": trainer(ranks, job, f"moe-{job}") for job in ("sft", "apo", "distill")})
    lora = {"lora": True, "lora_rank": 4, "lora_target_modules": ATTENTION}
    cases[1]["moe-sft-unbalanced"] = "sft", sft_config(unbalanced_dir, folder / "1" / "moe-sft-unbalanced" / "out"), sft_trajectories
    cases[1]["moe-lora"] = trainer(1, "sft", "moe-lora", model=lora, optim={"learning_rate": 1e-2})
    # experts over the 2 ranks; each micro-batch's tokens split over them, alone and with the experts split
    cases[2].update({f"moe-{job}-ep2": trainer(2, job, f"moe-{job}-ep2", runtime=expert) for job in ("sft", "distill")})
    cases[2].update({f"moe-{job}-cp2": trainer(2, job, f"moe-{job}-cp2", runtime=context) for job in ("sft", "apo", "distill")})
    cases[2]["moe-sft-cp2-ep2"] = trainer(2, "sft", "moe-sft-cp2-ep2", runtime=context | expert)
    cases[2]["moe-export-ep2"] = "export", sft_config(moe_dir, folder / "2" / "moe-export-ep2" / "out", runtime=expert), sft_trajectories
    # 2 data x 2 expert; and 2 data x 2 context, experts over each context pair (SFT's data x expert
    # case: 4 ranks on 2 cores are the suite's slowest launch, so SFT runs only the mesh that adds context)
    cases[4]["moe-distill-ep2x2"] = trainer(4, "distill", "moe-distill-ep2x2", runtime=expert)
    cases[4]["moe-sft-cp2x2-ep2"] = trainer(4, "sft", "moe-sft-cp2x2-ep2", runtime=context | expert)
    return cases


TENSOR_2X2 = {"tensor_parallel": 2}  # on 4 ranks: 2 FSDP shards x 2 tensor ranks


def tensor_parallel_cases(tiny_dir, qwen3_dir, sft_trajectories: Path, folder: Path) -> dict[int, dict[str, Case]]:
    """test_tensor_parallel's: SFT in one process ("tp-llama", "tp-qwen3"); on 4 ranks with tensor
    parallelism 2, SFT ("tp-llama-tp", "tp-qwen3-tp"), the loaded weights exported ("tp-export"),
    and 2 steps whose resume state "tp-resumed" continues on 2 ranks under plain FSDP to the third;
    and tensor and context parallelism together ("tp-llama-tp-cp": 2 x 2, each packed
    micro-batch's tokens split over the 2 ranks of a context pair, their heads over a tensor pair)."""
    models = {"llama": tiny_dir, "qwen3": qwen3_dir}
    saved = folder / "tp-saved-state"

    def case(ranks: int, name: str, model: str = "llama", **extra) -> Case:
        return "sft", sft_config(models[model], folder / str(ranks) / name / "out", **extra), sft_trajectories

    parallel = {f"tp-{model}-tp": case(4, f"tp-{model}-tp", model, runtime=TENSOR_2X2) for model in models}
    parallel["tp-llama-tp-cp"] = case(4, "tp-llama-tp-cp", runtime={"tensor_parallel": 2, "context_parallel": 2})
    parallel["tp-export"] = ("export", *case(4, "tp-export", runtime=TENSOR_2X2)[1:])
    parallel["tp-saved"] = "sft", sft_config(tiny_dir, saved, runtime=TENSOR_2X2, optim={"max_steps": 2}), sft_trajectories
    return {1: {f"tp-{model}": case(1, f"tp-{model}", model) for model in models}, 4: parallel,
            2: {"tp-resumed": ("sft", sft_config(tiny_dir, saved), sft_trajectories)}}


LAYOUTS = {1: {"eager": {}, "compiled": {"compile": True, "compile_backend": "aot_eager"}},
           2: {"1x2": {"mesh_shape": [1, 2]}, "2x1": {"mesh_shape": [2, 1]}}}


def layout_cases(tiny_dir, folder: Path) -> dict[int, dict[str, Case]]:
    """test_layout's: two SFT steps on the tiny model in each layout ("layout-eager",
    "layout-compiled" at 1 rank; "layout-1x2", "layout-2x1" on 2), on two of the executor's
    trajectory shapes."""
    import pickle

    from tests.libs.training.trajectories import forced_agentic, routed_instant

    trajectories = folder / "layout-trajectories.pkl"
    trajectories.write_bytes(pickle.dumps([routed_instant(), forced_agentic()]))

    def case(ranks: int, name: str, runtime: dict) -> Case:
        body = {"model": {"base": str(tiny_dir)}, "optim": {"learning_rate": 1e-3, "max_steps": 2, "seed": 3, "threads": 1},
                "runtime": runtime, "output": {"dir": str(folder / str(ranks) / name / "out"), "progress": False}, "batch_size": 4}
        return "sft", body, trajectories

    return {ranks: {f"layout-{name}": case(ranks, f"layout-{name}", runtime) for name, runtime in named.items()}
            for ranks, named in LAYOUTS.items()}
