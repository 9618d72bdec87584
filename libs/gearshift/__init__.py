"""gearshift: an adaptive agent platform."""

from __future__ import annotations

import subprocess
from pathlib import Path

__version__ = "0.1.0"


def code_version() -> str:
    """The git commit of this code, recorded with every checkpoint ("unknown" outside a checkout)."""
    try:
        head = subprocess.run(
            ["git", "rev-parse", "HEAD"], capture_output=True, text=True, check=True, cwd=Path(__file__).parent, timeout=5
        )
    except (OSError, subprocess.SubprocessError):
        return "unknown"
    return head.stdout.strip() or "unknown"
