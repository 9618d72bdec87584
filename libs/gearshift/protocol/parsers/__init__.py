"""The text formats policies write, read in one place: one streaming splitter (base.Splitter),
one registry of formats looked up by name (a2fm, think, hermes, qwen3_coder; a file each, as
vLLM keeps its parsers), one tool-call grammar with one id scheme and one builder of OpenAI's
`tool_calls` (calls.py). The executor, the gateway, the policy server, the format reward, the
training data and the vLLM plugins read text through it and own no parser.

Standard library only, and relative imports only: vLLM's virtual environment loads the package
by path without gearshift installed."""

from __future__ import annotations

from . import a2fm, hermes, qwen3_coder, think  # noqa: F401  (each registers its format)
from .base import FORMATS, Parsed, Piece, Splitter, get

__all__ = ["FORMATS", "Parsed", "Piece", "Splitter", "get"]
