"""A stand-in training run for the Celery tests: counts its start (a line in $STANDIN_STARTS),
logs a step every 0.2 s for $STANDIN_SECONDS, then writes the result.json the run's config
asks for, as a trainer does. Started through LocalRunner like `python -m gearshift.jobs.<job>`."""

from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path

import yaml


def main(config_path: str) -> None:
    config = yaml.safe_load(Path(config_path).read_text())
    with open(os.environ["STANDIN_STARTS"], "a") as starts:
        starts.write(f"{os.getpid()}\n")
    deadline = time.monotonic() + float(os.environ.get("STANDIN_SECONDS", "1"))
    step = 0
    while time.monotonic() < deadline:
        step += 1
        print(f"step {step}", flush=True)
        time.sleep(0.2)
    output = Path(config["output"]["dir"])
    output.mkdir(parents=True, exist_ok=True)
    (output / "result.json").write_text(json.dumps({"checkpoint_id": config["output"]["checkpoint_id"], "metrics": {"steps": step}}))


if __name__ == "__main__":
    main(sys.argv[1])
