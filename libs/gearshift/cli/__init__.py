"""The gearshift command line. It is the entry point above the library: the one part of
libs/gearshift that may reach the applications (services, training jobs) directly.

    gearshift --help
"""

from __future__ import annotations

import click


@click.group()
def main() -> None:
    """gearshift: an adaptive agent platform."""


# Each module adds its commands to `main`.
from gearshift.cli import evaluation, platform, records, training  # noqa: E402, F401
