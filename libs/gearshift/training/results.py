"""What a finished training run leaves behind, for every job alike: result.json in its output
directory, metrics.jsonl (one line per step), a LoRA run's adapter in adapter/, and a CANDIDATE checkpoint in the store's
registry with its lineage. No torch here: the orchestrator and the router job read results."""

from __future__ import annotations

import json
import math
from pathlib import Path

from gearshift.api.common.v1.common_pb2 import Checkpoint, CheckpointStatus

RESULT_FILE = "result.json"
METRICS_FILE = "metrics.jsonl"
ADAPTER_DIR = "adapter"
POLICY_KIND = "policy"


def write_result(output: Path, result: dict) -> dict:
    (output / RESULT_FILE).write_text(json.dumps(result, indent=2))
    return result


def read_result(output: Path) -> dict | None:
    """A run's result.json, or None while it has none (running, failed, unreadable)."""
    try:
        return json.loads((Path(output) / RESULT_FILE).read_text())
    except (OSError, ValueError):
        return None


def read_metrics(output: Path) -> list[dict]:
    """The metrics lines of a run, one dict per step."""
    path = Path(output) / METRICS_FILE
    if not path.exists():
        return []
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def _finite(metrics: dict) -> dict[str, float]:
    return {key: float(value) for key, value in metrics.items() if isinstance(value, int | float) and math.isfinite(value)}


def as_checkpoint(result: dict) -> Checkpoint:
    """The registry record of a finished run: a CANDIDATE checkpoint with its lineage; training
    metrics under "train/", an offline evaluation's (eval_metrics) as they are."""
    metrics = {f"train/{key}": value for key, value in _finite(result["metrics"]).items()}
    return Checkpoint(
        id=result["checkpoint_id"],
        kind=result.get("kind", POLICY_KIND),
        uri=result["uri"],
        parent_id=result.get("parent_id", ""),
        job=result["job"],
        config_json=json.dumps(result["config"]),
        code_version=result["code_version"],
        dataset_snapshot=result["dataset_snapshot"],
        trajectory_ids=result["trajectory_ids"],
        eval_metrics=metrics | _finite(result.get("eval_metrics", {})),
        status=CheckpointStatus.CHECKPOINT_STATUS_CANDIDATE,
    )


async def register(store_addr: str, result: dict) -> Checkpoint:
    """Records the checkpoint in the store's registry."""
    from gearshift.api.store.v1 import store_pb2, store_pb2_grpc
    from gearshift.clients import channel
    from gearshift.settings import Settings

    async with channel(store_addr, Settings()) as ch:
        stub = store_pb2_grpc.TrajectoryStoreStub(ch)
        return await stub.RegisterCheckpoint(store_pb2.RegisterCheckpointRequest(checkpoint=as_checkpoint(result)))
