"""The three A^2FM modes by name, and the two ways a mode can be chosen by the platform instead
of forced: the one map between the names people and configs use and the proto enum."""

from __future__ import annotations

from typing import Literal, get_args

from gearshift.api.common.v1.common_pb2 import Mode

ModeName = Literal["instant", "reasoning", "agentic"]
MODE_NAMES: tuple[str, ...] = get_args(ModeName)
MODE_OF: dict[str, int] = {"instant": Mode.MODE_INSTANT, "reasoning": Mode.MODE_REASONING, "agentic": Mode.MODE_AGENTIC}
NAME_OF: dict[int, str] = {mode: name for name, mode in MODE_OF.items()}


def mode_name(mode: int, unset: str = "none") -> str:
    """"instant", "reasoning" or "agentic" for a Mode value (unset for MODE_UNSPECIFIED)."""
    return NAME_OF.get(mode, unset)
