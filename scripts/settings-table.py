"""Writes the settings table of docs/settings.md from libs/gearshift/settings.py, or with --check
fails when that table is stale. The settings file stays the one source of truth."""

from __future__ import annotations

import sys
from pathlib import Path

from gearshift.settings import Settings
from pydantic import BaseModel

BEGIN, END = "<!-- settings:begin -->", "<!-- settings:end -->"
DOCUMENT = Path(__file__).resolve().parent.parent / "docs" / "settings.md"


def rows(model: type[BaseModel], prefix: str) -> list[str]:
    lines = []
    for name, field in model.model_fields.items():
        annotation = field.annotation
        if isinstance(annotation, type) and issubclass(annotation, BaseModel):
            lines += rows(annotation, f"{prefix}{name.upper()}__")
            continue
        default = field.get_default(call_default_factory=True)
        shown = "" if default is None else str(default).replace(str(Path.home()), "~")
        shown = shown.replace("|", "\\|")
        lines.append(f"| `{prefix}{name.upper()}` | `{shown}` | {field.description or ''} |")
    return lines


def table() -> str:
    return "\n".join(["| variable | default | meaning |", "|---|---|---|", *rows(Settings, "GEARSHIFT_")])


def main() -> int:
    text = DOCUMENT.read_text()
    start, stop = text.index(BEGIN) + len(BEGIN), text.index(END)
    fresh = f"{text[:start]}\n{table()}\n{text[stop:]}"
    if "--check" in sys.argv:
        if fresh != text:
            print("the settings table in docs/settings.md is stale: run python scripts/settings-table.py", file=sys.stderr)
            return 1
        return 0
    DOCUMENT.write_text(fresh)
    return 0


if __name__ == "__main__":
    sys.exit(main())
