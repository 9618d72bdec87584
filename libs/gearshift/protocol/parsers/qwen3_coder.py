"""qwen3_coder: <tool_call> blocks of XML functions, thinking in <think> tags:
    <function=name><parameter=x>1</parameter></function>"""

from __future__ import annotations

from . import calls as grammar
from .base import register
from .think import ThinkSplitter, read_functions


@register("qwen3_coder")
class Qwen3CoderSplitter(ThinkSplitter):
    def read_block(self, body: str) -> grammar.Block:
        return read_functions(body)
