"""One training run as the orchestrator hands it to a runner. Its own module because the runners
(runners.py) and the cluster objects they submit (training_manifests.py) both read it."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path


@dataclass
class RunSpec:
    """One training run: a DNS-safe name, the job, its --config and where its checkpoint lands."""

    name: str
    job: str
    config: dict
    output_dir: Path
