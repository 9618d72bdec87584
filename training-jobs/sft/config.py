"""SFT job configuration (no torch import)."""

from __future__ import annotations

from gearshift.training.config import DataConfig, PolicyJobConfig
from pydantic import Field


class SFTConfig(PolicyJobConfig):
    """Route-then-align supervised fine-tuning on correct stored trajectories."""

    data: DataConfig = Field(
        default_factory=lambda: DataConfig(correctness="correct"),
        description="Which stored trajectories to learn from (incorrect ones are dropped in any case)",
    )
    require_format_valid: bool = Field(True, description="Keep only trajectories that followed their mode's format (the policy learns the protocol, not only the answer)")
    batch_size: int = Field(4, ge=1, description="Trajectories per optimizer step")
    max_length: int = Field(2048, ge=16, description="Tokens kept per trajectory (prompt included); the rest is cut")
    balance_difficulty: bool = Field(
        True, description='Re-sample so every difficulty level (labels["difficulty"]) is drawn equally often'
    )
    difficulty_weights: dict[str, float] = Field(
        default_factory=dict, description="Extra sampling weight per difficulty label (1.0 when absent), applied after balancing"
    )
