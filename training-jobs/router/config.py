"""The router training job's configuration (no torch import: cheap to load anywhere)."""

from __future__ import annotations

from typing import Literal

from gearshift.training.config import JobConfig
from pydantic import Field, model_validator


class RouterConfig(JobConfig):
    """What the router learns from (the store's forced-mode outcomes), how, and where the artefact
    goes (output.dir; output.checkpoint_id names the version)."""

    task_source: str = Field("", description="Only trajectories of this suite (task_source); empty = every suite")
    run_ids: list[str] = Field(default_factory=list, description="Only these evaluation runs; empty = every run")
    model_version: str = Field("", description="Only trajectories of this policy checkpoint; empty = any")
    train_splits: list[str] = Field(default_factory=lambda: ["train"], description="Splits whose items the classifiers learn from")
    eval_split: str = Field(
        "dev", description="Split of held-out items for the offline evaluation; empty = hold out a share of the training items"
    )
    holdout_fraction: float = Field(
        0.2, gt=0, lt=1, description="Share of training items held out (by a hash of the item id) when the eval split has no items"
    )
    # static by default: p99 0.21 ms per decision against MiniLM's 15 ms (goal 2 ms), with the same
    # offline routing quality in the one measurement so far (docs/results/benchmarks.md).
    embedding: Literal["minilm", "static", "none"] = Field(
        "static",
        description="Query embedding: minilm (full all-MiniLM-L6-v2, milliseconds), static (its token embeddings averaged, "
        "microseconds, no torch) or none (lexical features only)",
    )
    max_tokens: int = Field(128, ge=8, description="Word pieces of a query kept for the embedding")
    l2: float = Field(1.0, ge=0, description="L2 penalty of each mode's logistic regression (on standardised features)")
    max_iterations: int = Field(50, ge=1, description="Most Newton steps per classifier")
    cost_l2: float = Field(1.0, ge=0, description="L2 penalty of each mode's cost regression (ridge, on standardised features)")
    accuracy_floor: float = Field(
        0.5, ge=0, le=1, description="Accuracy floor of the pass value learned and of the offline evaluation (serving uses "
        "GEARSHIFT_LEARNED_ROUTER__ACCURACY_FLOOR; keep them equal)"
    )
    min_items: int = Field(4, ge=1, description="Fewest training items with forced attempts; fewer is an error")
    bootstrap_samples: int = Field(1_000, ge=1, description="Bootstrap resamples for the cost-of-pass confidence intervals")

    @model_validator(mode="after")
    def _checked(self) -> RouterConfig:
        if not self.store_addr:
            raise ValueError("the router learns from stored outcomes: set store_addr")
        if not self.train_splits:
            raise ValueError("train_splits is empty")
        if self.eval_split and self.eval_split in self.train_splits:
            raise ValueError(f"eval_split {self.eval_split!r} is also a training split")
        return self
