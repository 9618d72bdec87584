"""Prints the settings table of the README from libs/gearshift/settings.py, or with --check
fails when the README's table is stale. The settings file stays the one source of truth."""

from __future__ import annotations

import sys
from pathlib import Path

from gearshift.settings import Settings
from pydantic import BaseModel

BEGIN, END = "<!-- settings:begin -->", "<!-- settings:end -->"
README = Path(__file__).resolve().parent.parent / "README.md"


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
    text = README.read_text()
    start, stop = text.index(BEGIN) + len(BEGIN), text.index(END)
    fresh = f"{text[:start]}\n{table()}\n{text[stop:]}"
    if "--check" in sys.argv:
        if fresh != text:
            print("README settings table is stale: run python scripts/settings-table.py", file=sys.stderr)
            return 1
        return 0
    README.write_text(fresh)
    return 0


if __name__ == "__main__":
    sys.exit(main())
