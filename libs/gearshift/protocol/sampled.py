"""What the policy sampled, kept with the text the platform stored (common.v1.SampledSpan), so
that training learns exactly the sampled tokens (docs/protocol.md, section 9)."""

from __future__ import annotations

from gearshift.api.common.v1.common_pb2 import SampledSpan


def sampled_span(start: int, end: int, token_ids: list[int] | None, logprobs: list[float] | None = None) -> SampledSpan | None:
    """A sample's ids (and their log-probabilities, kept only when there is one per id), starting
    at character start of the stored text; the stored text up to end came from this sample. None
    when the server did not return the ids."""
    if not token_ids or end <= start:
        return None
    kept = logprobs if logprobs is not None and len(logprobs) == len(token_ids) else []
    return SampledSpan(start=start, end=end, token_ids=token_ids, logprobs=kept)


def shifted(span: SampledSpan, offset: int) -> SampledSpan:
    """The span in a text that holds the span's text from offset on."""
    return SampledSpan(start=span.start + offset, end=span.end + offset, token_ids=span.token_ids, logprobs=span.logprobs)
