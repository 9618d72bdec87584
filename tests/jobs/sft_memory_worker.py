"""SFT as users run it (Run.start, the trainer's fit, the export at its end) on given trajectories,
under torchrun or alone, each rank writing its peak resident memory: after loading, over the whole
run, and during the export alone (VmHWM reset through /proc/self/clear_refs just before it).

    torchrun --nproc-per-node 2 tests/jobs/sft_memory_worker.py CONFIG TRAJECTORIES OUT_DIR
"""

from __future__ import annotations

import argparse
import json
import os
import pickle
from pathlib import Path


def resident_kib(field: str) -> int:
    """VmRSS or VmHWM (the peak since the start or the last reset) of this process, in KiB."""
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1])
    raise KeyError(field)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("config")
    parser.add_argument("trajectories")
    parser.add_argument("out", type=Path)
    args = parser.parse_args()
    from gearshift.jobs.sft.config import SFTConfig
    from gearshift.jobs.sft.trainer import fit
    from gearshift.training.runtime import Run

    config = SFTConfig.from_file(args.config)
    trajectories = pickle.loads(Path(args.trajectories).read_bytes())
    memory = {"start_kib": resident_kib("VmRSS")}
    run = Run.start("sft", config)
    memory["load_peak_kib"] = resident_kib("VmHWM")
    save_weights = run.save_weights

    def measured_save_weights(directory, merged=True):
        memory["before_export_kib"] = resident_kib("VmRSS")
        memory["peak_before_export_kib"] = resident_kib("VmHWM")
        Path("/proc/self/clear_refs").write_text("5")  # VmHWM starts again from VmRSS
        save_weights(directory, merged)
        memory["export_peak_kib"] = resident_kib("VmHWM")

    run.save_weights = measured_save_weights
    fit(run, config, trajectories)
    memory["run_peak_kib"] = max(memory["peak_before_export_kib"], memory["export_peak_kib"])
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / f"memory-{os.environ.get('RANK', '0')}.json").write_text(json.dumps(memory))


if __name__ == "__main__":
    main()
