"""What a streamed completion adds at each event (Delta: answer and reasoning, already split by
the executor), and OpenAI's `stop` sequences cutting the answer (StopCut)."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass
class Delta:
    """New text of the answer (content) and of the reasoning."""

    content: str = ""
    reasoning: str = ""

    def __bool__(self) -> bool:
        return bool(self.content or self.reasoning)


class StopCut:
    """Gives out the content up to the first stop sequence, holding back just enough text to
    see a stop sequence that arrives split over pieces."""

    def __init__(self, words: list[str]):
        self.words = words
        self.keep = max(map(len, words), default=1) - 1
        self.held = ""
        self.stopped = False

    def feed(self, text: str) -> str:
        if self.stopped or not text:
            return ""
        if not self.words:
            return text
        self.held += text
        hits = [at for word in self.words if (at := self.held.find(word)) >= 0]
        if hits:
            self.stopped = True
            out, self.held = self.held[: min(hits)], ""
            return out
        cut = len(self.held) - self.keep
        if cut <= 0:
            return ""
        out, self.held = self.held[:cut], self.held[cut:]
        return out

    def finish(self) -> str:
        out, self.held = ("" if self.stopped else self.held), ""
        return out

    def cut(self, text: str) -> str:
        """The whole of a finished text, cut at the first stop sequence."""
        return self.feed(text) + self.finish()
