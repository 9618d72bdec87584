"""Prompt lookup: draft tokens for a greedy row from its own context, speculative decoding
without a draft model (vLLM's "ngram" method).

Where the row's last tokens occurred before, in its prompt (a tool result the model quotes) or
in its own output (a repetition), the tokens that followed them then are the draft. One forward
feeds the row's last token and the draft together: at one row a decode step is bound by reading
the weights, so checking a few tokens costs about one step, and the step yields every draft
token the model itself would have picked, plus its own next one."""

from __future__ import annotations

MAX_NGRAM = 3  # the longest run of last tokens looked up


def propose(context: list[int], tokens: int) -> list[int]:
    """Up to `tokens` tokens that followed the latest earlier occurrence of the context's last
    MAX_NGRAM tokens, or of fewer where those never occurred; [] where not even the last did."""
    last = len(context) - 1
    best_length, best_end = 0, -1
    for end in range(last - 1, -1, -1):  # candidates end at `end`; the newest first
        length = 0
        while length < MAX_NGRAM and end - length >= 0 and context[end - length] == context[last - length]:
            length += 1
        if length > best_length:
            best_length, best_end = length, end
            if length == MAX_NGRAM:
                break
    return context[best_end + 1 : best_end + 1 + tokens] if best_length else []
