"""Text and tags, as they stream: the tokenizer the A^2FM readers (the episode's answer and
reasoning, the format reward's blocks, a tag's content, the CLI's live view) read by."""

from __future__ import annotations

from .base import Piece, Splitter

TEXT, TAG = "text", "tag"


class TagReader(Splitter):
    """Pieces of kind text (verbatim) and tag (one of the tags, whole)."""

    initial = TEXT

    def __init__(self, tags: tuple[str, ...]):
        super().__init__(trim=False)
        self.tags = tags

    def _text(self, pieces: list[Piece]) -> bool:
        tag = self._until(pieces, TEXT, self.tags)
        if tag is None:
            return False
        pieces.append(Piece(TAG, tag))
        return True

    def _finish(self, pieces: list[Piece], rest: str) -> None:
        self._emit(pieces, TEXT, rest)


def read(text: str, tags: tuple[str, ...]) -> list[Piece]:
    """The whole text's pieces."""
    reader = TagReader(tags)
    return reader.feed(text) + reader.finish()
