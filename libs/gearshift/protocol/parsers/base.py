"""The one streaming splitter every format builds on, and the registry formats are looked up in.

A format is a Splitter subclass with one method per state: feed() text as it is generated,
finish() at the end. A tag cut across two chunks is held back until it is whole, so any
chunking gives the pieces the whole text gives (parse() is feed + finish). Content and reasoning
are trimmed at both ends as they stream: leading whitespace is dropped, trailing whitespace
waits until more text of its kind follows.

Standard library only: vLLM's own virtual environment loads this package by path
(gearshift/vllm_plugins/a2fm_parsers.py)."""

from __future__ import annotations

from dataclasses import dataclass, field

CONTENT, REASONING, TOOL_CALL = "content", "reasoning", "tool_call"


@dataclass
class Piece:
    """A part of the output: kind is content, reasoning or tool_call (then call is set), or a
    kind of the format's own (TagReader: text and tag)."""

    kind: str
    text: str = ""
    call: dict | None = None


@dataclass
class Parsed:
    """A whole output in OpenAI's fields (None where empty)."""

    reasoning: str | None
    content: str | None
    tool_calls: list[dict] = field(default_factory=list)


def joined(pieces: list[Piece]) -> Parsed:
    def text(kind: str) -> str | None:
        return "".join(piece.text for piece in pieces if piece.kind == kind) or None

    return Parsed(text(REASONING), text(CONTENT), [piece.call for piece in pieces if piece.kind == TOOL_CALL])


def held_back(text: str, tags: tuple[str, ...]) -> int:
    """Length of the longest end of text that could still grow into one of the tags."""
    longest = 0
    for tag in tags:
        for size in range(min(len(tag) - 1, len(text)), longest, -1):
            if text.endswith(tag[:size]):
                longest = size
                break
    return longest


def first(text: str, tags: tuple[str, ...]) -> tuple[int, str]:
    """(where, which) of the first of the tags in text; (-1, "") when none is."""
    hits = [(at, tag) for tag in tags if (at := text.find(tag)) >= 0]
    return min(hits) if hits else (-1, "")


class Splitter:
    """The streaming engine: a buffer read by the method of the current state. A state method
    consumes what the buffer allows and returns True when the state changed and the buffer should
    be read again, False when it waits for more text. _finish places what is left at the end.

    trim: content and reasoning are trimmed at both ends (off: the text as generated)."""

    name = ""  # the registry's name for the format
    initial = ""  # the state a generation starts in unless told otherwise

    def __init__(self, state: str | None = None, trim: bool = True):
        self.state = state or self.initial
        self.trim = trim
        self._buffer = ""
        self._pending: dict[str, str] = {}  # trailing whitespace held back, per kind
        self._started: set[str] = set()

    def feed(self, text: str) -> list[Piece]:
        self._buffer += text
        pieces: list[Piece] = []
        while self._buffer and getattr(self, f"_{self.state}")(pieces):
            pass
        return pieces

    def finish(self) -> list[Piece]:
        pieces: list[Piece] = []
        rest, self._buffer = self._buffer, ""
        self._finish(pieces, rest)
        return pieces

    def release(self) -> str:
        """The text held back unread (a tag not yet whole), handed over raw: for a reader that
        takes the rest of the stream from here (vLLM's tool phase after the reasoning)."""
        rest, self._buffer = self._buffer, ""
        return rest

    @classmethod
    def parse(cls, text: str, *args, **kwargs) -> Parsed:
        """The whole-text form: feed + finish, joined by kind."""
        splitter = cls(*args, **kwargs)
        return joined(splitter.feed(text) + splitter.finish())

    def _finish(self, pieces: list[Piece], rest: str) -> None:
        raise NotImplementedError

    def _until(self, pieces: list[Piece], kind: str | None, tags: tuple[str, ...]) -> str | None:
        """Gives the buffer's text up to the first of the tags as kind (None: drops it) and
        returns that tag, the buffer past it; None when no tag is whole yet (the end that may
        grow into one stays in the buffer)."""
        at, tag = first(self._buffer, tags)
        cut = at if at >= 0 else len(self._buffer) - held_back(self._buffer, tags)
        if kind is not None:
            self._emit(pieces, kind, self._buffer[:cut])
        self._buffer = self._buffer[cut + len(tag):]
        return tag or None

    def _emit(self, pieces: list[Piece], kind: str, text: str) -> None:
        if not self.trim or kind not in (CONTENT, REASONING):
            if text:
                pieces.append(Piece(kind, text))
            return
        if kind not in self._started:
            text = text.lstrip()
        if not text:
            return
        body = text.rstrip()
        if body:
            pieces.append(Piece(kind, self._pending.pop(kind, "") + body))
            self._started.add(kind)
        self._pending[kind] = self._pending.get(kind, "") + text[len(body):]


FORMATS: dict[str, type[Splitter]] = {}


def register(name: str):
    """Class decorator: the format's splitter under its name."""
    def add(cls: type[Splitter]) -> type[Splitter]:
        cls.name = name
        FORMATS[name] = cls
        return cls
    return add


def get(name: str) -> type[Splitter]:
    try:
        return FORMATS[name]
    except KeyError:
        raise ValueError(f"unknown output format {name!r}; one of {', '.join(sorted(FORMATS))}") from None
