"""The curriculum's generated families: tasks whose need is known by construction, so teaching
them teaches the mode decision, not a list of phrasings.

- computed: the answer is a computation a small model cannot do in its head (a tool pays);
- derived: a few worked steps reach it (reasoning pays);
- known: it is read off the question or common knowledge (an instant answer).

Each item is drawn with its numbers, one of several phrasings of the same question, its answer,
and how a teacher solves it (gearshift.teaching.solvers): worked steps for reasoning, python for
the sandbox. Item `index` depends only on (seed, family, index), as every family's does.
"""

from __future__ import annotations

import math
import random
import re
from collections.abc import Callable
from dataclasses import dataclass
from typing import Literal

from gearshift.rewards.verifiers import phrase_match

Need = Literal["computed", "derived", "known"]
_INTEGER = re.compile(r"-?\d[\d,_]*")


@dataclass(frozen=True)
class Task:
    """One drawn task: its phrasings (the same question), answer and worked solution."""

    phrasings: tuple[str, ...]
    answer: str
    goal: str  # one line: what is asked
    steps: tuple[str, ...]  # a worked solution, one line per step
    code: str  # python that prints the answer


def ordinal(n: int) -> str:
    return f"{n}{'th' if 10 <= n % 100 <= 20 else {1: 'st', 2: 'nd', 3: 'rd'}.get(n % 10, 'th')}"


def last_integer_is(answer: str, expected: str) -> bool:
    """The last integer of the answer (thousands separators allowed) is the expected one."""
    found = _INTEGER.findall(answer)
    return bool(found) and found[-1].replace(",", "").replace("_", "") == expected


# Computed: a tool pays.

def power(rng: random.Random, level: int) -> Task:
    base, exponent = [(rng.randint(2, 9), rng.randint(14, 24)), (rng.randint(11, 99), rng.randint(6, 9)),
                      (rng.randint(101, 999), rng.randint(4, 6))][level - 1]
    value = base**exponent
    return Task((f"What is {base} to the power of {exponent}?", f"Compute {base}^{exponent} exactly.",
                 f"Calculate the exact value of {base} raised to the {ordinal(exponent)} power."),
                str(value), f"the exact value of {base}^{exponent}", (f"{base}^{exponent} = {value}",), f"print({base} ** {exponent})")


def modular_power(rng: random.Random, level: int) -> Task:
    base, exponent, modulus = rng.randint(2, 99), rng.randint(10, 10 ** (level + 1)), rng.randint(7, 10 ** (level + 1))
    value = pow(base, exponent, modulus)
    return Task((f"What is {base}^{exponent} mod {modulus}?", f"Find the remainder when {base}^{exponent} is divided by {modulus}.",
                 f"Compute {base} to the power {exponent}, modulo {modulus}."),
                str(value), f"{base}^{exponent} mod {modulus}", (f"{base}^{exponent} mod {modulus} = {value}",),
                f"print(pow({base}, {exponent}, {modulus}))")


def digit_sum_of_power(rng: random.Random, level: int) -> Task:
    exponent = rng.randint(*[(40, 99), (100, 299), (300, 999)][level - 1])
    value = sum(map(int, str(2**exponent)))
    return Task((f"What is the sum of the digits of 2^{exponent}?", f"Add up the decimal digits of 2 to the power {exponent}.",
                 f"Compute the digit sum of 2**{exponent}."),
                str(value), f"the digit sum of 2^{exponent}", (f"the digits of 2^{exponent} add up to {value}",),
                f"print(sum(int(d) for d in str(2 ** {exponent})))")


def fibonacci(rng: random.Random, level: int) -> Task:
    n = rng.randint(*[(20, 40), (41, 70), (71, 120)][level - 1])
    a, b = 0, 1
    for _ in range(n):
        a, b = b, a + b
    return Task((f"What is the {ordinal(n)} Fibonacci number (F(1) = F(2) = 1)?",
                 f"Compute F({n}), where F(1) = F(2) = 1 and F(n) = F(n-1) + F(n-2).", f"Give Fibonacci number {n}, counting F(1) = 1, F(2) = 1."),
                str(a), f"the Fibonacci number F({n})", (f"F({n}) = {a}",),
                f"a, b = 0, 1\nfor _ in range({n}):\n    a, b = b, a + b\nprint(a)")


def factorial(rng: random.Random, level: int) -> Task:
    n = rng.randint(*[(12, 17), (18, 25), (26, 40)][level - 1])
    value = math.factorial(n)
    return Task((f"What is {n}! (the factorial of {n})?", f"Compute the factorial of {n} exactly.", f"Calculate {n} factorial."),
                str(value), f"{n}!", (f"{n}! = {value}",), f"import math\nprint(math.factorial({n}))")


def divisor_count(rng: random.Random, level: int) -> Task:
    n = rng.randint(*[(1_000, 9_999), (10_000, 999_999), (1_000_000, 99_999_999)][level - 1])
    value = sum(2 if d * d != n else 1 for d in range(1, math.isqrt(n) + 1) if n % d == 0)
    return Task((f"How many positive divisors does {n} have?", f"Count the divisors of {n}.", f"What is the number of factors of {n}?"),
                str(value), f"the number of divisors of {n}", (f"{n} has {value} divisors",),
                f"n = {n}\nprint(sum(1 for d in range(1, n + 1) if n % d == 0))" if n < 2_000_000 else
                f"import math\nn = {n}\nprint(sum(2 if d * d != n else 1 for d in range(1, math.isqrt(n) + 1) if n % d == 0))")


def square_root(rng: random.Random, level: int) -> Task:
    root = rng.randint(*[(101, 999), (1_000, 99_999), (100_000, 9_999_999)][level - 1])
    square = root * root
    return Task((f"What is the square root of {square}?", f"{square} is a perfect square. Which number squared gives it?",
                 f"Find the integer x with x^2 = {square}."),
                str(root), f"the square root of {square}", (f"{root} * {root} = {square}",), f"import math\nprint(math.isqrt({square}))")


def sum_of_squares(rng: random.Random, level: int) -> Task:
    n = rng.randint(*[(20, 99), (100, 999), (1_000, 99_999)][level - 1])
    value = n * (n + 1) * (2 * n + 1) // 6
    return Task((f"What is 1^2 + 2^2 + ... + {n}^2?", f"Add up the squares of the whole numbers from 1 to {n}.",
                 f"Compute the sum of k^2 for k = 1 to {n}."),
                str(value), f"the sum of the squares from 1 to {n}", (f"n(n+1)(2n+1)/6 with n = {n} is {value}",),
                f"print(sum(k * k for k in range(1, {n} + 1)))")


def binary(rng: random.Random, level: int) -> Task:
    n = rng.randint(*[(300, 4_000), (4_001, 500_000), (500_001, 100_000_000)][level - 1])
    value = format(n, "b")
    return Task((f"Write {n} in binary.", f"What is the base-2 representation of the decimal number {n}?",
                 f"Convert {n} from decimal to binary (digits only, no prefix)."),
                value, f"{n} in base 2", (f"{n} in base 2 is {value}",), f"print(format({n}, 'b'))")


def long_sum(rng: random.Random, level: int) -> Task:
    terms = [rng.randint(10 ** (level + 4), 10 ** (level + 5)) for _ in range(rng.randint(5, 7))]
    written = " + ".join(map(str, terms))
    return Task((f"What is {written}?", f"Add these numbers exactly: {', '.join(map(str, terms))}.", f"Compute the sum {written}."),
                str(sum(terms)), f"the sum of {len(terms)} large numbers", (f"{written} = {sum(terms)}",), f"print({written})")


# Derived: a few worked steps.

def linear_equation(rng: random.Random, level: int) -> Task:
    a, x = rng.randint(2, 3 + 3 * level), rng.randint(-10 * level, 12 * level)
    b = rng.randint(-20 * level, 20 * level)
    c = a * x + b
    sign, size = ("+", b) if b >= 0 else ("-", -b)
    equation = f"{a}x {sign} {size} = {c}"
    move = f"{c} - {b} = {c - b}" if b >= 0 else f"{c} + {size} = {c - b}"
    return Task((f"Solve for x: {equation}", f"Find x if {equation}.", f"What value of x satisfies {equation}?"),
                str(x), f"x in {equation}", (f"{a}x = {move}", f"x = {c - b} / {a} = {x}"), f"print(({c} - ({b})) // {a})")


def percentage(rng: random.Random, level: int) -> Task:
    percent = rng.choice([[10, 50], [20, 25, 75], [5, 15, 35, 60]][level - 1])
    whole = 20 * rng.randint(1, 10 * level)
    value = whole * percent // 100
    return Task((f"What is {percent}% of {whole}?", f"Compute {percent} percent of {whole}.", f"Find {percent}% of the number {whole}."),
                str(value), f"{percent}% of {whole}", (f"1% of {whole} is {whole / 100:g}", f"{percent} * {whole / 100:g} = {value}"),
                f"print({whole} * {percent} // 100)")


def average(rng: random.Random, level: int) -> Task:
    count = level + 2
    numbers = [rng.randint(1, 30 * level) for _ in range(count - 1)]
    mean = rng.randint(max(numbers) // 2 + 1, 30 * level)
    numbers.append(mean * count - sum(numbers))  # an exact mean
    listed = ", ".join(map(str, numbers))
    return Task((f"What is the average of {listed}?", f"Compute the mean of these numbers: {listed}.", f"Find the arithmetic mean of {listed}."),
                str(mean), f"the mean of {listed}", (f"{' + '.join(map(str, numbers))} = {sum(numbers)}", f"{sum(numbers)} / {count} = {mean}"),
                f"print(sum([{listed}]) // {count})")


def rectangle(rng: random.Random, level: int) -> Task:
    width, height = rng.randint(2, 8 * level), rng.randint(2, 8 * level)
    if rng.random() < 0.5:
        return Task((f"A rectangle is {width} cm wide and {height} cm tall. What is its area in square centimetres?",
                     f"What is the area of a {width} by {height} rectangle?", f"Find the area of a rectangle with sides {width} and {height}."),
                    str(width * height), f"the area of a {width} x {height} rectangle", (f"area = {width} * {height} = {width * height}",),
                    f"print({width} * {height})")
    return Task((f"A rectangle is {width} m wide and {height} m long. What is its perimeter in metres?",
                 f"What is the perimeter of a {width} by {height} rectangle?", f"Find the perimeter of a rectangle with sides {width} and {height}."),
                str(2 * (width + height)), f"the perimeter of a {width} x {height} rectangle",
                (f"perimeter = 2 * ({width} + {height})", f"2 * {width + height} = {2 * (width + height)}"), f"print(2 * ({width} + {height}))")


UNITS = (("kilometres", "metres", 1000), ("hours", "minutes", 60), ("kilograms", "grams", 1000), ("minutes", "seconds", 60),
         ("metres", "centimetres", 100), ("days", "hours", 24), ("weeks", "days", 7))


def unit_conversion(rng: random.Random, level: int) -> Task:
    big, small, factor = rng.choice(UNITS)
    amount = rng.randint(2, 9 * level)
    value = amount * factor
    return Task((f"How many {small} are in {amount} {big}?", f"Convert {amount} {big} to {small}.", f"{amount} {big} is how many {small}?"),
                str(value), f"{amount} {big} in {small}", (f"1 of the {big} is {factor} {small}", f"{amount} * {factor} = {value}"),
                f"print({amount} * {factor})")


def sequence_next(rng: random.Random, level: int) -> Task:
    start, step = rng.randint(-10 * level, 20 * level), rng.choice([s for s in range(-4 * level, 5 * level + 1) if s])
    terms = [start + step * i for i in range(4 + level)]
    listed = ", ".join(map(str, terms))
    value = terms[-1] + step
    return Task((f"What number comes next: {listed}, ?", f"Continue the sequence {listed} by one term.", f"Find the next term of {listed}."),
                str(value), f"the term after {listed}", (f"each term adds {step}", f"{terms[-1]} + {step} = {value}" if step > 0 else
                                                          f"{terms[-1]} - {-step} = {value}"),
                f"terms = [{listed}]\nprint(terms[-1] + (terms[1] - terms[0]))")


def change(rng: random.Random, level: int) -> Task:
    prices = [rng.randint(1, 9 * level) for _ in range(level + 1)]
    paid = (sum(prices) // 10 + 1 + rng.randint(0, 2)) * 10
    listed = " and ".join(f"${p}" for p in prices)
    value = paid - sum(prices)
    return Task((f"You buy items costing {listed} and pay with ${paid}. How many dollars of change do you get?",
                 f"Items cost {listed}. If you pay ${paid}, what is your change in dollars?",
                 f"How much change (in dollars) is left from ${paid} after buying things for {listed}?"),
                str(value), f"the change from ${paid}", (f"{' + '.join(map(str, prices))} = {sum(prices)}", f"{paid} - {sum(prices)} = {value}"),
                f"print({paid} - ({' + '.join(map(str, prices))}))")



NAMES = ("Ana", "Ben", "Chen", "Dara", "Eli", "Fay", "Gus", "Hana", "Ivo", "Jules", "Kemal", "Lena")
THINGS = ("apples", "marbles", "pencils", "cards", "coins", "shells", "books", "stamps")


def word_problem(rng: random.Random, level: int) -> Task:
    """One operation in words: a story with one step to take. The worked step names the operation
    before doing it, so what is learned is reading the story, not a list of phrasings."""
    name, thing = rng.choice(NAMES), rng.choice(THINGS)
    a, b = rng.randint(5, 20 * level), rng.randint(2, 5 + 3 * level)
    operation = rng.choice(("lose", "gain", "groups", "share"))
    if operation == "lose":
        a += b
        value, why, expression = a - b, f"{a} at first, {b} gone, so subtract", f"{a} - {b}"
        phrasings = (f"{name} has {a} {thing} and loses {b} of them. How many {thing} are left?",
                     f"There were {a} {thing} in a box; {name} took out {b}. How many are still in the box?",
                     f"{name} started with {a} {thing} and gave away {b}. How many does {name} keep?")
    elif operation == "gain":
        value, why, expression = a + b, f"{a} at first, {b} more, so add", f"{a} + {b}"
        phrasings = (f"{name} has {a} {thing} and finds {b} more. How many {thing} now?",
                     f"A jar holds {a} {thing}. {name} adds {b}. How many {thing} are in the jar?",
                     f"{name} collected {a} {thing} on Monday and {b} on Tuesday. How many in all?")
    elif operation == "groups":
        value, why, expression = a * b, f"{b} groups of {a}, so multiply", f"{a} * {b}"
        phrasings = (f"{name} fills {b} bags with {a} {thing} each. How many {thing} is that?",
                     f"Each of {b} shelves holds {a} {thing}. How many {thing} are there in total?",
                     f"{name} buys {b} packs of {thing}, {a} in every pack. How many {thing} does {name} buy?")
    else:
        a *= b
        value, why, expression = a // b, f"{a} shared equally by {b}, so divide", f"{a} / {b}"
        phrasings = (f"{name} shares {a} {thing} equally among {b} friends. How many does each friend get?",
                     f"{a} {thing} are split evenly into {b} piles. How many {thing} are in each pile?",
                     f"If {b} children divide {a} {thing} equally, how many {thing} does each child get?")
    return Task(phrasings, str(value), f"the {thing} after one step", (f"{why}: {expression} = {value}",),
                f"print({expression.replace('/', '//')})")


# Known: read off the question or common knowledge.

ONES = ("zero one two three four five six seven eight nine ten eleven twelve thirteen fourteen fifteen sixteen seventeen eighteen "
        "nineteen").split()
TENS = "_ _ twenty thirty forty fifty sixty seventy eighty ninety".split()
DAYS = ("Monday", "Tuesday", "Wednesday", "Thursday", "Friday", "Saturday", "Sunday")
MONTHS = ("January", "February", "March", "April", "May", "June", "July", "August", "September", "October", "November", "December")


def in_words(n: int) -> str:
    if n < 20:
        return ONES[n]
    if n < 100:
        return TENS[n // 10] + ("-" + ONES[n % 10] if n % 10 else "")
    return ONES[n // 100] + " hundred" + (" " + in_words(n % 100) if n % 100 else "")


def number_words(rng: random.Random, level: int) -> Task:
    n = rng.randint(*[(1, 19), (20, 99), (100, 999)][level - 1])
    words = in_words(n)
    return Task((f"Write the number {words} in digits.", f"What is {words} as a number?", f'Which number is "{words}"?'),
                str(n), f"{words} in digits", (f"{words} is {n}",), f"print({n})")


def weekday_after(rng: random.Random, level: int) -> Task:
    day, shift = rng.randrange(7), rng.choice([[1], [1, -1], [2, -2, 3]][level - 1])
    value = DAYS[(day + shift) % 7]
    where = {1: "comes after", -1: "comes before", 2: "is two days after", -2: "is two days before", 3: "is three days after"}[shift]
    return Task((f"Which day of the week {where} {DAYS[day]}?", f"What day {where} {DAYS[day]}?", f"Name the weekday that {where} {DAYS[day]}."),
                value, f"the day that {where} {DAYS[day]}", (f"{where} {DAYS[day]} is {value}",),
                f"days = {list(DAYS)!r}\nprint(days[({day} + {shift}) % 7])")


def month_number(rng: random.Random, level: int) -> Task:
    month = rng.randrange(12)
    if level == 1:
        return Task((f"Which month comes after {MONTHS[month]}?", f"What month follows {MONTHS[month]}?", f"Name the month after {MONTHS[month]}."),
                    MONTHS[(month + 1) % 12], f"the month after {MONTHS[month]}", (f"after {MONTHS[month]} comes {MONTHS[(month + 1) % 12]}",),
                    f"months = {list(MONTHS)!r}\nprint(months[{(month + 1) % 12}])")
    return Task((f"What is month number {month + 1} of the year?", f"Which month is the {ordinal(month + 1)} month of the year?",
                 f"Name month {month + 1} of the calendar year."),
                MONTHS[month], f"month number {month + 1}", (f"month {month + 1} is {MONTHS[month]}",),
                f"months = {list(MONTHS)!r}\nprint(months[{month}])")


def larger_number(rng: random.Random, level: int) -> Task:
    a = rng.randint(10 ** level, 10 ** (level + 1) - 1)
    b = int(str(a)[::-1]) if str(a)[::-1] != str(a) and not str(a).endswith("0") else a + rng.randint(1, 9)
    larger = max(a, b)
    return Task((f"Which is larger, {a} or {b}?", f"Of {a} and {b}, which number is bigger?", f"Name the greater of the two numbers {a} and {b}."),
                str(larger), f"the larger of {a} and {b}", (f"{larger} > {min(a, b)}",), f"print(max({a}, {b}))")


TASKS: dict[str, tuple[Need, str, Callable[[random.Random, int], Task]]] = {  # name -> (need, domain, generator)
    "power": ("computed", "arithmetic", power),
    "modular_power": ("computed", "number_theory", modular_power),
    "digit_sum_of_power": ("computed", "arithmetic", digit_sum_of_power),
    "fibonacci": ("computed", "sequences", fibonacci),
    "factorial": ("computed", "arithmetic", factorial),
    "divisor_count": ("computed", "number_theory", divisor_count),
    "square_root": ("computed", "arithmetic", square_root),
    "sum_of_squares": ("computed", "series", sum_of_squares),
    "binary": ("computed", "number_systems", binary),
    "long_sum": ("computed", "arithmetic", long_sum),
    "linear_equation": ("derived", "algebra", linear_equation),
    "percentage": ("derived", "arithmetic", percentage),
    "average": ("derived", "statistics", average),
    "rectangle": ("derived", "geometry", rectangle),
    "unit_conversion": ("derived", "measurement", unit_conversion),
    "sequence_next": ("derived", "sequences", sequence_next),
    "change": ("derived", "word_problems", change),
    "word_problem": ("derived", "word_problems", word_problem),
    "number_words": ("known", "language", number_words),
    "weekday_after": ("known", "calendar", weekday_after),
    "month_number": ("known", "calendar", month_number),
    "larger_number": ("known", "comparison", larger_number),
}


def grader(answer: str) -> Callable[[str], bool]:
    """An integer answer: the last integer said; anything else: the answer as whole words."""
    if re.fullmatch(r"-?\d+", answer) and not answer.startswith(("0", "-0")) or answer == "0":
        return lambda said: last_integer_is(said, answer)
    return lambda said: phrase_match(said, answer, 12)
