"""The gearshift command line. It is the entry point above the library: the one part of
libs/gearshift that may reach the applications (services, training jobs) directly.

    gearshift --help
"""

from __future__ import annotations

from gearshift.cli import evaluation, keys, platform, records, training  # noqa: F401  (each adds its commands)
from gearshift.cli.group import main

__all__ = ["main"]
