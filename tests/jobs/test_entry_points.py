"""`gearshift train <job> --config FILE` and `python -m gearshift.jobs.<job> --config FILE`."""

import json
import os
import subprocess
import sys

from click.testing import CliRunner
from gearshift.cli import main


def distill_config(tiny_dir, teacher_dir, out, path):
    path.write_text(
        json.dumps(
            {
                "model": {"base": str(tiny_dir)},
                "optim": {"max_steps": 1, "threads": 1},
                "output": {"dir": str(out), "progress": False},
                "default_teacher": str(teacher_dir),
                "prompts": [{"query": "What is 2+2?"}],
                "rollout": {"max_tokens_per_turn": 8, "max_steps": 1},
            }
        )
    )
    return path


def test_gearshift_train(tiny_dir, teacher_dir, tmp_path):
    config = distill_config(tiny_dir, teacher_dir, tmp_path / "out", tmp_path / "distill.json")
    outcome = CliRunner().invoke(main, ["train", "distill", "--config", str(config)])
    assert outcome.exit_code == 0, outcome.output
    summary = json.loads(outcome.output.strip().splitlines()[-1])
    assert summary["steps"] == 1
    assert json.loads((tmp_path / "out" / "result.json").read_text())["checkpoint_id"] == summary["checkpoint_id"]


def test_module_entry_point(tiny_dir, teacher_dir, tmp_path):
    config = distill_config(tiny_dir, teacher_dir, tmp_path / "out", tmp_path / "distill.json")
    done = subprocess.run(
        [sys.executable, "-m", "gearshift.jobs.distill", "--config", str(config)],
        capture_output=True, text=True, timeout=120, env={**os.environ, "OMP_NUM_THREADS": "1"},
    )
    assert done.returncode == 0, done.stderr[-2000:]
    assert (tmp_path / "out" / "model.safetensors").exists()
    assert json.loads(done.stdout.strip().splitlines()[-1])["uri"] == str((tmp_path / "out").resolve())
