"""`gearshift teach`: teachers solve a suite's training items through the real executor,
sandbox and reward service, and their trajectories land in the store as training data
(purpose TRAINING, model_version = the teacher's name, the suite's verdicts kept).

A teacher is any OpenAI-compatible policy chosen per domain (and optionally per mode): an
endpoint (in production a large model on vLLM), a model the built-in server loads here
(sampled several times per item at a temperature: rejection sampling, as SFT keeps only
correct trajectories), or the rule-based solvers of gearshift.teaching.solvers. Runs are named
per teacher and resumable like `gearshift eval`; held-out (test) items never reach a teacher.

    teachers.yaml:
      teachers:
        - {name: solvers, kind: solvers, domains: [arithmetic, word_problems]}
        - {name: smollm2-sampled, kind: model, model: smollm2, temperature: 0.8, samples: 4, domains: [facts]}
        - {name: big, kind: endpoint, url: "http://vllm:8000/v1", model: qwen3-32b, domains: ["*"]}
"""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, model_validator

from gearshift.api.common.v1.common_pb2 import Purpose, Sampling
from gearshift.embedded import embedded
from gearshift.evaluation.harness import Evaluation, evaluate
from gearshift.evaluation.suites import SuiteItem, get_suite
from gearshift.protocol.modes import ModeName
from gearshift.sampling import SEEDS
from gearshift.settings import Settings
from gearshift.teaching.endpoint import serve_function
from gearshift.teaching.solvers import SolverTeacher

POLICY_CALLERS = ("planner", "router", "executor")  # what a teacher replaces; store, sandbox and reward are shared


class Teacher(BaseModel):
    """One teacher and the items it takes."""

    model_config = ConfigDict(extra="forbid")

    name: str = Field(..., description="Its name; stored as the model_version of its trajectories")
    kind: Literal["endpoint", "model", "solvers"] = Field(..., description="An OpenAI-compatible URL, weights served here, or the rule-based solvers")
    url: str = Field("", description="endpoint: the server's base URL (…/v1)")
    model: str = Field("", description='endpoint: the model name to send; model: the weights ("smollm2" or a checkpoint directory)')
    domains: list[str] = Field(default_factory=lambda: ["*"], description='Item domains it teaches ("*": every domain)')
    modes: list[ModeName] = Field(default_factory=list, description="Modes it teaches (empty: every mode asked for)")
    samples: int = Field(1, ge=1, description="Episodes per item and mode (rejection sampling: SFT keeps the correct ones)")
    temperature: float = Field(0.0, ge=0, description="Sampling temperature of every model call (0: greedy)")
    seed: int = Field(0, ge=0, lt=SEEDS, description="Seed of a sampling teacher (each episode's own derived from it): the same episodes every time")

    @model_validator(mode="after")
    def _complete(self) -> Teacher:
        if self.kind == "endpoint" and not (self.url and self.model):
            raise ValueError(f"teacher {self.name}: an endpoint needs url and model")
        if self.kind == "model" and not self.model:
            raise ValueError(f"teacher {self.name}: kind model needs model (the weights to serve)")
        return self

    def teaches(self, item: SuiteItem, mode: str) -> bool:
        return ("*" in self.domains or item.domain in self.domains) and (not self.modes or mode in self.modes)


class TeachersConfig(BaseModel):
    model_config = ConfigDict(extra="forbid")

    teachers: list[Teacher] = Field(..., min_length=1, description="In order: an item and mode go to the first teacher that teaches them")

    @classmethod
    def from_file(cls, path: str | Path) -> TeachersConfig:
        return cls.model_validate(yaml.safe_load(Path(path).read_text()) or {})


def assign(config: TeachersConfig, items: list[SuiteItem], modes: list[str]) -> dict[str, dict[str, list[SuiteItem]]]:
    """teacher name -> mode -> the items it teaches in that mode."""
    plan: dict[str, dict[str, list[SuiteItem]]] = {}
    for item in items:
        for mode in modes:
            teacher = next((t for t in config.teachers if t.teaches(item, mode)), None)
            if teacher is not None:
                plan.setdefault(teacher.name, {}).setdefault(mode, []).append(item)
    return plan


@contextlib.asynccontextmanager
async def teaching(settings: Settings, teacher: Teacher, items: list[SuiteItem]) -> AsyncIterator[Settings]:
    """Settings whose planner, router and executor call the teacher (started here)."""
    if teacher.kind == "model":
        server = settings.policy_server.model_copy(update={"served_model_name": teacher.name})
        async with embedded(settings.model_copy(update={"policy_server": server}), POLICY_CALLERS, policy_model=teacher.model) as platform:
            yield platform.settings
        return
    async with contextlib.AsyncExitStack() as stack:
        if teacher.kind == "solvers":
            url = await stack.enter_async_context(serve_function(SolverTeacher(items), teacher.name))
        else:
            url = teacher.url
        served = settings.with_policy(url, teacher.model if teacher.kind == "endpoint" else teacher.name)
        yield (await stack.enter_async_context(embedded(served, POLICY_CALLERS))).settings


async def teach(settings: Settings, suite_name: str, split: str, config: TeachersConfig, modes: list[str], n: int | None,
                run_id: str, concurrency: int = 4, console=None) -> dict[str, dict[str, Evaluation]]:
    """Runs every teacher on its items in each mode; returns teacher -> mode -> its evaluation.
    The run of teacher T in mode M is "{run_id}-{T}-{M}": run the same command again to resume."""
    if split == "test":
        raise ValueError("teachers write training data: the held-out test split never reaches them")
    suite = get_suite(suite_name)
    items = suite.items(split, n)
    if not items:
        raise ValueError(f"suite {suite.name!r} has no {split} items")
    plan = assign(config, items, modes)
    done: dict[str, dict[str, Evaluation]] = {}
    for teacher in config.teachers:
        if teacher.name not in plan:
            continue
        sampling = Sampling(temperature=teacher.temperature, top_p=1.0, seed=teacher.seed) if teacher.temperature else None
        async with teaching(settings, teacher, items) as served:
            for mode, chosen in plan[teacher.name].items():
                done.setdefault(teacher.name, {})[mode] = await evaluate(
                    served, suite_name, [mode], None, samples=teacher.samples, split=split, run_id=f"{run_id}-{teacher.name}-{mode}",
                    concurrency=concurrency, console=console, purpose=Purpose.PURPOSE_TRAINING, sampling=sampling, items=chosen,
                    out_dir=settings.data_dir / "teach" / run_id / f"{teacher.name}-{mode}",
                )
    return done
