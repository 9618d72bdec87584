"""Correctness verifiers: each takes (answer, reference) and says whether the answer is right.

All are synchronous and free of I/O. The math verifier calls math-verify with its signal-based
timeouts off (they only work on the main thread), so callers that need a wall-clock bound run
it in a worker thread and stop waiting (see gearshift.services.reward.core).
"""

from __future__ import annotations

import logging
import math
import re
import string
import unicodedata
from collections import Counter
from fractions import Fraction

from math_verify import parse as math_parse
from math_verify import verify as math_verify

MATH, EXACT, PHRASE, F1, CHOICE, NUMERIC, JUDGE = "math", "exact", "phrase", "f1", "choice", "numeric", "judge"

# Phrase match: a short reference inside a short answer ("The capital of Japan is Tokyo.").
PHRASE_MAX_REFERENCE_WORDS = 5  # longer references are checked by exact match
PHRASE_MAX_ANSWER_WORDS = 30  # a longer answer is an essay, not an answer
_NEGATIONS = frozenset({"not", "no", "never", "nor", "neither", "isnt", "arent", "wasnt", "werent", "doesnt", "dont", "didnt", "cannot", "cant"})
_HEDGES = frozenset({"or", "either", "maybe", "perhaps", "possibly", "probably", "unsure", "guess"})
_NEGATION_REACH = 3  # a negation this many words before the reference denies it

# math-verify warns on every call that its timeouts are off; we bound it from outside instead.
logging.getLogger("math_verify").setLevel(logging.ERROR)

_ARTICLES = re.compile(r"\b(a|an|the)\b")
_PUNCTUATION = str.maketrans("", "", string.punctuation)
_BOXED = re.compile(r"\\boxed\s*\{([^{}]*)\}")
_NUMBER = re.compile(r"[-+]?(?:\d{1,3}(?:,\d{3})+|\d+)(?:\.\d+)?(?:[eE][-+]?\d+)?(?:\s*/\s*\d+)?|[-+]?\.\d+")
_LATEX_MARKERS = ("\\", "$", "^", "_{")
_MATH_CHARS = re.compile(r"^[A-Za-z0-9\s.,+\-*/=()\[\]{}<>%!]+$")
_WORD = re.compile(r"[A-Za-z]{2,}")
_CHOICE_ALONE = re.compile(r"^\(?\[?([A-J])\]?\)?[.:]?$")
_CHOICE_STATED = re.compile(r"\b(?:answer|option|choice)\s*(?:is|:)?\s*:?\s*\(?([A-J])\)?(?![A-Za-z])", re.I)
_CHOICE_LEADING = re.compile(r"^\(?([A-J])[).:]\s")


def normalize(text: str) -> str:
    """SQuAD-style normalization: Unicode NFKC, lower case, no punctuation, no articles,
    single spaces."""
    text = unicodedata.normalize("NFKC", text).lower().translate(_PUNCTUATION)
    return " ".join(_ARTICLES.sub(" ", text).split())


def exact_match(answer: str, reference: str) -> bool:
    """Normalized exact match."""
    return normalize(answer) == normalize(reference)


def phrase_words(text: str) -> list[str]:
    """The words phrase matching compares: accents, case, punctuation and thousands separators
    dropped ("Tōkyō," -> "tokyo", "1,000" -> "1000", "isn't" -> "isnt")."""
    text = unicodedata.normalize("NFKD", text).encode("ascii", "ignore").decode().lower()
    text = re.sub(r"(?<=\d)[,_](?=\d{3})|['’]", "", text)
    return re.sub(r"[^a-z0-9]+", " ", text).split()


def phrase_match(answer: str, reference: str, max_words: int = PHRASE_MAX_ANSWER_WORDS) -> bool:
    """The reference appears as whole words in a short answer that commits to it: not denied by
    a negation just before it ("not Tokyo"), not hedged or offered among other candidates
    ("Tokyo or Kyoto", "Osaka, Tokyo, Kyoto", "Tokyo and Kyoto")."""
    said, wanted = phrase_words(answer), phrase_words(reference)
    if not said or not wanted or len(said) > max_words or _HEDGES & set(said):
        return False
    starts = [i for i in range(len(said) - len(wanted) + 1) if said[i : i + len(wanted)] == wanted]
    return any(_committed(said, answer, i, i + len(wanted)) for i in starts)


def _committed(said: list[str], answer: str, start: int, end: int) -> bool:
    if _NEGATIONS & set(said[max(0, start - _NEGATION_REACH) : start]):
        return False
    if "and" in (said[start - 1] if start else None, said[end] if end < len(said) else None):
        return False  # "Tokyo and Kyoto": two candidates
    return max((len(part.split(",")) for part in re.split(r"[.;:!?]", answer)), default=1) < 3  # "Osaka, Tokyo, Kyoto"


def token_f1(answer: str, reference: str) -> float:
    """Token-level F1 between the normalized answer and reference, in [0, 1]."""
    predicted, gold = normalize(answer).split(), normalize(reference).split()
    if not predicted or not gold:
        return float(predicted == gold)
    overlap = sum((Counter(predicted) & Counter(gold)).values())
    if overlap == 0:
        return 0.0
    precision, recall = overlap / len(predicted), overlap / len(gold)
    return 2 * precision * recall / (precision + recall)


def f1_match(answer: str, reference: str, threshold: float) -> bool:
    """Token F1 at or above threshold."""
    return token_f1(answer, reference) >= threshold


def choice_letter(text: str) -> str | None:
    """The multiple-choice letter (A-J) a text names: "B", "(B)", "B) Paris", "The answer is B",
    "\\boxed{B}"; None when it names none."""
    text = _strip_boxed(text).strip()
    alone = _CHOICE_ALONE.match(text)
    if alone:
        return alone.group(1)
    stated = _CHOICE_STATED.findall(text)
    if stated:
        return stated[-1].upper()
    leading = _CHOICE_LEADING.match(text)
    return leading.group(1) if leading else None


def choice_match(answer: str, reference: str) -> bool:
    """Same multiple-choice letter."""
    letter = choice_letter(answer)
    return letter is not None and letter == choice_letter(reference)


def parse_number(text: str) -> float | None:
    """The last number in a text ("1,234.5", "-3/4", "2e-3", "45%" -> 45.0); None when none."""
    found = _NUMBER.findall(_strip_boxed(text))
    if not found:
        return None
    token = found[-1].replace(",", "").replace(" ", "")
    try:
        return float(Fraction(token)) if "/" in token else float(token)
    except (ValueError, ZeroDivisionError, OverflowError):
        return None


def numeric_match(answer: str, reference: str, rel_tol: float, abs_tol: float) -> bool:
    """The answer's last number equals the reference's within the tolerances."""
    expected, got = parse_number(reference), parse_number(answer)
    if expected is None or got is None:
        return False
    return math.isclose(got, expected, rel_tol=rel_tol, abs_tol=abs_tol)


def _math_parse(text: str) -> list:
    parsed = math_parse(text, parsing_timeout=None)
    if not parsed and "$" not in text:
        # Bare LaTeX such as "\dfrac{3}{4}" only parses inside math delimiters.
        parsed = math_parse(f"${text}$", parsing_timeout=None)
    return parsed


def math_match(answer: str, reference: str, max_chars: int) -> bool:
    """Mathematical equivalence with math-verify (boxed answers, fractions, decimals, LaTeX).

    Only the last max_chars characters of the answer are read: the final answer is at the end
    and sympy's cost grows with the text. A reference math-verify cannot parse falls back to
    normalized exact match, so a verbal reference is still checked.
    """
    gold = _math_parse(reference)
    if not gold:
        return exact_match(answer, reference)
    predicted = _math_parse(answer[-max_chars:])
    return bool(predicted) and math_verify(gold, predicted, timeout_seconds=None)


def looks_like_math(reference: str) -> bool:
    """Numbers, fractions, LaTeX and short formulas."""
    text = reference.strip()
    if any(marker in text for marker in _LATEX_MARKERS):
        return True
    # Digits, operators, brackets and one-letter variables: "2x+1", "(3, 4)", "-1/2", "45%".
    return any(ch.isdigit() for ch in text) and bool(_MATH_CHARS.match(text)) and not _WORD.search(text)


def auto_verifier(reference: str) -> str:
    """The verifier the reference calls for: a single letter A-J is a multiple-choice answer,
    numbers and LaTeX are math, a short phrase is phrase match, anything else exact match."""
    if _CHOICE_ALONE.match(reference.strip()):
        return CHOICE
    if looks_like_math(reference):
        return MATH
    return PHRASE if len(phrase_words(reference)) <= PHRASE_MAX_REFERENCE_WORDS else EXACT


def _strip_boxed(text: str) -> str:
    return _BOXED.sub(r"\1", text)
