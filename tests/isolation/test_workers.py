"""Two xdist workers running store tests at once do not see each other's rows, Redis keys, files
or ports (tests/workers.py): the probe (probe.py) runs as `pytest -n 2`, one test on each worker."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).parents[2]


def test_two_workers_at_once_see_only_their_own_rows_keys_files_and_ports(tmp_path):
    shared = tmp_path / "shared"
    shared.mkdir()
    # The probe's workers are its own, not this one's; its figures stay out of the suite's report.
    env = {name: value for name, value in os.environ.items() if not name.startswith("PYTEST_XDIST")}
    env["GEARSHIFT_ISOLATION_PROBE"] = str(shared)
    done = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-p", "no:tests.durations", "-n", "2", "--dist", "load",
         "--basetemp", str(tmp_path / "base"), "tests/isolation/probe.py"], cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stdout[-4000:]
    assert "2 passed" in done.stdout
    assert sorted(path.name for path in shared.iterdir()) == ["gw0.json", "gw1.json"]
