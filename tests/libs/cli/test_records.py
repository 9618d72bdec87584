"""`gearshift trajectories list` in an 80-column terminal shows the columns that fit, none cut
short; wide, piped and JSON output have everything; `show` takes the shortened ids it prints."""

from __future__ import annotations

import json

import pytest
from gearshift.api.common.v1.common_pb2 import Mode
from rich.cells import cell_len

from tests.services.executor.test_episode import solve

LONG = "A farmer plants 17 rows of apple trees with 23 trees in every row; how many apple trees are there in all?"
QUESTIONS = ((LONG, Mode.MODE_UNSPECIFIED), ("What is 17*23?", Mode.MODE_REASONING), ("What is 17*23?", Mode.MODE_INSTANT))
ALL_COLUMNS = ["id", "age", "mode", "status", "correct", "cost $", "tokens", "source", "run", "query"]


@pytest.fixture(scope="module")
async def stored(stack):
    """The trajectories of three real episodes, newest first (as the store lists them)."""
    finals = [(await solve(stack, query=q, mode=mode, reference_answer="391"))[-1].final.trajectory for q, mode in QUESTIONS]
    return finals[::-1]


def table(output: str) -> tuple[list[str], list[dict[str, str]]]:
    """The headers, and each row's left-aligned cells read at their header's offset; a wrapped
    query (the last column) joined back from its continuation lines."""
    lines = output.splitlines()
    header = lines[0]
    names = [name for name in ALL_COLUMNS if f" {name} " in f" {header} "]
    starts = {name: header.index(name) for name in names}
    rows: list[dict[str, str]] = []
    for line in lines[1:]:
        if not line.startswith(" "):
            rows.append({name: line[start:].split("  ")[0].strip() for name, start in starts.items()})
        elif "query" in starts:
            rows[-1]["query"] = (rows[-1].get("query", "") + " " + line[starts["query"]:].strip()).strip()
    return names, rows


async def test_an_80_column_terminal_gets_the_key_columns_whole(gearshift, stored):
    code, output = await gearshift("trajectories", "list", "--limit", "3", columns=80)
    assert code == 0, output
    assert "…" not in output and all(cell_len(line) <= 80 for line in output.splitlines())
    names, rows = table(output)
    assert {"id", "mode", "status", "correct", "query"} <= set(names) and "run" not in names
    assert [row["id"] for row in rows] == [t.id[:8] for t in stored]
    assert [row["mode"] for row in rows] == ["instant", "reasoning", "agentic"]
    assert [row["correct"] for row in rows] == ["no", "yes", "yes"]
    assert [row["query"] for row in rows] == [t.query for t in stored]  # the long one wrapped, not cut
    assert output.count("\n") > len(rows) + 1  # and it did wrap


async def test_a_wide_terminal_gets_every_column(gearshift, stored):
    code, output = await gearshift("trajectories", "list", "--limit", "3", columns=200)
    assert code == 0 and "…" not in output
    names, rows = table(output)
    assert names == ALL_COLUMNS and len(output.splitlines()) == 1 + len(stored)
    assert [row["query"] for row in rows] == [t.query for t in stored]


@pytest.mark.parametrize("args, terminal", [(["--wide"], True), ([], False)])
async def test_wide_or_piped_output_is_full(gearshift, stored, args, terminal):
    code, output = await gearshift("trajectories", "list", "--limit", "3", *args, columns=80, terminal=terminal)
    assert code == 0 and "…" not in output
    lines = output.splitlines()
    assert lines[0].split()[:2] == ["id", "created"] and len(lines) == 1 + len(stored)
    for line, trajectory in zip(lines[1:], stored):
        created = trajectory.created_at.ToDatetime().isoformat(timespec="seconds") + "Z"
        assert line.startswith(f"{trajectory.id}  {created}") and line.endswith(trajectory.query)


async def test_json_has_the_stored_trajectories(gearshift, stored):
    code, output = await gearshift("trajectories", "list", "--limit", "3", "--json")
    assert code == 0
    listed = json.loads(output)
    assert [t["id"] for t in listed] == [t.id for t in stored] and listed[0]["answer"] == "42"


async def test_show_takes_the_short_id(gearshift, stored):
    agentic = stored[-1]
    code, output = await gearshift("trajectories", "show", agentic.id[:8])
    assert code == 0, output
    assert " ".join(output.split()).startswith(f"query {LONG}") and "answer 391 (correct)" in output
    code, output = await gearshift("trajectories", "show", "")
    assert code != 0 and "starts more than one id" in output
    code, output = await gearshift("trajectories", "show", "not-an-id")
    assert code != 0 and "no trajectory among the newest 3 has an id starting with 'not-an-id'" in output
