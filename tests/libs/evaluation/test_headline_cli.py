"""`gearshift eval headline` refuses bad input with one line, before it starts anything."""

from __future__ import annotations

import pytest
from click.testing import CliRunner
from gearshift.cli import main


@pytest.mark.parametrize(("args", "message"), [
    (["--n-per-family", "100"], "Error: suite 'headline': facts has only 78 test items; ask for at most 78 per family"),
    (["--n-per-family", "0"], "Error: --n-per-family and --train-n must be positive"),
    (["--modes", "instant,fast"], "Error: unknown mode(s) ['fast']; choose from instant, reasoning, agentic, auto, learned"),
    (["--suite", "nope"], "Error: unknown suite 'nope'"),
    (["--model", "tiny"], "Error: --model needs --inprocess"),
])
def test_bad_input_is_one_line(args, message, tmp_path, monkeypatch):
    monkeypatch.setenv("GEARSHIFT_DATA_DIR", str(tmp_path))
    result = CliRunner().invoke(main, ["eval", "headline", *args])
    assert result.exit_code != 0 and (result.exception is None or isinstance(result.exception, SystemExit))
    lines = [line for line in result.output.splitlines() if line.startswith("Error:")]
    assert len(lines) == 1 and lines[0].startswith(message)
    assert not list(tmp_path.iterdir())  # nothing was started or written
