"""What every tool returns, and the failure a tool raises for the policy to read."""

from __future__ import annotations

from dataclasses import dataclass


class ToolFailure(Exception):
    """A tool call that failed in a way the policy should read (becomes ToolResult.is_error)."""


@dataclass
class ToolOutput:
    """One tool call's outcome, before it becomes a ToolResult."""

    output: str
    is_error: bool = False
    error: str = ""
    truncated: bool = False
    cpu_seconds: float = 0.0
    wall_seconds: float = 0.0
