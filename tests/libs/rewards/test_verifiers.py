"""Every verifier on tables of true and false equivalences, and the automatic choice."""

from __future__ import annotations

import pytest
from gearshift.rewards import verifiers
from gearshift.rewards.scoring import verify
from gearshift.settings import RewardSettings

CONFIG = RewardSettings()


@pytest.mark.parametrize(
    ("answer", "reference", "same"),
    [
        ("\\boxed{\\frac{1}{2}}", "0.5", True),
        ("0.5", "\\frac{1}{2}", True),
        ("The answer is $\\boxed{42}$.", "42", True),
        ("1/2", "\\dfrac{1}{2}", True),
        ("$\\sqrt{4}$", "2", True),
        ("$(x+1)^2$", "$x^2+2x+1$", True),
        ("$\\{2, 1\\}$", "$\\{1, 2\\}$", True),
        ("1,000", "1000", True),
        ("-5.0", "-5", True),
        ("$x = 3$", "3", True),
        ("0.1", "10%", True),
        ("\\boxed{41}", "42", False),
        ("0.333", "\\frac{1}{3}", False),
        ("$\\sqrt{2}$", "2", False),
        ("3.14159", "\\pi", False),
        ("I do not know", "42", False),
        ("Paris", "Paris", True),  # a reference math-verify cannot parse falls back to exact match
    ],
)
def test_math(answer, reference, same):
    assert verifiers.math_match(answer, reference, max_chars=4000) is same


def test_math_reads_only_the_tail_of_a_long_answer():
    rambling = "7 " * 5000 + "so the result is \\boxed{3}"
    assert verifiers.math_match(rambling, "3", max_chars=100)
    assert not verifiers.math_match("\\boxed{3}" + " filler" * 100, "3", max_chars=50)


@pytest.mark.parametrize(
    ("answer", "reference", "same"),
    [
        ("Paris", "paris", True),
        ("The Eiffel Tower.", "eiffel tower", True),
        ("  New   York ", "new york", True),
        ("Ｐａｒｉｓ", "Paris", True),  # full-width letters (NFKC)
        ("an apple", "Apple!", True),
        ("Paris, France", "Paris", False),
        ("Lyon", "Paris", False),
        ("", "Paris", False),
    ],
)
def test_exact(answer, reference, same):
    assert verifiers.exact_match(answer, reference) is same


@pytest.mark.parametrize(
    ("answer", "reference", "f1"),
    [
        ("Barack Obama", "barack obama", 1.0),
        ("president Barack Obama", "Barack Obama", 0.8),  # p = 2/3, r = 1
        ("Obama", "Barack Hussein Obama", 0.5),  # p = 1, r = 1/3
        ("Lyon", "Paris", 0.0),
        ("", "Paris", 0.0),
        ("the", "a", 1.0),  # both normalize to nothing
    ],
)
def test_token_f1(answer, reference, f1):
    assert verifiers.token_f1(answer, reference) == pytest.approx(f1)


def test_f1_threshold():
    assert verifiers.f1_match("president Barack Obama", "Barack Obama", threshold=0.8)
    assert not verifiers.f1_match("Obama", "Barack Hussein Obama", threshold=0.8)
    assert verifiers.f1_match("Obama", "Barack Hussein Obama", threshold=0.5)


@pytest.mark.parametrize(
    ("answer", "letter"),
    [
        ("B", "B"),
        ("(C)", "C"),
        ("D.", "D"),
        ("A) Paris", "A"),
        ("The answer is (b).", "B"),
        ("Answer: E", "E"),
        ("\\boxed{C}", "C"),
        ("After weighing both, the correct option is D", "D"),
        ("A cat sat on the mat", None),
        ("Paris", None),
        ("", None),
    ],
)
def test_choice_letter(answer, letter):
    assert verifiers.choice_letter(answer) == letter


@pytest.mark.parametrize(
    ("answer", "reference", "same"),
    [("(B)", "B", True), ("The answer is B", "(B)", True), ("C", "B", False), ("Paris", "B", False)],
)
def test_choice(answer, reference, same):
    assert verifiers.choice_match(answer, reference) is same


@pytest.mark.parametrize(
    ("answer", "reference", "same"),
    [
        ("42", "42.0", True),
        ("It costs $1,234.50 in total", "1234.5", True),
        ("3/4", "0.75", True),
        ("2e-3", "0.002", True),
        ("100.004", "100", True),  # within the relative tolerance 1e-4
        ("100.02", "100", False),
        ("first 5 then 7", "7", True),  # the last number is the answer
        ("-3", "3", False),
        ("no number here", "3", False),
        ("0", "1e-12", True),  # the absolute tolerance handles answers near 0
    ],
)
def test_numeric(answer, reference, same):
    assert verifiers.numeric_match(answer, reference, CONFIG.numeric_rel_tol, CONFIG.numeric_abs_tol) is same


@pytest.mark.parametrize(
    ("reference", "verifier"),
    [
        ("42", verifiers.MATH),
        ("-0.5", verifiers.MATH),
        ("1,000", verifiers.MATH),
        ("\\frac{1}{2}", verifiers.MATH),
        ("$x^2$", verifiers.MATH),
        ("2x + 1", verifiers.MATH),
        ("B", verifiers.CHOICE),
        ("(C)", verifiers.CHOICE),
        ("Paris", verifiers.PHRASE),
        ("World War 2", verifiers.PHRASE),
        ("Barack Obama", verifiers.PHRASE),
        ("the treaty that ended the Thirty Years War", verifiers.EXACT),
    ],
)
def test_auto_choice(reference, verifier):
    assert verifiers.auto_verifier(reference) == verifier


@pytest.mark.parametrize(
    ("answer", "reference"),
    [
        ("The capital of Japan is Tokyo.", "Tokyo"),
        ("Tokyo", "Tokyo"),
        ("tokyo!", "Tokyo"),
        ("It is Tōkyō, the largest city.", "Tokyo"),
        ("The capital of Japan is Tokyo, not Kyoto.", "Tokyo"),
        ("Paris, France", "Paris"),
        ("Barack Obama was the 44th president.", "Barack Obama"),
        ("It is 8,849 metres tall.", "8849"),
        ("Brasília.", "Brasilia"),
        ("The answer: Mount Everest", "Mount Everest"),
    ],
)
def test_phrase_match_accepts_a_short_answer_that_commits_to_the_reference(answer, reference):
    assert verifiers.phrase_match(answer, reference)
    assert verify(answer, reference, verifiers.auto_verifier(reference), CONFIG)  # what Solve(reference_answer=...) uses


@pytest.mark.parametrize(
    ("answer", "reference"),
    [
        ("It is not Tokyo.", "Tokyo"),
        ("The capital is not Tokyo but Kyoto.", "Tokyo"),
        ("Definitely isn't Tokyo", "Tokyo"),
        ("Tokyo or Kyoto", "Tokyo"),
        ("Either Tokyo or Osaka.", "Tokyo"),
        ("Maybe Tokyo", "Tokyo"),
        ("Tokyo and Kyoto", "Tokyo"),
        ("Osaka, Tokyo, Kyoto", "Tokyo"),
        ("Tokyoite", "Tokyo"),
        ("Kyoto", "Tokyo"),
        ("It is 18849 m.", "8849"),
        ("Tokyo " * 31, "Tokyo"),
        ("Obama", "Barack Obama"),
    ],
)
def test_phrase_match_refuses_denials_hedges_lists_and_partial_words(answer, reference):
    assert not verifiers.phrase_match(answer, reference)


@pytest.mark.parametrize("verifier", [verifiers.MATH, verifiers.EXACT, verifiers.PHRASE, verifiers.F1, verifiers.CHOICE, verifiers.NUMERIC])
def test_an_empty_answer_is_never_correct(verifier):
    assert not verify("   ", "the", verifier, CONFIG)
    assert not verify("", "", verifier, CONFIG)
