"""Evaluation suites: items with a question, a reference answer and the suite's own grader.

Generated families come from reasoning-gym (its generators and its graders; a score of 1.0
counts as correct, since its graders give partial credit to wrong answers) plus two families
where a tool really pays: exact products of 5-7 digit numbers (python) and short factual
questions that the sandbox's bundled corpus answers (web_search / crawl_page). User suites are
JSONL files.

Everything is deterministic by seed. Each item has a stable id and belongs to exactly one split
(train / dev / test), decided by a hash of its id, so asking for more items never moves an
item from one split to another. Items whose question already appeared earlier in a family are
skipped, so splits are disjoint by content too.
"""

from __future__ import annotations

import hashlib
import itertools
import json
import random
import re
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from gearshift.evaluation import curriculum
from gearshift.rewards.verifiers import phrase_match

SPLITS = ("train", "dev", "test")
# Share of items per split (train, dev, test), in percent.
SPLIT_PERCENT = (70, 10, 20)
DEFAULT_SEED = 1234


@dataclass(frozen=True)
class SuiteItem:
    """One question of a suite, with what the contract stores as labels."""

    id: str
    question: str
    answer: str
    split: str
    domain: str
    difficulty: str
    grade: Callable[[str], bool] = field(repr=False, compare=False)
    worked: str = field(default="", repr=False, compare=False)  # a worked solution, where the family has one
    family: str = ""  # the generator (or a JSONL row's family / domain) every report groups by

    def labels(self, sample: int) -> dict[str, str]:
        """The trajectory labels of the tagging contract."""
        labels = {"item_id": self.id, "difficulty": self.difficulty, "domain": self.domain, "sample": str(sample)}
        return labels | ({"family": self.family} if self.family else {})


def split_of(item_id: str) -> str:
    """The split an item id belongs to: a stable hash, so it never depends on how many are drawn."""
    bucket = int(hashlib.sha256(item_id.encode()).hexdigest()[:8], 16) % 100
    train, dev, _ = SPLIT_PERCENT
    return "train" if bucket < train else "dev" if bucket < train + dev else "test"


class Family:
    """A generator of items of one kind; item `index` depends only on (seed, index)."""

    name: str
    domain: str

    def item(self, seed: int, index: int) -> tuple[str, str, str, Callable[[str], bool]]:
        """(question, answer, difficulty, grader) of item `index`."""
        raise NotImplementedError

    def worked(self, seed: int, index: int) -> str:
        """A worked solution of item `index` ("" when the family has none)."""
        return ""

    def items(self, seed: int) -> Iterator[SuiteItem]:
        """Every item of the family in index order, duplicates of earlier questions skipped."""
        seen: set[str] = set()
        index = 0
        while True:
            question, answer, difficulty, grade = self.item(seed, index)
            if question not in seen:
                seen.add(question)
                item_id = f"{self.name}-s{seed}-{index:06d}"
                yield SuiteItem(item_id, question, answer, split_of(item_id), self.domain, difficulty, grade, self.worked(seed, index), self.name)
            index += 1


class GymFamily(Family):
    """A reasoning-gym dataset at three difficulty levels; item i has level i % 3 + 1.

    levels maps a level to the dataset's config; None means the dataset has no such knob and
    the difficulty comes from `difficulty_of(entry)`.
    """

    BLOCK = 64  # entries generated per reasoning-gym call

    def __init__(self, name: str, dataset: str, domain: str, levels: dict[int, dict[str, Any]] | None,
                 difficulty_of: Callable[[dict], int] | None = None):
        self.name, self.dataset, self.domain = name, dataset, domain
        self.levels, self.difficulty_of = levels, difficulty_of
        self._cache: dict[tuple[int, int, int], Any] = {}

    def _dataset(self, seed: int, level: int, block: int):
        key = (seed, level, block)
        if key not in self._cache:
            import reasoning_gym

            config = (self.levels or {}).get(level, {})
            block_seed = int(hashlib.sha256(f"{self.name}/{seed}/{level}/{block}".encode()).hexdigest()[:8], 16)
            self._cache[key] = reasoning_gym.create_dataset(self.dataset, size=self.BLOCK, seed=block_seed, **config)
        return self._cache[key]

    def item(self, seed: int, index: int):
        level = index % 3 + 1 if self.levels else 0
        position = index // 3 if self.levels else index
        dataset = self._dataset(seed, level, position // self.BLOCK)
        entry = dataset[position % self.BLOCK]
        difficulty = level if self.levels else self.difficulty_of(entry)

        def grade(answer: str) -> bool:
            return dataset.score_answer(answer.strip(), entry) == 1.0

        return entry["question"], str(entry["answer"]), str(difficulty), grade

    def worked(self, seed: int, index: int) -> str:
        level = index % 3 + 1 if self.levels else 0
        position = index // 3 if self.levels else index
        entry = self._dataset(seed, level, position // self.BLOCK)[position % self.BLOCK]
        return entry["metadata"].get("answer_cot", "")


class LargeMultiplication(Family):
    """Exact products of two 5-7 digit numbers (difficulty 1-3 = 5, 6, 7 digits): a 135M model
    cannot do them in its head, a python call can. Graded exactly: the last integer in the
    answer (thousands separators allowed) must equal the product."""

    name, domain = "large_multiplication", "arithmetic"

    def item(self, seed: int, index: int):
        rng = random.Random(f"{self.name}/{seed}/{index}")
        level = index % 3 + 1
        digits = level + 4
        a, b = (rng.randrange(10 ** (digits - 1), 10**digits) for _ in range(2))
        product = str(a * b)

        return f"What is {a} * {b}? Give the exact integer.", product, str(level), lambda answer: curriculum.last_integer_is(answer, product)


class TaskFamily(Family):
    """A curriculum family (gearshift.evaluation.curriculum): item i is a task of level i % 3 + 1
    in one of its phrasings, graded on its answer (the last integer said, or the words)."""

    def __init__(self, name: str):
        self.name = name
        self.need, self.domain, self._make = curriculum.TASKS[name]

    def task(self, seed: int, index: int) -> tuple[curriculum.Task, str]:
        """The task of item `index` and the phrasing its question uses."""
        rng = random.Random(f"{self.name}/{seed}/{index}")
        task = self._make(rng, index % 3 + 1)
        return task, rng.choice(task.phrasings)

    def item(self, seed: int, index: int):
        task, question = self.task(seed, index)
        return question, task.answer, str(index % 3 + 1), curriculum.grader(task.answer)


class Facts(Family):
    """Short factual questions from a table shipped with the package (facts.jsonl, 400 rows):
    capitals and everyday facts (difficulty 1, 45 %), well-known names (2, 30 %), dates and numbers
    (3, 25 %); with the default seed 78 of them are test items. About a quarter of the rows name the
    document of the sandbox's bundled corpus that answers them, so a web_search really helps there.

    The table is finite: the seed only shuffles its order. Graded by normalised phrase match:
    the reference (or one of its aliases) must appear as whole words in the normalised answer,
    and an answer longer than MAX_ANSWER_WORDS does not count (a list of guesses is no answer).
    """

    name, domain = "facts", "facts"
    TABLE = Path(__file__).with_name("facts.jsonl")
    MAX_ANSWER_WORDS = 30

    def __init__(self) -> None:
        self._rows: list[dict] | None = None

    def rows(self) -> list[dict]:
        if self._rows is None:
            self._rows = [json.loads(line) for line in self.TABLE.read_text().splitlines() if line.strip()]
        return self._rows

    def _order(self, seed: int) -> list[int]:
        order = list(range(len(self.rows())))
        random.Random(f"{self.name}/{seed}").shuffle(order)
        return order

    def item(self, seed: int, index: int):
        row = self.rows()[self._order(seed)[index]]
        references = [row["answer"], *row.get("aliases", [])]
        return row["question"], row["answer"], str(row["difficulty"]), lambda answer: any(phrase_match(answer, ref, self.MAX_ANSWER_WORDS) for ref in references)

    def items(self, seed: int) -> Iterator[SuiteItem]:
        for index in range(len(self.rows())):
            question, answer, difficulty, grade = self.item(seed, index)
            item_id = f"{self.name}-s{seed}-{index:06d}"
            yield SuiteItem(item_id, question, answer, split_of(item_id), self.domain, difficulty, grade, family=self.name)


def _gsm_steps(entry: dict) -> int:
    """GSM difficulty: the worked solution's number of steps, bucketed into 1-3."""
    steps = sum(1 for line in entry["metadata"].get("answer_cot", "").splitlines() if line.strip())
    return 1 if steps <= 3 else 2 if steps <= 5 else 3


def _arithmetic_levels(terms: tuple[tuple[int, int], ...]) -> dict[int, dict[str, Any]]:
    return {
        level: {"min_terms": low, "max_terms": high, "min_digits": level, "max_digits": level}
        for level, (low, high) in enumerate(terms, start=1)
    }


def _ranges(low: str, high: str, *bounds: tuple[int, int]) -> dict[int, dict[str, Any]]:
    """Levels 1-3 of a dataset whose difficulty is one (low, high) range of its config."""
    return {level: {low: a, high: b} for level, (a, b) in enumerate(bounds, start=1)}


# The generalisation set: families no training recipe, teacher or test of the project touches
# (tests/libs/evaluation/test_generalisation_set.py fails when one does), to measure whether the
# mode decision generalises: some are computed (a tool pays), some derived, some read off the
# question. docs/evaluation.md names them.
GENERALISATION: tuple[GymFamily, ...] = (
    GymFamily("lcm", "lcm", "number_theory", _ranges("min_value", "max_value", (2, 20), (2, 100), (2, 1000))),
    GymFamily("count_bits", "count_bits", "number_theory", _ranges("min_n", "max_n", (1, 255), (256, 65_535), (65_536, 2**31 - 1))),
    GymFamily("count_primes", "count_primes", "number_theory", _ranges("min_n", "max_n", (1, 100), (1, 1000), (1, 10_000))),
    GymFamily("letter_counting", "letter_counting", "counting", _ranges("min_words", "max_words", (3, 5), (6, 10), (11, 15))),
    GymFamily("simple_geometry", "simple_geometry", "geometry", _ranges("min_sides", "max_sides", (3, 3), (4, 4), (5, 6))),
    GymFamily("word_sequence_reversal", "word_sequence_reversal", "text", _ranges("min_words", "max_words", (3, 4), (5, 6), (7, 8))),
    GymFamily("time_intervals", "time_intervals", "time", {1: {"task_types": ["time"]}, 2: {"task_types": ["time_seconds"]},
                                                           3: {"task_types": ["date"]}}),
)
GENERALISATION_FAMILIES = tuple(family.name for family in GENERALISATION)

FAMILIES: dict[str, Family] = {
    family.name: family
    for family in (
        GymFamily("basic_arithmetic", "basic_arithmetic", "arithmetic", _arithmetic_levels(((2, 2), (2, 3), (3, 4)))),
        GymFamily("chain_sum", "chain_sum", "arithmetic", _arithmetic_levels(((2, 3), (3, 4), (4, 5)))),
        GymFamily("gsm_symbolic", "gsm_symbolic", "word_problems", None, _gsm_steps),
        LargeMultiplication(),
        Facts(),
        *(TaskFamily(name) for name in curriculum.TASKS),
        *GENERALISATION,
    )
}


@dataclass(frozen=True)
class Suite:
    """A named, seeded set of items; `items(split, n)` interleaves its sources round-robin."""

    name: str
    sources: tuple[Callable[[], Iterator[SuiteItem]], ...]
    # Every source ends (a file's rows, of any families): items_per_family reads it to the end.
    # Otherwise each source is one family's endless stream, read only as deep as asked.
    finite: bool = False

    def items(self, split: str = "test", n: int | None = None) -> list[SuiteItem]:
        if split not in SPLITS:
            raise ValueError(f"unknown split {split!r}; one of {', '.join(SPLITS)}")
        streams = [(item for item in source() if item.split == split) for source in self.sources]
        chosen: list[SuiteItem] = []
        while streams and (n is None or len(chosen) < n):
            for stream in list(streams):
                item = next(stream, None)
                if item is None:
                    streams.remove(stream)
                elif n is None or len(chosen) < n:
                    chosen.append(item)
        return chosen

    def items_per_family(self, split: str, n: int) -> list[SuiteItem]:
        """The first n items of the split of every family (the label reports group by,
        family_of_labels), family by family in the order they first come: a per-family comparison
        needs the same count of each. Refuses a family with fewer."""
        if split not in SPLITS:
            raise ValueError(f"unknown split {split!r}; one of {', '.join(SPLITS)}")
        families: dict[str, list[SuiteItem]] = {}
        for source in self.sources:
            stream = (item for item in source() if item.split == split)
            taken = list(stream if self.finite else itertools.islice(stream, n))
            if not taken and not self.finite:
                families.setdefault("a family", [])
            for item in taken:
                families.setdefault(family_of_labels(item.labels(0)), []).append(item)
        if not families:
            raise ValueError(f"suite {self.name!r} has no {split} items")
        for family, items in families.items():
            if len(items) < n:
                raise ValueError(f"suite {self.name!r}: {family} has only {len(items)} {split} items; ask for at most {len(items)} per family")
        return [item for items in families.values() for item in items[:n]]

    def grade(self, item: SuiteItem, answer: str) -> bool:
        """The suite's verdict on an answer."""
        return item.grade(answer)


def generated_suite(name: str, families: list[str], seed: int = DEFAULT_SEED) -> Suite:
    """A suite of generated families (infinite streams; ask for n items)."""
    return Suite(name, tuple((lambda family=FAMILIES[f]: family.items(seed)) for f in families))


def jsonl_suite(path: str | Path, name: str | None = None, verifier: str | None = None) -> Suite:
    """A user suite: one JSON object per line with question and answer, optionally id,
    difficulty, domain and split. Graded with the platform's verifiers (math / numeric /
    exact, chosen from the reference unless `verifier` names one)."""
    from gearshift.rewards.scoring import resolve_verifier, verify
    from gearshift.settings import RewardSettings

    path = Path(path)
    config = RewardSettings()
    items = []
    for number, line in enumerate(path.read_text().splitlines(), start=1):
        if not line.strip():
            continue
        row = json.loads(line)
        if not isinstance(row, dict) or "question" not in row or "answer" not in row:
            raise ValueError(f"{path}:{number}: need an object with question and answer")
        question, answer = str(row["question"]), str(row["answer"])
        item_id = str(row.get("id") or hashlib.sha256(question.encode()).hexdigest()[:16])
        split = row.get("split") or split_of(item_id)
        if split not in SPLITS:
            raise ValueError(f"{path}:{number}: unknown split {split!r}")
        name_of_verifier = resolve_verifier(verifier, answer)

        def grade(given: str, reference=answer, how=name_of_verifier) -> bool:
            return verify(given, reference, how, config)

        domain = str(row.get("domain") or "general")
        items.append(SuiteItem(item_id, question, answer, split, domain, str(row.get("difficulty", "")), grade,
                               family=str(row.get("family") or row.get("domain") or "")))
    ids = [item.id for item in items]
    if len(set(ids)) != len(ids):
        raise ValueError(f"{path}: duplicate item ids")
    return Suite(name or path.stem, (lambda: iter(items),), finite=True)


# The default suite: one of each of the five first families in turn.
DEFAULT_FAMILIES = ("basic_arithmetic", "chain_sum", "gsm_symbolic", "large_multiplication", "facts")
# The headline measurement (`gearshift eval headline`): one family answerable directly, one where
# a tool pays, one that needs several steps, and one the default policy was never trained on
# (it learned large_multiplication, gsm_symbolic, basic_arithmetic and facts).
HEADLINE_FAMILIES = ("facts", "large_multiplication", "gsm_symbolic", "chain_sum")
HEADLINE_ROLES = {"facts": "answerable directly", "large_multiplication": "a tool pays", "gsm_symbolic": "several steps",
                  "chain_sum": "never trained on"}

SUITES: dict[str, Callable[[], Suite]] = {
    **{name: (lambda name=name: generated_suite(name, [name])) for name in FAMILIES},  # each family alone
    "default": lambda: generated_suite("default", list(DEFAULT_FAMILIES)),
    "headline": lambda: generated_suite("headline", list(HEADLINE_FAMILIES)),
    "generalisation": lambda: generated_suite("generalisation", list(GENERALISATION_FAMILIES)),
    "curriculum": lambda: generated_suite("curriculum", list(curriculum.TASKS)),
}


_GENERATED_ID = re.compile(r"^(?P<family>[a-z_]+)-s(?P<seed>\d+)-(?P<index>\d+)$")


def family_of(item_id: str) -> str:
    """The generated family an item id belongs to ("" for items of a user suite)."""
    match = _GENERATED_ID.match(item_id)
    return match["family"] if match and match["family"] in FAMILIES else ""


def family_of_labels(labels) -> str:
    """The family an item's or a trajectory's labels report under: the family label (a generated
    family, or a JSONL row's family / domain), else the item id's family (trajectories stored
    before the label), else the domain."""
    return labels.get("family") or family_of(labels.get("item_id", "")) or labels.get("domain") or "other"


def family_of_trajectory(trajectory) -> str:
    """The family a stored evaluation trajectory reports under (family_of_labels)."""
    return family_of_labels(trajectory.labels)


def curriculum_task(item: SuiteItem) -> curriculum.Task | None:
    """The curriculum task an item was drawn from (None for other families)."""
    match = _GENERATED_ID.match(item.id)
    family = FAMILIES.get(match["family"]) if match else None
    return family.task(int(match["seed"]), int(match["index"]))[0] if isinstance(family, TaskFamily) else None


def find_item(suite: str, item_id: str) -> SuiteItem:
    """A suite's item by id, with its grader (training grades rollouts as evaluation does)."""
    match = _GENERATED_ID.match(item_id)
    if match and match["family"] in FAMILIES:
        family = FAMILIES[match["family"]]
        seed, index = int(match["seed"]), int(match["index"])
        question, answer, difficulty, grade = family.item(seed, index)
        return SuiteItem(item_id, question, answer, split_of(item_id), family.domain, difficulty, grade, family.worked(seed, index), family.name)
    for item in (item for split in SPLITS for item in get_suite(suite).items(split)):
        if item.id == item_id:
            return item
    raise ValueError(f"suite {suite!r} has no item {item_id!r}")


def register_suite(name: str, factory: Callable[[], Suite]) -> None:
    """Makes a suite available by name (to `gearshift eval --suite`)."""
    SUITES[name] = factory


def suite_name(name: str) -> str:
    """The name a suite is known by: a .jsonl path's stem (as get_suite names it), else itself."""
    return Path(name).stem if name.endswith(".jsonl") else name


def get_suite(name: str) -> Suite:
    """A registered suite by name, or a JSONL file by path (suite name = the file's stem)."""
    if name in SUITES:
        return SUITES[name]()
    if name.endswith(".jsonl") and Path(name).is_file():
        return jsonl_suite(name)
    raise ValueError(f"unknown suite {name!r}: one of {', '.join(SUITES)}, or a path to a .jsonl file")
