"""Rewards that are a client's verdict on a served answer (the gateway's POST /v1/feedback): the
gateway stores them with SetReward, the store marks them (its feedback column), and training
selects them (DataConfig.feedback_only). No imports: the store reads this on every write."""

from __future__ import annotations

# Reward.verifier of a client's own verdict (a reward in [0, 1], or correct / incorrect).
FEEDBACK_VERIFIER = "feedback"
# Reward.verifier prefix of a reference answer the client sent, graded on its behalf by a grader:
# "feedback:<grader>".
FEEDBACK_GRADED_PREFIX = f"{FEEDBACK_VERIFIER}:"


def feedback_verifier(grader: str = "") -> str:
    """The verifier to store: "feedback", or "feedback:<grader>" when a grader decided."""
    return f"{FEEDBACK_GRADED_PREFIX}{grader}" if grader else FEEDBACK_VERIFIER


def is_feedback(verifier: str) -> bool:
    """Whether a reward with this verifier is a client's verdict."""
    return verifier == FEEDBACK_VERIFIER or verifier.startswith(FEEDBACK_GRADED_PREFIX)
