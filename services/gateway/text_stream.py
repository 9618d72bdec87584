"""Which of the policy's text is the answer and which is reasoning, as it streams.

The executor streams the policy's raw text (OutputChunk), tags and all, continuing the opener
the platform wrote for the mode (prompts.MODE_OPENERS: `<answer>` in instant mode, `<reasoning>`
in reasoning mode). TagSplitter follows the `<answer>` and `<reasoning>` tags through the chunks
and gives out what is between them, as vLLM's reasoning parsers give content and
reasoning_content, trimmed at both ends as a2fm.tag_content trims a block: leading whitespace is
dropped, trailing whitespace held back until more text follows it. Inside a block only its own
closing tag is a tag (the rest is text, as tag_content reads it), except that `<answer>` also
ends a reasoning block its closing tag never ended.

Under the native protocol the engine's parsers split the text already (OutputChunk.text is
content, OutputChunk.reasoning the reasoning): Trimmed alone trims the content.

StopCut ends the content at the first of the client's stop sequences (OpenAI's `stop`)."""

from __future__ import annotations

from dataclasses import dataclass

ANSWER, REASONING = "answer", "reasoning"
_OPENING = {f"<{tag}>": tag for tag in (ANSWER, REASONING)}
_CLOSING = {tag: f"</{tag}>" for tag in (ANSWER, REASONING)}


@dataclass
class Delta:
    """New text of the answer (content) and of the reasoning."""

    content: str = ""
    reasoning: str = ""

    def __bool__(self) -> bool:
        return bool(self.content or self.reasoning)


class Trimmed:
    """One block's text with its ends trimmed, given out as it comes."""

    def __init__(self) -> None:
        self.started = False
        self.held = ""  # trailing whitespace, given out once text follows it

    def feed(self, text: str) -> str:
        if not self.started:
            text = text.lstrip()
            if not text:
                return ""
            self.started = True
        body = self.held + text
        kept = body.rstrip()
        self.held = body[len(kept):]
        return kept


class TagSplitter:
    """Feeds on the policy's text; returns the answer and reasoning text each piece adds."""

    def __init__(self) -> None:
        self.inside: str | None = None  # ANSWER, REASONING or None (plans, tool calls, the head)
        self.pending = ""  # text from a "<" that may still become a tag
        self.blocks = {ANSWER: Trimmed(), REASONING: Trimmed()}

    def feed(self, text: str) -> Delta:
        out = Delta()
        rest = self.pending + text
        self.pending = ""
        while rest:
            at = rest.find("<")
            if at < 0:
                self._text(rest, out)
                break
            self._text(rest[:at], out)
            rest = rest[at:]
            tag = self._tag(rest)
            if tag is None:  # may still become a tag: wait for more text
                self.pending = rest
                break
            if tag == "":  # a "<" that is no tag of ours
                self._text("<", out)
                rest = rest[1:]
                continue
            rest = rest[len(tag):]
            self.inside = _OPENING.get(tag)  # an opening tag enters its block, a closing one leaves it
        return out

    def finish(self) -> Delta:
        """The text held back at the end of the stream (a "<" that never became a tag)."""
        out = Delta()
        self._text(self.pending, out)
        self.pending = ""
        return out

    def _tag(self, text: str) -> str | None:
        """The tag text starts with; "" when it starts with none; None when it may yet."""
        wanted = [_CLOSING[self.inside]] if self.inside else list(_OPENING)
        if self.inside == REASONING:
            wanted.append("<answer>")
        for tag in wanted:
            if text.startswith(tag):
                return tag
        return None if any(tag.startswith(text) for tag in wanted) else ""

    def _text(self, text: str, out: Delta) -> None:
        if not text or self.inside is None:
            return
        piece = self.blocks[self.inside].feed(text)
        if self.inside == ANSWER:
            out.content += piece
        else:
            out.reasoning += piece


def split_text(text: str) -> Delta:
    """The whole answer and reasoning of a finished text (a stored transcript)."""
    splitter = TagSplitter()
    whole = splitter.feed(text)
    rest = splitter.finish()
    return Delta(whole.content + rest.content, whole.reasoning + rest.reasoning)


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
