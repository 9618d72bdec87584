"""The `gearshift` command group, in a module of its own: each command module adds its commands
to it, and the package imports those modules, so none of them imports the package back."""

from __future__ import annotations

import click


@click.group()
def main() -> None:
    """gearshift: an adaptive agent platform."""
