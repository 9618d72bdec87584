"""Configuration shared by the training jobs. No torch import here: services, CI and the
orchestrator load and validate job configs cheaply."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

from gearshift.protocol.modes import ModeName

PurposeName = Literal["serving", "evaluation", "gate", "training"]
TRAINING_PURPOSES = ("serving", "training")  # what training data may come from by default


class Strict(BaseModel):
    """Unknown keys in a config file are mistakes, not silently ignored options."""

    model_config = ConfigDict(extra="forbid")


class DataConfig(Strict):
    """Which stored trajectories a job reads (a TrajectoryFilter for the store's Export)."""

    modes: list[ModeName] = Field(default_factory=list, description="Only these modes (empty: all)")
    correctness: Literal["any", "correct", "incorrect", "unscored"] = Field("any", description="Reward verdict to keep")
    min_reward: float | None = Field(None, description="Keep rewards at least this (scored trajectories only)")
    max_reward: float | None = Field(None, description="Keep rewards at most this (scored trajectories only)")
    task_source: str = Field("", description="Only this task source (suite name); empty: all")
    split: str = Field(
        "train", description='Only this split ("train", "dev", "test"; empty: all): held-out items never train by default; with feedback_only, empty unless given (served traffic has no split)'
    )
    purposes: list[PurposeName] = Field(
        default_factory=lambda: list(TRAINING_PURPOSES),
        description="Only trajectories that ran for these purposes (serving, evaluation, gate, training); evaluation and gate runs are left out by default",
    )
    model_version: str = Field("", description="Only trajectories produced by this model version; empty: all")
    run_ids: list[str] = Field(default_factory=list, description="Only these run ids (one Export per id); empty: all")
    completed_only: bool = Field(True, description="Keep only trajectories that ended with an answer (status COMPLETED)")
    limit: int = Field(0, ge=0, description="Read at most this many trajectories per Export (0: all)")
    feedback_only: bool = Field(
        False, description='Only trajectories whose reward is a client\'s verdict (the gateway\'s POST /v1/feedback: reward.verifier "feedback" or "feedback:<grader>"); with correctness "correct", the served answers clients judged right'
    )

    @model_validator(mode="after")
    def _served_traffic_has_no_split(self) -> DataConfig:
        # Feedback comes on served trajectories, whose split is empty: the default "train" would
        # select none of them. Evaluation and gate runs stay out through purposes.
        if self.feedback_only and "split" not in self.model_fields_set:
            self.split = ""
        return self


class ChatTurn(Strict):
    """One earlier message of a conversation."""

    role: Literal["user", "assistant"] = Field(..., description="Who wrote it")
    content: str = Field(..., description="Its text")


class ConversationConfig(Strict):
    """The conversation around a prompt's query (common.v1.Conversation): what the client sent
    with it, which on-policy rollouts see as serving saw it."""

    instructions: str = Field("", description="The client's system instructions; empty: none")
    messages: list[ChatTurn] = Field(default_factory=list, description="Earlier user and assistant messages, oldest first")

    @classmethod
    def of(cls, conversation) -> ConversationConfig | None:
        """From a common.v1.Conversation; None when it is empty (the query stands alone)."""
        from gearshift.protocol.prompts import ROLE_NAMES  # the one role <-> name map (imports grpc: here only)

        if not conversation.instructions and not conversation.messages:
            return None
        turns = [ChatTurn(role=ROLE_NAMES[m.role], content=m.content) for m in conversation.messages]
        return cls(instructions=conversation.instructions, messages=turns)

    def to_proto(self):
        """As the common.v1.Conversation a SolveRequest carries."""
        from gearshift.api.common.v1.common_pb2 import ChatMessage, Conversation
        from gearshift.protocol.prompts import ROLE_NAMES

        role_of = {name: role for role, name in ROLE_NAMES.items()}
        return Conversation(instructions=self.instructions,
                            messages=[ChatMessage(role=role_of[m.role], content=m.content) for m in self.messages])


class ModelConfig(Strict):
    """The model being trained and how its weights are adapted."""

    base: str = Field("smollm2", description='Starting weights: "smollm2", "tiny" or a Hugging Face checkpoint directory')
    parent_checkpoint_id: str = Field("", description="Registry id of the starting checkpoint (lineage); empty: the base model")
    lora: bool = Field(False, description="Train LoRA adapters (peft) instead of the full weights")
    lora_rank: int = Field(16, ge=1, description="LoRA rank r")
    lora_alpha: int = Field(32, ge=1, description="LoRA scaling alpha")
    lora_dropout: float = Field(0.0, ge=0, lt=1, description="LoRA dropout")
    lora_target_modules: list[str] = Field(
        default_factory=lambda: ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"],
        description="Module names LoRA adapts; on a mixture-of-experts model gate_proj, up_proj and down_proj adapt every routed expert "
                    "(trained on the fused weights, saved one matrix per expert as vLLM's LoRA loader reads it)",
    )
    gradient_checkpointing: bool = Field(
        False, description="Recompute each decoder layer's activations in the backward pass (non-reentrant; less memory, slower)"
    )


class OptimConfig(Strict):
    """AdamW with linear warm-up and a constant or linearly decaying rate."""

    learning_rate: float = Field(1e-5, gt=0, description="Peak learning rate")
    weight_decay: float = Field(0.0, ge=0, description="AdamW weight decay")
    betas: tuple[float, float] = Field((0.9, 0.999), description="AdamW betas")
    warmup_steps: int = Field(0, ge=0, description="Steps of linear warm-up from 0")
    schedule: Literal["constant", "linear"] = Field("constant", description="After warm-up: constant, or linear decay to 0 at max_steps")
    max_grad_norm: float = Field(1.0, gt=0, description="Gradient norm clipping")
    max_steps: int = Field(100, ge=1, description="Optimizer steps in the run")
    seed: int = Field(0, description="Seed of sampling, shuffling and initialisation")
    threads: int = Field(0, ge=0, description="torch intra-op threads per rank (0: OMP_NUM_THREADS when set, else the machine's cores shared among its ranks)")


class RuntimeConfig(Strict):
    """Where and how the job computes: one process as launched, or every rank of a torchrun launch
    (RANK, WORLD_SIZE, LOCAL_RANK) as one job."""

    device: Literal["auto", "cpu", "cuda"] = Field("auto", description="auto: cuda:LOCAL_RANK when CUDA is available, else the CPU")
    precision: Literal["auto", "fp32", "bf16"] = Field(
        "auto", description="bf16: bfloat16 compute with float32 master weights, optimizer state and gradient reduction; auto: bf16 on CUDA, fp32 on the CPU"
    )
    parallelism: Literal["fsdp", "ddp"] = Field(
        "fsdp", description="With more than one rank: FSDP2 (parameters, gradients and optimizer state sharded, per decoder layer) or DDP (replicated; small models)"
    )
    mesh_shape: tuple[int, int] | None = Field(
        None, description="FSDP's device mesh as (replicas, shards): HSDP, each replica a group of ranks sharding the model, gradients all-reduced across replicas; unset: one replica per node (WORLD_SIZE / LOCAL_WORLD_SIZE) when the job spans several nodes, else plain FSDP over every rank"
    )
    expert_parallel: int = Field(
        1, ge=1, description="Expert parallelism: each mixture-of-experts layer's experts spread over this many ranks (tokens sent to their experts' ranks and back, all-to-all), FSDP2 sharding them over the rest; it divides the ranks and the experts. 1: every rank's FSDP shard holds a share of every expert"
    )
    context_parallel: int = Field(
        1, ge=1, description="Context parallelism (Ulysses): each packed micro-batch's tokens split over this many ranks, which see the same examples; attention exchanges heads for the whole sequence (all-to-all) and back. It divides the ranks and the attention heads; needs runtime.packing on sdpa attention. 1: a rank holds its examples whole"
    )
    tensor_parallel: int = Field(
        1, ge=1, description="Tensor parallelism for dense models: attention heads and MLP columns split over this many consecutive ranks (DTensor), which see the same examples; FSDP2 shards over the rest. It divides the ranks and the heads. 1: none"
    )
    compile: bool = Field(False, description="torch.compile each decoder layer (the first steps take longer while it compiles)")
    compile_backend: Literal["inductor", "aot_eager"] = Field(
        "inductor", description="torch.compile's backend: inductor (generated kernels), or aot_eager (graphs captured and run by eager kernels: checks a model compiles, fast to build)"
    )
    micro_batch_tokens: int = Field(
        8192, ge=0, description="Most padded tokens in one forward; a rank's share of the batch is split into micro-batches whose gradients accumulate (0: one forward)"
    )
    packing: bool = Field(
        True, description="Pack a micro-batch's examples end to end in one row (position ids restarting, varlen attention inside each example, no padding, a prefix every example shares held once) instead of one padded row each; on sdpa (run as forward.block_attention) and flash attention (which shares no prefix), else padded"
    )
    loss_chunk_tokens: int = Field(
        1024, ge=0, description="Target tokens whose logits the head computes at once for the loss (float32, recomputed in the backward); 0: all of a micro-batch's at once"
    )
    collective_timeout_seconds: float = Field(
        3600.0, gt=0, description="How long a rank waits in a collective (the other ranks wait here while rank 0 runs rollouts)"
    )


class OutputConfig(Strict):
    """Where the checkpoint goes and how often the run saves resumable state."""

    dir: Path = Field(..., description="Checkpoint directory: weights or artefact, result.json, metrics.jsonl, resume state")
    checkpoint_id: str = Field("", description="Registry id of the new checkpoint (default: a fresh id)")
    save_every: int = Field(50, ge=1, description="Save resumable state (weights, optimizer, scheduler, step, RNG; sharded) every N steps and at the end")
    resume: bool = Field(True, description="Continue from saved resume state in dir when there is some")
    register_checkpoint: bool = Field(True, description="Register the checkpoint in the store's registry when store_addr is set")
    progress: bool = Field(True, description="Show a progress bar")
    merged_weights: bool = Field(
        True, description="LoRA: also save the adapter folded into the base weights (what the built-in server and a rolling restart load); vLLM's runtime LoRA loading needs only the adapter"
    )


class JobConfig(Strict):
    """What every training job's config has: where its checkpoint goes, and the store it reads
    trajectories from and registers the checkpoint in."""

    output: OutputConfig = Field(..., description="Checkpoint directory and saving")
    store_addr: str = Field("", description="Trajectory store (host:port) for data and the registry; empty: no store")

    @classmethod
    def from_file(cls, path: str | Path):
        """Reads a JSON or YAML config file and validates it."""
        text = Path(path).read_text()
        if Path(path).suffix == ".json":
            return cls.model_validate(json.loads(text))
        import yaml  # only YAML configs need it

        return cls.model_validate(yaml.safe_load(text) or {})


class PolicyJobConfig(JobConfig):
    """A job that trains the policy model: SFT, distillation, APO."""

    model: ModelConfig = Field(default_factory=ModelConfig, description="The model being trained")
    optim: OptimConfig = Field(default_factory=OptimConfig, description="Optimizer and schedule")
    runtime: RuntimeConfig = Field(default_factory=RuntimeConfig, description="Device, precision, parallelism across ranks, micro-batches")


class OffPolicyConfig(Strict):
    """How the loss treats a token sampled by another policy than the one being updated: an older
    step's weights (asynchronous rollouts) or other kernels for the same weights (vLLM's; an
    MoE's routing differs between them). rho = p_trainer / p_sampler per token."""

    importance_cap: float = Field(2.0, ge=1, description="The importance weight rho is truncated at this value (truncated importance sampling)")
    mask_band: tuple[float, float] = Field(
        (0.2, 5.0), description="Tokens whose rho lies outside [low, high] are masked out of the loss and counted (metrics.jsonl masked_fraction)"
    )

    @model_validator(mode="after")
    def _band_holds_one(self) -> OffPolicyConfig:
        low, high = self.mask_band
        if not 0 < low <= 1 <= high:
            raise ValueError("off_policy.mask_band must be (low, high) with 0 < low <= 1 <= high")
        return self


class RolloutConfig(Strict):
    """How on-policy rollouts (APO, distillation) are produced: through the executor, as in
    serving, with the model being trained. Their sampling reaches every model call of an episode."""

    executor_addr: str = Field(
        "", description="A running executor whose policy server gets the new weights after each update (built-in: /v1/load; vLLM: a new LoRA name per step, or full weights reloaded in place); empty: an in-process stack serving the training weights"
    )
    policy_url: str = Field("", description="The running executor's policy server (where the weights are sent); empty: GEARSHIFT_POLICY_CLIENT__URL")
    temperature: float = Field(1.0, ge=0, description="Sampling temperature of every model call (A^2FM: 1.0)")
    top_p: float = Field(1.0, gt=0, le=1, description="Nucleus sampling mass of every model call")
    max_tokens_per_turn: int = Field(128, ge=8, description="Tokens per policy turn in the in-process stack")
    max_steps: int = Field(0, ge=0, description="Turn budget per rollout (0: the mode's default)")
    episode_timeout_s: float = Field(
        900.0, gt=0, description="An episode still running this long after it started is dropped and counted (failed_episodes), not waited for"
    )
    concurrency: int = Field(12, ge=1, description="Rollouts in flight at once (on each rank, when every rank rolls out through executor_addr)")
    exact_tokens: bool = Field(
        True, description="Learn only the tokens the policy sampled (kept with each turn); false: the re-tokenised text's"
    )
    max_async_steps: int = Field(
        0, ge=0, description="Asynchronous rollouts with bounded staleness (prime-rl's async level): the rollouts of step n+1 are generated while step n trains, and a batch is trained at most this many updates after the weights that generated it; the sampler's log-probabilities (kept with the sampled tokens) weigh and mask its tokens (off_policy). 0: synchronous (generate, then train). Needs executor_addr"
    )

    off_policy: OffPolicyConfig = Field(default_factory=OffPolicyConfig, description="Truncation and masking of tokens the sampler drew from another policy than the trainer's")
    weight_transfer: Literal["volume", "nccl"] = Field(
        "volume", description="How a vLLM fleet (executor_addr) gets full weights after each update: volume: the checkpoint saved to the run's output dir (the checkpoints volume) and reloaded in place; nccl: streamed from the FSDP shards in buckets over NCCL into vLLM's weight-transfer engine, no file written (CUDA ranks; vLLM started with VLLM_SERVER_DEV_MODE=1 and --weight-transfer-config '{\"backend\": \"nccl\"}'). A LoRA run on vLLM sends its adapter either way"
    )

    @model_validator(mode="after")
    def _async_needs_a_fleet(self) -> RolloutConfig:
        # In process the stack generates with the module being trained (or rank 0's copy of it) on the
        # trainer's own CPU: generating while it trains would race the update it overlaps.
        if self.max_async_steps and not self.executor_addr:
            raise ValueError("rollout.max_async_steps needs rollout.executor_addr (an inference fleet that generates while the trainer trains)")
        if self.weight_transfer == "nccl" and not self.executor_addr:
            raise ValueError("rollout.weight_transfer nccl streams to a vLLM fleet: set rollout.executor_addr")
        if self.max_async_steps and not self.raw_sampling:
            raise ValueError("rollout.max_async_steps needs temperature 1 and top_p 1: the sampler's log-probabilities, which weigh stale rollouts' tokens, are the raw model's")
        return self

    @property
    def raw_sampling(self) -> bool:
        """Whether the rollouts sample the model's own distribution, which the log-probabilities
        the sampler returns describe (vLLM's and the built-in server's are before temperature and top-p)."""
        return self.temperature == 1.0 and self.top_p == 1.0
