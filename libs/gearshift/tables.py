"""Tables that fit the terminal, as `kubectl get` and `gh` print them.

Every column has a priority. In a terminal the columns of the highest priority number are left
out, a group at a time, until the rest fit at their natural width; a free-text column (a query)
takes the room left over and wraps. No cell is ever cut short with an ellipsis. With --wide, or
when the output is not a terminal (a pipe, a file, a log), every column is printed in full.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Literal

from rich.cells import cell_len
from rich.console import Console
from rich.segment import Segment, Segments
from rich.table import Table
from rich.text import Text

GAP = 2  # cells between two columns: rich's padding of one on either side, none at the edges
WRAP_MIN = 30  # the narrowest a wrapping column may get before another column is left out (a short question on one line)


@dataclass(frozen=True)
class Column:
    header: str
    # 0: always shown. Higher numbers are left out first when the terminal is too narrow; the
    # columns that share a number go together (a pair such as "before" and "after" stays a pair).
    priority: int = 0
    wraps: bool = False  # free text: takes the width left over and wraps at word boundaries
    justify: Literal["left", "right"] = "left"


@dataclass
class TableData:
    """A table's columns and its rows of plain text cells (never read as markup)."""

    columns: Sequence[Column]
    rows: list[Sequence[str]] = field(default_factory=list)
    title: str = ""

    def natural_widths(self) -> list[int]:
        """Each column's width with nothing wrapped: its widest line, header included."""
        cells = zip(*([column.header for column in self.columns], *self.rows))
        return [max(cell_len(line) for cell in column for line in cell.splitlines() or [""]) for column in cells]


def full_output(console: Console, wide: bool) -> bool:
    """Whether every column is printed in full: asked for, or not writing to a terminal."""
    return wide or not console.is_terminal


def shown_columns(table: TableData, width: int | None) -> list[int]:
    """The indices of the columns that fit in width cells (None: all of them), in table order."""
    natural = table.natural_widths()
    shown = list(range(len(table.columns)))
    if width is None:
        return shown

    def needed(indices: list[int]) -> int:
        widths = [min(natural[i], WRAP_MIN) if table.columns[i].wraps else natural[i] for i in indices]
        return sum(widths) + GAP * (len(indices) - 1)

    for priority in sorted({column.priority for column in table.columns if column.priority > 0}, reverse=True):
        if needed(shown) <= width:
            break
        shown = [i for i in shown if table.columns[i].priority != priority]
    return shown


def render(table: TableData, width: int | None) -> Table:
    """The rich table of the columns that fit in width cells (None: every column in full)."""
    natural = table.natural_widths()
    shown = shown_columns(table, width)
    fixed = sum(natural[i] for i in shown if not table.columns[i].wraps) + GAP * (len(shown) - 1)
    wrapping = [i for i in shown if table.columns[i].wraps]
    room = None if width is None or not wrapping else max(WRAP_MIN, (width - fixed) // len(wrapping))
    out = Table(title=table.title or None, box=None, pad_edge=False, show_edge=False, header_style="bold")
    for i in shown:
        column = table.columns[i]
        # Fixed columns keep their natural width, so only a wrapping column ever gives way.
        out.add_column(column.header, justify=column.justify, no_wrap=not column.wraps, overflow="fold",
                       min_width=None if column.wraps else natural[i], max_width=room if column.wraps else None)
    for row in table.rows:
        out.add_row(*(Text(row[i]) for i in shown))
    return out


def print_table(console: Console, table: TableData, full: bool) -> None:
    """Prints table to fit the console's width, or every column in full (see full_output)."""
    natural = table.natural_widths()
    width = max(sum(natural) + GAP * (len(natural) - 1), cell_len(table.title)) if full else console.width
    # Rendered at its own width and printed uncropped when in full: a console narrower than the
    # table (a pipe counts as 80 columns) would otherwise squeeze it.
    lines = console.render_lines(render(table, None if full else width), console.options.update(width=width), pad=False)
    segments = [segment for line in lines for segment in (*_without_trailing_space(line), Segment.line())]
    console.print(Segments(segments), crop=False, end="")


def _without_trailing_space(line: list[Segment]) -> list[Segment]:
    """A rendered line less the padding after its last cell (rich pads every cell to its width)."""
    line = list(line)
    while line and not line[-1].control and not line[-1].text.strip():
        line.pop()
    if line and not line[-1].control:
        line[-1] = Segment(line[-1].text.rstrip(), line[-1].style)
    return line
