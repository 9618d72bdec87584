"""APO job configuration (no torch import)."""

from __future__ import annotations

from typing import Literal

from gearshift.training.config import DataConfig, PolicyJobConfig, Strict
from pydantic import Field


class APOPrompt(Strict):
    """One training prompt with its reference answer."""

    query: str = Field(..., description="The user query")
    reference_answer: str = Field(..., description="The answer the reward service checks against")
    labels: dict[str, str] = Field(default_factory=dict, description="Labels copied onto the rollouts (domain, difficulty, ...)")


class RolloutConfig(Strict):
    """How rollouts are produced: through the executor, as in serving."""

    executor_addr: str = Field(
        "", description="A running executor (its policy server is reloaded after each update via /v1/load); empty: an in-process stack serving the training weights"
    )
    policy_url: str = Field("", description="The running executor's policy server (for /v1/load); empty: GEARSHIFT_POLICY_CLIENT__URL")
    temperature: float = Field(1.0, ge=0, description="Sampling temperature of the in-process stack (A^2FM: 1.0)")
    top_p: float = Field(1.0, gt=0, le=1, description="Nucleus sampling mass of the in-process stack")
    max_tokens_per_turn: int = Field(128, ge=8, description="Tokens per policy turn in the in-process stack")
    max_steps: int = Field(0, ge=0, description="Turn budget per rollout (0: the mode's default)")
    concurrency: int = Field(12, ge=1, description="Rollouts in flight at once")


class APOConfig(PolicyJobConfig):
    """GRPO with adaptive sampling: per prompt rho forced rollouts per mode plus gamma free ones."""

    prompts: list[APOPrompt] = Field(default_factory=list, description="Training prompts given inline")
    data: DataConfig | None = Field(None, description="Also take prompts (query, reference) from stored trajectories; needs store_addr")
    rho: int = Field(3, ge=0, description="Forced rollouts per mode per prompt (prefix injection)")
    gamma: int = Field(3, ge=0, description="Free rollouts per prompt (the model routes itself)")
    prompts_per_step: int = Field(1, ge=1, description="Prompts (groups) per optimizer step")
    reward: Literal["apo", "sr2am"] = Field("apo", description="Reward formula of the reward service: APO (A^2FM) or SR2AM's tiered structure reward")
    eps_low: float = Field(0.2, ge=0, description="Clip ratio below 1 - eps_low for negative advantages")
    eps_high: float = Field(0.28, ge=0, description="Clip ratio above 1 + eps_high for positive advantages (clip-higher)")
    kl_coef: float = Field(0.0, ge=0, description="Weight of the KL to the reference policy (0: none, as APO reports)")
    reference: str = Field("", description="Reference policy for the KL (default: the starting weights)")
    updates_per_batch: int = Field(1, ge=1, description="Optimizer steps on each rollout batch (1: strictly on-policy)")
    max_length: int = Field(4096, ge=16, description="Tokens kept per rollout (prompt included)")
    task_source: str = Field("apo", description="task_source of the stored rollouts")
    rollout: RolloutConfig = Field(default_factory=RolloutConfig, description="Where and how rollouts run")

    @property
    def group_size(self) -> int:
        return 3 * self.rho + self.gamma
