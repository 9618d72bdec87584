"""hermes: <tool_call> blocks of JSON objects {"name": ..., "arguments": {...}} (calls.py's
grammar, which reads JSON and Python literals alike), thinking in <think> tags."""

from __future__ import annotations

from . import calls as grammar
from .base import register
from .think import ThinkSplitter


@register("hermes")
class HermesSplitter(ThinkSplitter):
    def read_block(self, body: str) -> grammar.Block:
        return grammar.read_block(body)
