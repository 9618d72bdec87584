"""Distillation job configuration (no torch import)."""

from __future__ import annotations

from gearshift.protocol.modes import ModeName
from gearshift.training.config import ConversationConfig, DataConfig, PolicyJobConfig, RolloutConfig, Strict
from pydantic import Field


class Prompt(Strict):
    """One prompt the student samples on."""

    query: str = Field(..., description="The user query")
    domain: str = Field("", description="Domain naming the teacher (teachers map); empty: default_teacher")
    mode: ModeName | None = Field(None, description="Force this mode by prefix injection (masked); none: the student routes")
    conversation: ConversationConfig | None = Field(
        None, description="The conversation around the query (the client's instructions, earlier turns), as served; none: the query stands alone"
    )


class DistillConfig(PolicyJobConfig):
    """The student samples on the prompts; each prompt's teacher scores the student's own tokens."""

    prompts: list[Prompt] = Field(default_factory=list, description="Prompts given inline")
    data: DataConfig | None = Field(
        None, description='Also take prompts from stored trajectories (query, conversation, labels["domain"]); needs store_addr'
    )
    teachers: dict[str, str] = Field(
        default_factory=dict, description='Domain -> teacher checkpoint ("smollm2", "tiny" or a checkpoint directory)'
    )
    default_teacher: str = Field("", description="Teacher of prompts whose domain is not in teachers; empty: such prompts are an error")
    top_k: int | None = Field(None, ge=1, description="Align on the student's top-k tokens only; none: the full vocabulary")
    batch_size: int = Field(4, ge=1, description="Prompts per optimizer step (one student episode each)")
    max_length: int | None = Field(None, ge=16, description="Tokens kept per episode (prompt included); the rest is cut and counted (truncated_rollouts in metrics.jsonl). None: the policy's context (max_position_embeddings)")
    rollout: RolloutConfig = Field(default_factory=RolloutConfig, description="How the student's episodes run (through the executor)")
