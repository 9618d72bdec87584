"""Fitting a table to the terminal: which columns go, in which order, and that what stays is
whole. The CLI tests (tests/libs/cli) check the same on stored trajectories and runs."""

from __future__ import annotations

import io

from gearshift.tables import WRAP_MIN, Column, TableData, print_table, shown_columns
from rich.console import Console

COLUMNS = (Column("name"), Column("before", 2), Column("after", 2), Column("kind", 1), Column("note", wraps=True))
ROWS = [["alpha", "0.250", "0.500", "forced", "a sentence long enough to have to wrap somewhere in a narrow terminal"]]


def test_columns_go_highest_priority_first_and_a_group_together():
    table = TableData(COLUMNS, ROWS)
    # name 5, before 6, after 5, kind 6, note counted at WRAP_MIN while others may go, gaps of 2
    assert shown_columns(table, None) == [0, 1, 2, 3, 4]
    assert shown_columns(table, 5 + 6 + 5 + 6 + WRAP_MIN + 8) == [0, 1, 2, 3, 4]
    assert shown_columns(table, 5 + 6 + 5 + 6 + WRAP_MIN + 8 - 1) == [0, 3, 4]  # before and after go as a pair
    assert shown_columns(table, 5 + 6 + WRAP_MIN + 4 - 1) == [0, 4]
    assert shown_columns(table, 10) == [0, 4]  # priority 0 always stays


def printed(table: TableData, width: int, full: bool) -> list[str]:
    out = Console(file=io.StringIO(), width=width, color_system=None)
    print_table(out, table, full)
    return out.file.getvalue().splitlines()


def test_a_narrow_table_wraps_its_free_text_and_cuts_nothing():
    lines = printed(TableData(COLUMNS, ROWS), 50, full=False)
    assert lines[0].split() == ["name", "kind", "note"]
    assert all(len(line) <= 50 for line in lines) and "…" not in "".join(lines)
    assert " ".join(line[14:].strip() for line in lines[1:]) == ROWS[0][4]
    assert all(line == line.rstrip() for line in lines)  # no padding after the last cell


def test_full_output_is_wider_than_the_console():
    lines = printed(TableData(COLUMNS, ROWS, title="t"), 40, full=True)
    assert lines[1].split() == ["name", "before", "after", "kind", "note"]
    assert lines[2].endswith(ROWS[0][4]) and len(lines[2]) > 40
