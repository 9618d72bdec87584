"""The tables `gearshift eval` prints (here through `eval report` and `eval compare`, which print
the same ones) fit an 80-column terminal with the key figures whole, and show every figure at 200
columns; the run is a real one, evaluated through the executor and read back from the store."""

from __future__ import annotations

import json
import re

import pytest
from gearshift.evaluation.harness import evaluate
from gearshift.evaluation.report import COMPARE_COLUMNS, SUMMARY_COLUMNS
from rich.cells import cell_len

MODES = ["instant", "reasoning", "agentic", "auto"]


@pytest.fixture(scope="module")
async def run_id(stack, tmp_path_factory):
    folder = tmp_path_factory.mktemp("eval")
    suite = folder / "products.jsonl"
    rows = [{"id": f"q{i}", "question": f"What is 17*23 (variant {i})?", "answer": "391", "split": "test", "difficulty": 1 + i % 2,
             "domain": "arithmetic"} for i in range(3)]
    suite.write_text("\n".join(json.dumps(row) for row in rows))
    result = await evaluate(stack, str(suite), MODES, 3, run_id="cli-tables", concurrency=2, out_dir=folder / "report")
    assert not result.summary.errors
    return "cli-tables"


def rows_by_mode(output: str) -> tuple[list[str], dict[str, list[str]]]:
    """The header line (after the title) and each mode's row, split on the column gaps."""
    lines = output.splitlines()
    header = next(i for i, line in enumerate(lines) if line.startswith("mode "))
    rows = {line.split()[0]: [cell.strip() for cell in line.split("  ") if cell.strip()] for line in lines[header + 1:]
            if line.split() and line.split()[0] in MODES}
    return lines[header], rows


def headers_in(header: str, columns) -> list[str]:
    cells = re.split(r"\s{2,}", header.strip())
    assert set(cells) <= {column.header for column in columns}
    return cells


async def test_the_summary_fits_80_columns(gearshift, run_id, tmp_path):
    code, output = await gearshift("eval", "report", run_id, "--out", str(tmp_path), columns=80)
    assert code == 0, output
    table = output.split("report:")[0]
    assert "…" not in table and all(cell_len(line) <= 80 for line in table.splitlines())
    header, rows = rows_by_mode(table)
    shown = headers_in(header, SUMMARY_COLUMNS)
    assert {"mode", "pass@1", "cost of pass", "mean cost", "modes chosen"} <= set(shown) and "95% CI" not in shown
    assert list(rows) == MODES
    pass_at_1 = shown.index("pass@1")
    assert [rows[mode][pass_at_1] for mode in MODES] == ["0.000", "1.000", "1.000", "1.000"]  # the scripted model's 42 is wrong
    assert rows["auto"][-1] == "agentic 100%" and rows["instant"][shown.index("cost of pass")] == "inf"


async def test_the_summary_has_every_column_at_200(gearshift, run_id, tmp_path):
    code, output = await gearshift("eval", "report", run_id, "--out", str(tmp_path), columns=200)
    assert code == 0 and "…" not in output
    header, rows = rows_by_mode(output)
    assert headers_in(header, SUMMARY_COLUMNS) == [column.header for column in SUMMARY_COLUMNS]
    assert all(len(row) == len(SUMMARY_COLUMNS) for row in rows.values())


async def test_the_comparison_fits_80_columns_and_widens(gearshift, run_id):
    code, output = await gearshift("eval", "compare", run_id, run_id, columns=80)
    assert code == 0 and "…" not in output and all(cell_len(line) <= 80 for line in output.splitlines())
    header, rows = rows_by_mode(output)
    shown = headers_in(header, COMPARE_COLUMNS)
    assert {"mode", "pass@1 A", "pass@1 B", "Δ pass@1", "Δ cost of pass"} <= set(shown)
    assert [rows[mode][shown.index("Δ pass@1")] for mode in MODES] == ["+0.000"] * 4
    code, output = await gearshift("eval", "compare", run_id, run_id, "--wide", columns=80)
    header, rows = rows_by_mode(output)
    assert code == 0 and headers_in(header, COMPARE_COLUMNS) == [column.header for column in COMPARE_COLUMNS]
