"""`gearshift eval headline` refuses bad input with one line, before it starts anything."""

from __future__ import annotations

import pytest
from click.testing import CliRunner
from gearshift.cli import main

from tests.libs.evaluation.test_suites import family_file


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


def test_a_file_suite_is_refused_by_the_family_too_small(tmp_path, monkeypatch):
    """--n-per-family counts each family a file's rows name, not the file's rows."""
    monkeypatch.setenv("GEARSHIFT_DATA_DIR", str(tmp_path / "data"))
    suite = family_file(tmp_path / "two.jsonl", {"wide": 9, "narrow": 5})
    result = CliRunner().invoke(main, ["eval", "headline", "--suite", str(suite), "--n-per-family", "8"])
    assert result.exit_code != 0
    assert "Error: suite 'two': narrow has only 5 test items; ask for at most 5 per family" in result.output
    assert not (tmp_path / "data").exists()  # refused before anything started
