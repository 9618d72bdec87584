"""The memory prediction (gearshift.training.memory: FSDPMemTracker over a fake process group under
FakeTensorMode) against the same step on 2 real gloo ranks, whose live tensors the tracker follows."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.ranks

ATTENTION = ["q_proj", "k_proj", "v_proj", "o_proj"]


def peak(tmp_path: Path, name: str, config: Path, options: list[str], measure: bool) -> float:
    out = tmp_path / f"{name}-{'measured' if measure else 'predicted'}.json"
    command = ["-m", "gearshift.training.memory", str(config / "config.json"), "--tokens", "512", *options, "--out", str(out)]
    if measure:
        command = ["-m", "torch.distributed.run", "--standalone", "--nproc-per-node=2", *command, "--measure"]
    else:
        command += ["--ranks", "2"]
    done = subprocess.run([sys.executable, *command], capture_output=True, text=True, timeout=300, env={**os.environ, "OMP_NUM_THREADS": "1"})
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(out.read_text())["Total"]


@pytest.mark.parametrize("name", ["dense, full weights", "moe, expert parallel 2, LoRA"])
def test_the_prediction_is_within_15_percent_of_two_real_ranks(tiny_dir, moe_dir, tmp_path, name):
    config, options = {
        "dense, full weights": (tiny_dir, []),
        "moe, expert parallel 2, LoRA": (moe_dir, ["--runtime", json.dumps({"expert_parallel": 2}),
                                                   "--model", json.dumps({"lora": True, "lora_rank": 4, "lora_target_modules": ATTENTION})]),
    }[name]
    predicted, measured = (peak(tmp_path, name.split(",")[0], config, options, measure) for measure in (False, True))
    assert abs(predicted - measured) <= 0.15 * measured, (predicted, measured)
