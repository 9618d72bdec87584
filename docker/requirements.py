"""Prints the distribution's dependencies, one per line, for the image's dependency layer.

The Dockerfiles install these before copying any source, so the heavy layer is rebuilt only
when pyproject.toml changes. Usage: python requirements.py [EXTRA ...] (e.g. `model`).
"""

from __future__ import annotations

import sys
import tomllib
from pathlib import Path


def requirements(pyproject: Path, extras: list[str]) -> list[str]:
    """The base dependencies followed by those of each named extra."""
    project = tomllib.loads(pyproject.read_text())["project"]
    optional = project.get("optional-dependencies", {})
    unknown = [extra for extra in extras if extra not in optional]
    if unknown:
        raise SystemExit(f"unknown extra(s) {unknown}; pyproject.toml has {sorted(optional)}")
    found = list(project["dependencies"])
    for extra in extras:
        found += optional[extra]
    return found


if __name__ == "__main__":
    here = Path(__file__).resolve().parent
    pyproject = next(p for p in (here / "pyproject.toml", here.parent / "pyproject.toml") if p.exists())
    print("\n".join(requirements(pyproject, sys.argv[1:])))
