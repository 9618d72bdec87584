"""Suites: deterministic by seed, stable ids, disjoint splits, the suites' own graders."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from gearshift.evaluation.suites import DEFAULT_FAMILIES, FAMILIES, HEADLINE_FAMILIES, SPLITS, Facts, family_of, generated_suite, get_suite, jsonl_suite, split_of

GENERATED = [name for name in FAMILIES if name != "facts"]  # facts is a fixed table: seeds only reorder it


def fingerprint(items):
    return [(item.id, item.question, item.answer, item.difficulty, item.domain, item.split) for item in items]


def test_same_seed_same_items_other_seed_other_items():
    first = fingerprint(generated_suite("x", GENERATED, seed=7).items("test", 12))
    again = fingerprint(generated_suite("x", GENERATED, seed=7).items("test", 12))
    other = fingerprint(generated_suite("x", GENERATED, seed=8).items("test", 12))
    assert first == again and len(first) == 12
    assert {q for _, q, *_ in first}.isdisjoint({q for _, q, *_ in other})


def test_asking_for_more_items_keeps_the_first_ones():
    suite = get_suite("default")
    assert fingerprint(suite.items("dev", 5)) == fingerprint(suite.items("dev", 12))[:5]


def test_splits_are_disjoint_by_id_and_by_question():
    suite = get_suite("default")
    by_split = {split: suite.items(split, 80) for split in SPLITS}
    for split, items in by_split.items():
        assert len(items) == 80 and {item.split for item in items} == {split}
        assert all(split_of(item.id) == split for item in items)
    for a in SPLITS:
        for b in SPLITS:
            if a < b:
                assert {i.id for i in by_split[a]}.isdisjoint(i.id for i in by_split[b])
                assert {i.question for i in by_split[a]}.isdisjoint(i.question for i in by_split[b])


def test_default_suite_mixes_every_family_round_robin():
    items = get_suite("default").items("test", 10)
    assert [item.id.split("-s")[0] for item in items] == list(DEFAULT_FAMILIES) * 2
    assert {item.domain for item in items} == {"arithmetic", "word_problems", "facts"}
    assert all(item.difficulty in {"1", "2", "3"} for item in items)


@pytest.mark.parametrize("name", ["basic_arithmetic", "chain_sum", "gsm_symbolic", "large_multiplication"])
def test_reference_answers_pass_their_own_grader_and_wrong_ones_fail(name):
    suite = get_suite(name)
    for item in suite.items("train", 6):
        assert suite.grade(item, item.answer) and suite.grade(item, f" {item.answer}\n")
        assert not suite.grade(item, str(int(item.answer) + 1))


def test_large_multiplication_is_graded_exactly():
    suite = get_suite("large_multiplication")
    item = next(item for item in suite.items("test", 6) if item.difficulty == "3")  # two 7-digit factors
    a, b = (int(x) for x in item.question.removeprefix("What is ").split("?")[0].split(" * "))
    assert len(str(a)) == len(str(b)) == 7 and item.answer == str(a * b)
    product = a * b
    assert suite.grade(item, f"The product is {product:,}.")
    assert not suite.grade(item, str(product + 10)) and not suite.grade(item, f"{product} or {product + 1}")
    assert not suite.grade(item, f"{product / 1e6:.3f} million")


def test_facts_are_a_deterministic_shuffle_of_the_table_split_by_id():
    table = Facts().rows()
    items = [item for split in SPLITS for item in get_suite("facts").items(split)]
    assert len(items) == len(table) and {item.question for item in items} == {row["question"] for row in table}
    assert fingerprint(get_suite("facts").items("test")) == fingerprint(get_suite("facts").items("test"))
    reordered = [item.question for item in generated_suite("x", ["facts"], seed=99).items("train", 8)]
    assert reordered != [item.question for item in get_suite("facts").items("train", 8)]
    assert {item.difficulty for item in items} == {"1", "2", "3"} and {item.domain for item in items} == {"facts"}


def test_facts_corpus_ids_name_documents_of_the_sandbox_corpus():
    corpus = Path(__file__).parents[3] / "services" / "sandbox" / "sample_corpus.jsonl"
    documents = {json.loads(line)["id"] for line in corpus.read_text().splitlines() if line.strip()}
    assert {row["corpus_id"] for row in Facts().rows() if row["corpus_id"]} <= documents


# Words that make a phrase grader refuse an answer that contains them (a negation, a hedge, "and" between
# candidates), so no reference may contain one; nor more than one comma ("A, B, C" reads as a list).
REFUSING_WORDS = {"not", "no", "never", "nor", "neither", "cannot", "or", "either", "maybe", "perhaps", "possibly", "probably", "and"}


def test_facts_table_holds_a_held_out_measurement_and_every_reference_grades_as_itself():
    table, suite = Facts().rows(), get_suite("facts")
    assert len(suite.items("test")) >= 60
    assert all(set(row) == {"question", "answer", "aliases", "difficulty", "corpus_id"} for row in table)
    questions = [" ".join(row["question"].lower().split()) for row in table]
    assert len(set(questions)) == len(questions) and all(question.endswith("?") for question in questions)
    references = {row["question"]: [row["answer"], *row["aliases"]] for row in table}
    for reference in (reference for row_references in references.values() for reference in row_references):
        words = set("".join(c if c.isalnum() else " " for c in reference.lower().replace("'", "")).split())
        assert words and not words & REFUSING_WORDS and reference.count(",") <= 1, reference
    for item in (item for split in SPLITS for item in suite.items(split)):
        for reference in references[item.question]:
            assert suite.grade(item, reference) and suite.grade(item, f"The answer is {reference}."), (item.question, reference)


def test_facts_grader_wants_the_whole_reference_in_a_short_answer():
    suite = get_suite("facts")
    for item in suite.items("train"):
        assert suite.grade(item, item.answer) and suite.grade(item, f"The answer is {item.answer}.")
    everest = next(item for item in suite.items("train") + suite.items("test") if item.answer == "Mount Everest")
    assert suite.grade(everest, "It is Mount  Everest!") and suite.grade(everest, "everest")  # an alias
    assert not suite.grade(everest, "Everestville") and not suite.grade(everest, "K2")
    assert not suite.grade(everest, "Not Everest, K2.") and not suite.grade(everest, "Everest or K2")
    assert not suite.grade(everest, "Everest " * 31)  # a wall of guesses is no answer


def test_gsm_grader_takes_only_a_full_score():
    suite = get_suite("gsm_symbolic")
    item = suite.items("test", 1)[0]
    assert suite.grade(item, item.answer)
    assert not suite.grade(item, "12345678")  # reasoning-gym gives a wrong number 0.01, not 0


def test_jsonl_suite(tmp_path):
    path = tmp_path / "capitals.jsonl"
    rows = [
        {"question": "Capital of France?", "answer": "Paris", "difficulty": 1, "domain": "geo", "split": "test"},
        {"id": "q2", "question": "What is 6*7?", "answer": "42", "split": "test"},
        {"question": "Capital of Peru?", "answer": "Lima"},
        {"id": "q4", "question": "7*8?", "answer": "56", "domain": "math", "family": "products", "split": "test"},
    ]
    path.write_text("\n".join(json.dumps(row) for row in rows) + "\n\n")
    suite = get_suite(str(path))
    assert suite.name == "capitals"
    test = suite.items("test")
    assert [item.question for item in test][:2] == ["Capital of France?", "What is 6*7?"]
    first, second = test[0], test[1]
    assert (first.difficulty, first.domain, second.id, second.domain, second.difficulty) == ("1", "geo", "q2", "general", "")
    # Reports group by family: a row's own, else its domain, else none (reported as "other").
    families = {item.question: item.labels(0).get("family") for item in test}
    assert (families["Capital of France?"], families["What is 6*7?"], families["7*8?"]) == ("geo", None, "products")
    assert fingerprint(jsonl_suite(path).items("test")) == fingerprint(test)  # ids stable across loads
    assert suite.grade(first, "paris") and not suite.grade(first, "Lyon")
    assert suite.grade(second, "42.0") and not suite.grade(second, "41")
    total = sum(len(suite.items(split)) for split in SPLITS)
    assert total == 4


def test_bad_inputs_are_refused(tmp_path):
    bad = tmp_path / "bad.jsonl"
    bad.write_text(json.dumps({"question": "no answer"}) + "\n")
    with pytest.raises(ValueError, match="bad.jsonl:1"):
        jsonl_suite(bad)
    with pytest.raises(ValueError, match="unknown suite"):
        get_suite("no-such-suite")
    with pytest.raises(ValueError, match="unknown split"):
        get_suite("default").items("validation", 1)


def test_headline_suite_has_sixty_test_items_per_family():
    suite = get_suite("headline")
    items = suite.items_per_family("test", 60)
    assert len(items) == 240 and {item.split for item in items} == {"test"}
    assert [family_of(item.id) for item in items] == [f for f in HEADLINE_FAMILIES for _ in range(60)]
    assert items[:60] == suite.items_per_family("test", 78)[:60]  # asking for more moves nothing
    train = {item.id for item in suite.items_per_family("train", 15)}
    assert not train & {item.id for item in items}
    with pytest.raises(ValueError, match="facts has only 78 test items"):
        suite.items_per_family("test", 79)
    assert family_of("q7") == "" and family_of("chain_sum-s1234-000012") == "chain_sum"


def family_file(path: Path, rows_per_family: dict[str, int]) -> Path:
    """A JSONL suite whose families' test rows are interleaved, as a hand-made file often has them."""
    rows = [{"id": f"{family}-{i}", "question": f"{family} {i}?", "answer": str(i), "split": "test", "family": family}
            for i in range(max(rows_per_family.values())) for family, count in rows_per_family.items() if i < count]
    path.write_text("".join(json.dumps(row) + "\n" for row in rows))
    return path


def test_a_files_items_per_family_are_per_family_label(tmp_path):
    """A file is one source of many families: n of each family its rows name, not n of the file
    (a suite of 8 families asked for 8 per family ran 8 items)."""
    families = [f"family{k}" for k in range(8)]
    suite = jsonl_suite(family_file(tmp_path / "eight.jsonl", dict.fromkeys(families, 10)))
    items = suite.items_per_family("test", 8)
    assert len(items) == 64
    assert [item.family for item in items] == [f for f in families for _ in range(8)]
    assert [item.id for item in items[:2]] == ["family0-0", "family0-1"]  # each family's first rows, in file order
    untagged = tmp_path / "untagged.jsonl"  # no family: the domain is the family, as reports group
    untagged.write_text("".join(json.dumps({"question": f"{d} {i}?", "answer": "1", "split": "test", "domain": d}) + "\n"
                                for i in range(3) for d in ("math", "facts")))
    assert len(jsonl_suite(untagged).items_per_family("test", 3)) == 6
    short = jsonl_suite(family_file(tmp_path / "short.jsonl", {"wide": 9, "narrow": 5}))
    with pytest.raises(ValueError, match="narrow has only 5 test items; ask for at most 5 per family"):
        short.items_per_family("test", 6)
    with pytest.raises(ValueError, match="has no train items"):
        short.items_per_family("train", 1)
