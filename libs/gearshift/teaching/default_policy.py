"""The embedded default policy, trained by the platform itself: teachers solve training items of
the families it should master (gearshift teach), route-then-align SFT fits a small LoRA adapter
on SmolLM2-135M to the correct, well-formed teacher trajectories, and the adapter is registered
with its lineage and shipped in gearshift/default_policy/ with its model card, so a fresh
install serves it (model "default") without training.

    gearshift default-policy build          # from the recipe below, seeded: same data, same adapter

The teachers run here on the CPU: the rule-based solvers for the generated families, and
SmolLM2 itself sampled several times per fact (kept where correct and well-formed). Each
curriculum family is taught in every mode its need allows, so the cheapest correct one (the
learned route) says "a tool when the answer is computed, reasoning when it is derived, instant
when it is known", and every family is taught agentic too, so the tool protocol is learned as a
protocol. chain_sum and the generalisation set are deliberately left out: families the default
policy never saw, to measure it on.
"""

from __future__ import annotations

import asyncio
import json
import time
from pathlib import Path

from pydantic import BaseModel, Field
from rich.console import Console

from gearshift import code_version, weights
from gearshift.embedded import embedded
from gearshift.evaluation import curriculum
from gearshift.orchestration import task_bodies
from gearshift.orchestration.runners import LocalRunner
from gearshift.settings import ExecutorSettings, Settings
from gearshift.teaching.teach import TeachersConfig, teach

TEACHERS = {
    "teachers": [
        {"name": "solvers", "kind": "solvers"},
        {"name": "smollm2-sampled", "kind": "model", "model": "smollm2", "temperature": 0.7, "samples": 3},
    ]
}


class Family(BaseModel):
    suite: str
    items: int | None = Field(None, description="Train items taught (None: all)")
    modes: list[str] = Field(..., description="The modes its teacher solves it in; the cheapest correct one is the learned route")
    teacher: str = Field(..., description="The teacher (of `teachers`) that teaches it")


# The modes a teacher writes for each need: the cheapest is the route, agentic always (the protocol).
# A known answer is taught in reasoning too: forced reasoning that had seen arithmetic alone wrote
# an agentic plan for a question in words once facts were taught agentic.
NEED_MODES = {"computed": ["agentic"], "derived": ["reasoning", "agentic"], "known": ["instant", "reasoning", "agentic"]}


class Recipe(BaseModel):
    """Everything that decides the default policy; with the data it taught, it names the
    training run (run_key)."""

    families: list[Family] = [
        Family(suite="large_multiplication", items=80, modes=["agentic"], teacher="solvers"),
        Family(suite="gsm_symbolic", items=80, modes=["reasoning", "agentic"], teacher="solvers"),
        Family(suite="basic_arithmetic", items=60, modes=["reasoning", "agentic"], teacher="solvers"),
        # Facts: SmolLM2's own answers where a sample is right (rejection sampling), and the
        # table's answer for train facts (the format is what is learned; a fact it does not
        # know stays unknown).
        Family(suite="facts", items=40, modes=["instant"], teacher="smollm2-sampled"),
        Family(suite="facts", items=150, modes=NEED_MODES["known"], teacher="solvers"),
        # One-step word problems more often: the commonest derived questions. With 48 of them the
        # reasoning mode solved 28% of held-out ones; with 160 (and fewer gsm_symbolic) 62%.
        # Computed families 40 each: with 16, "a tool" was the route of 240 items against
        # reasoning's 412, and computed questions of untaught families went to reasoning.
        *(Family(suite=name, items=160 if name == "word_problem" else 40 if need == "computed" else 16,
                 modes=NEED_MODES[need], teacher="solvers")
          for name, (need, _, _) in curriculum.TASKS.items()),
    ]
    teachers: dict = TEACHERS
    max_tokens_per_turn: int = 48  # a sampled fact that needs more is no instant answer; the solvers write whole turns
    sft: dict = {
        "model": {"base": "smollm2", "lora": True, "lora_rank": 8, "lora_alpha": 16},
        # About 1.2 passes over the ~1,960 kept trajectories: the format and the routes, not the facts.
        "optim": {"learning_rate": 5e-4, "max_steps": 295, "warmup_steps": 5, "schedule": "linear", "seed": 0, "threads": 2},
        "batch_size": 8,
        "max_length": 768,
        "balance_difficulty": False,
        "output": {"progress": False, "save_every": 25},
    }


def build(settings: Settings, recipe: Recipe, work_dir: Path, ship_to: Path = weights.DEFAULT_ADAPTER, console: Console | None = None) -> dict:
    """Teaches, trains, registers and ships; resumable (a rerun finds its stored episodes and
    its finished training run). Returns what the model card records."""
    return asyncio.run(_build(settings, recipe, work_dir, ship_to, console or Console(quiet=True)))


async def _build(settings: Settings, recipe: Recipe, work_dir: Path, ship_to: Path, console: Console) -> dict:
    started = time.perf_counter()
    work = settings.model_copy(update={
        "data_dir": work_dir, "database_url": None, "metrics_port": 0,
        "executor": ExecutorSettings(max_tokens_per_turn=recipe.max_tokens_per_turn),
    })
    teachers = {t["name"]: TeachersConfig.model_validate({"teachers": [t]}) for t in recipe.teachers["teachers"]}
    runner = LocalRunner(work_dir / "runs", env={"GEARSHIFT_DATA_DIR": str(work_dir)})
    card: dict = {"recipe": json.loads(recipe.model_dump_json()), "code_version": code_version(), "teachers": {}}
    async with embedded(work, ("store", "sandbox", "reward")) as platform:
        for family in recipe.families:
            console.rule(f"teach {family.suite} ({', '.join(family.modes)}) with {family.teacher}")
            done = await teach(platform.settings, family.suite, "train", teachers[family.teacher], family.modes, family.items,
                               f"default-{family.suite}", console=console)
            card["teachers"] |= {
                f"{family.suite}/{teacher}/{mode}": {"episodes": e.report.modes[mode].trajectories, "correct": e.report.modes[mode].correct}
                for teacher, by_mode in done.items() for mode, e in by_mode.items()
            }
        teach_seconds = time.perf_counter() - started
        console.rule("route-then-align SFT (LoRA)")
        data = {"correctness": "correct", "split": "train", "purposes": ["training"]}
        snapshot = await task_bodies.snapshot(platform.settings, data, content=True)
        spec = task_bodies.run_spec(platform.settings, "sft", recipe.sft, run_key(recipe, snapshot["content"]), data, None)
        external_id = runner.start(spec)
        result = await asyncio.to_thread(task_bodies.train, runner, spec, external_id, lambda _tail: None, 7 * 86_400)
    card |= {
        "checkpoint_id": result["checkpoint_id"], "snapshot": snapshot["snapshot"], "trajectories": snapshot["count"],
        "sft": {k: result["metrics"].get(k) for k in ("steps", "first_loss", "final_loss", "trajectories")},
        "teach_seconds": round(teach_seconds), "total_seconds": round(time.perf_counter() - started),
    }
    ship(Path(result["output_dir"]) / "adapter", ship_to, card)
    return card


def run_key(recipe: Recipe, content: str) -> str:
    """The SFT run's dedupe key, which names its checkpoint: the recipe and the content of the
    teaching data (its snapshot's `content`). A rerun on the same stored episodes resumes its
    run; new teaching data (a teacher changed, the recipe alike) trains and registers a
    checkpoint of its own."""
    return f"default-policy:{task_bodies.digest(recipe.model_dump(), content)}"


def ship(adapter: Path, target: Path, card: dict) -> None:
    """Copies the adapter (in half precision: a few MB) with its base named as a model source,
    and writes the model card."""
    import torch
    from safetensors.torch import load_file, save_file

    target.mkdir(parents=True, exist_ok=True)
    tensors = {name: tensor.to(torch.float16) for name, tensor in load_file(adapter / weights.ADAPTER_WEIGHTS).items()}
    save_file(tensors, target / weights.ADAPTER_WEIGHTS)
    config = json.loads((adapter / weights.ADAPTER_CONFIG).read_text()) | {"base_model_name_or_path": weights.SMOLLM2}
    (target / weights.ADAPTER_CONFIG).write_text(json.dumps(config, indent=2, sort_keys=True) + "\n")
    (target / "training.json").write_text(json.dumps(card, indent=2, sort_keys=True, default=str) + "\n")
