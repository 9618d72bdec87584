"""APO job configuration (no torch import)."""

from __future__ import annotations

from typing import Literal

from gearshift.training.config import ConversationConfig, DataConfig, PolicyJobConfig, RolloutConfig, Strict
from pydantic import Field, model_validator


class APOPrompt(Strict):
    """One training prompt with its reference answer."""

    query: str = Field(..., description="The user query")
    reference_answer: str = Field(..., description="The answer the reward service checks against")
    labels: dict[str, str] = Field(default_factory=dict, description="Labels copied onto the rollouts (domain, difficulty, item_id, ...)")
    suite: str = Field("", description="The evaluation suite the prompt comes from (labels item_id names the item): its grader decides correctness, as in evaluation; empty: the reward service's verifier")
    conversation: ConversationConfig | None = Field(
        None, description="The conversation around the query (the client's instructions, earlier turns), as served: every rollout sees it; none: the query stands alone"
    )

    @model_validator(mode="after")
    def _suite_names_its_item(self) -> APOPrompt:
        if self.suite and "item_id" not in self.labels:
            raise ValueError("a prompt graded by its suite needs labels.item_id")
        return self


class APOConfig(PolicyJobConfig):
    """GRPO with adaptive sampling: per prompt rho forced rollouts per mode plus gamma free ones."""

    prompts: list[APOPrompt] = Field(default_factory=list, description="Training prompts given inline")
    data: DataConfig | None = Field(
        None, description="Also take prompts (query, conversation, reference) from stored trajectories; needs store_addr. The reference is the stored reference answer, else the answer of a served trajectory a client judged correct (feedback)"
    )
    rho: int = Field(3, ge=0, description="Forced rollouts per mode per prompt (prefix injection)")
    gamma: int = Field(3, ge=0, description="Free rollouts per prompt (the model routes itself)")
    prompts_per_step: int = Field(1, ge=1, description="Prompts (groups) per optimizer step")
    pass_rate_window: tuple[float, float] | None = Field(
        None, description="Keep only groups whose share of correct rollouts lies in [low, high] (SR2AM: [0.125, 0.75]); groups whose rewards are all equal are always dropped"
    )
    reward: Literal["apo", "sr2am"] = Field("apo", description="Reward formula of the reward service: APO (A^2FM) or SR2AM's tiered structure reward")
    eps_low: float = Field(0.2, ge=0, description="Clip ratio below 1 - eps_low for negative advantages")
    eps_high: float = Field(0.28, ge=0, description="Clip ratio above 1 + eps_high for positive advantages (clip-higher)")
    dual_clip: float = Field(3.0, description="A negative-advantage token's loss is bounded at dual_clip * |advantage| (dual-clip PPO): a stale token with a large ratio gets a bounded push; 0: off")
    kl_coef: float = Field(0.0, ge=0, description="Weight of the KL to the reference policy (0: none, as APO reports)")
    reference: str = Field("", description="Reference policy for the KL (default: the starting weights)")
    updates_per_batch: int = Field(1, ge=1, description="Optimizer steps on each rollout batch (1: strictly on-policy)")
    max_length: int | None = Field(None, ge=16, description="Tokens kept per rollout (prompt included); the rest is cut and counted (truncated_rollouts in metrics.jsonl). None: the policy's context (max_position_embeddings)")
    task_source: str = Field("apo", description="task_source of the stored rollouts")
    rollout: RolloutConfig = Field(default_factory=RolloutConfig, description="Where and how rollouts run")

    @property
    def group_size(self) -> int:
        return 3 * self.rho + self.gamma

    @model_validator(mode="after")
    def _dual_clip_above_one(self) -> APOConfig:
        if self.dual_clip and self.dual_clip <= 1:
            raise ValueError("dual_clip must be above 1 (3 is usual), or 0 for none")
        return self

    @model_validator(mode="after")
    def _apo_needs_forced_instant(self) -> APOConfig:
        if self.reward == "apo" and self.rho == 0:
            raise ValueError("the APO reward needs forced rollouts (rho >= 1): without forced-instant ones its p is undefined")
        if self.pass_rate_window and not 0 <= self.pass_rate_window[0] <= self.pass_rate_window[1] <= 1:
            raise ValueError("pass_rate_window must be (low, high) with 0 <= low <= high <= 1")
        return self
