"""The Celery app as a worker runs it, with one change: training runs are the stand-in
(standin_run.py) instead of a trainer, still started and re-attached to by the LocalRunner. And
two journaled tasks of the tests' own, run by tasks.once like every journaled task: one shaped
like promote (a long quiet evaluation, then a step only one copy may take) and one whose work
kills the worker process running it.

    celery -A tests.libs.orchestration.standin_worker worker
"""

from __future__ import annotations

import os
import signal
import sys
import time
from pathlib import Path

from gearshift.orchestration import tasks
from gearshift.orchestration.app import app  # what `celery -A` looks for
from gearshift.orchestration.journal import Lease
from gearshift.orchestration.runners import LocalRunner
from gearshift.orchestration.training_run import RunSpec

STANDIN_RUN = Path(__file__).with_name("standin_run.py")


class StandInRunner(LocalRunner):
    def command(self, spec: RunSpec, config_path: Path) -> list[str]:
        return [sys.executable, str(STANDIN_RUN), str(config_path)]


tasks.make_runner = lambda settings: StandInRunner(settings.data_dir / "runs")


def note(what: str) -> None:
    """A line in $STANDIN_NOTES: what this process's work did."""
    with open(os.environ["STANDIN_NOTES"], "a") as notes:
        notes.write(f"{what} {os.getpid()}\n")


@app.task(name="tests.standin.evaluate_then_promote", **tasks.JOURNALED)
def evaluate_then_promote(key: str, seconds: float) -> dict:
    def work(lease: Lease) -> dict:
        note("evaluating")
        time.sleep(seconds)  # reports nothing: only the lease's thread beats
        lease.confirm()  # where promote confirms, before rejecting or publishing
        note("promoted")
        return {"promoted_by": os.getpid()}

    return tasks.once(key, "promote", {}, work)


@app.task(name="tests.standin.kill_my_worker", **tasks.JOURNALED)
def kill_my_worker(key: str) -> dict:
    def work(lease: Lease) -> dict:
        note("started")
        os.kill(os.getpid(), signal.SIGKILL)  # as the OOM killer or a segfault in a native library would
        return {}

    return tasks.once(key, "train", {}, work)
