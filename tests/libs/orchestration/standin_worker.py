"""The Celery app as a worker runs it, with one change: training runs are the stand-in
(standin_run.py) instead of a trainer, still started and re-attached to by the LocalRunner.

    celery -A tests.libs.orchestration.standin_worker worker
"""

from __future__ import annotations

import sys
from pathlib import Path

from gearshift.orchestration import tasks
from gearshift.orchestration.app import app  # noqa: F401  (what `celery -A` looks for)
from gearshift.orchestration.runners import LocalRunner
from gearshift.orchestration.training_run import RunSpec

STANDIN_RUN = Path(__file__).with_name("standin_run.py")


class StandInRunner(LocalRunner):
    def command(self, spec: RunSpec, config_path: Path) -> list[str]:
        return [sys.executable, str(STANDIN_RUN), str(config_path)]


tasks.make_runner = lambda settings: StandInRunner(settings.data_dir / "runs")
