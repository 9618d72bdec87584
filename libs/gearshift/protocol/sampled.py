"""What the policy sampled, kept with the text the platform stored (common.v1.SampledSpan), so
that training learns exactly the sampled tokens (docs/protocol.md, section 9)."""

from __future__ import annotations

from gearshift.api.common.v1.common_pb2 import SampledSpan


def sampled_span(start: int, end: int, token_ids: list[int] | None) -> SampledSpan | None:
    """A sample's ids, starting at character start of the stored text; the stored text up to end
    came from this sample. None when the server did not return the ids."""
    if not token_ids or end <= start:
        return None
    return SampledSpan(start=start, end=end, token_ids=token_ids)


def shifted(span: SampledSpan, offset: int) -> SampledSpan:
    """The span in a text that holds the span's text from offset on."""
    return SampledSpan(start=span.start + offset, end=span.end + offset, token_ids=span.token_ids)
