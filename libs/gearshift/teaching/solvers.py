"""Solver teachers: deterministic data generators for the procedurally generated families (and
the facts table's training answers), served
behind the OpenAI-compatible interface (gearshift.teaching.endpoint) so their episodes run
through the real executor, sandbox and reward service like any policy's.

They write A^2FM turns in every mode: the answer (instant); worked steps then the answer
(reasoning: partial products, running results, reasoning-gym's worked solutions); a plan, python
for the sandbox, and the answer read from the tool's real output (agentic). They answer only
the questions of the items they were built from (a train split), so they never serve an
evaluation or demo question: anything else gets a refusal that grades wrong.
"""

from __future__ import annotations

import ast
import json
import operator
import re
from collections.abc import Iterable
from dataclasses import dataclass

from gearshift.evaluation.suites import SuiteItem, curriculum_task
from gearshift.protocol.sr2am import PLAN_HEAD, PLAN_OPENER

REFUSAL = "I cannot solve this one."
_TASK = re.compile(r"^Task: (.*)$", re.M)
_PRODUCT = re.compile(r"What is (\d+) \* (\d+)\?")
_RESULT = re.compile(r"Results for tool call [^\n]*:\n(.*?)\n(?:Results for tool call|</tool_response>)", re.S)
_OPERATORS = {ast.Add: ("+", operator.add), ast.Sub: ("-", operator.sub), ast.Mult: ("*", operator.mul), ast.Div: ("/", operator.floordiv)}


def python_call(code: str) -> str:
    """The teachers' python call, one dict literal. The program is always written as a
    double-quoted string (JSON's, a Python literal too), so that its own 'strings' never end
    it: with repr most programs came out single-quoted, and the policy learned to write
    'print(format(n, 'b'))', which does not parse."""
    return "{'id': 1, 'name': 'python', 'arguments': {'code': " + json.dumps(code) + "}}"


@dataclass(frozen=True)
class Solution:
    """How a teacher answers one question in each mode."""

    answer: str
    goal: str  # one line: what is asked
    steps: tuple[str, ...]  # the worked solution, one line per step
    code: str  # python that prints the answer (agentic mode)


def arithmetic_steps(expression: str) -> tuple[list[str], int]:
    """The operations of an integer expression innermost first, as "a op b = r" lines (its
    divisions are exact, as the generated families make them)."""
    steps: list[str] = []

    def value(node: ast.AST) -> int:
        if isinstance(node, ast.Constant) and isinstance(node.value, int):
            return node.value
        if isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.USub):
            inner = value(node.operand)
            if not isinstance(node.operand, ast.Constant):
                steps.append(f"-({inner}) = {-inner}")
            return -inner
        if isinstance(node, ast.BinOp) and type(node.op) in _OPERATORS:
            left, right = value(node.left), value(node.right)
            symbol, apply = _OPERATORS[type(node.op)]
            if symbol == "/" and (right == 0 or left % right):
                raise ValueError(f"{left} / {right} is not an exact integer division")
            result = apply(left, right)
            steps.append(f"{left} {symbol} {right} = {result}")
            return result
        raise ValueError(f"not an integer expression: {ast.dump(node)[:60]}")

    return steps, value(ast.parse(expression, mode="eval").body)


def product_steps(a: int, b: int) -> list[str]:
    """Long multiplication: one partial product per digit of b, then their sum."""
    parts = [(int(digit) * a * 10**place, digit, place) for place, digit in enumerate(reversed(str(b)))]
    lines = [f"{a} * {digit}{'0' * place} = {part}" for part, digit, place in parts if part]
    return lines + [f"{' + '.join(str(part) for part, _, _ in parts if part)} = {a * b}"]


def solve(item: SuiteItem) -> Solution | None:
    """A teacher's solution of a generated item, or None for a family it cannot solve by rule."""
    if task := curriculum_task(item):
        return Solution(task.answer, task.goal, task.steps, task.code)
    question = item.question
    if product := _PRODUCT.search(question):
        a, b = int(product[1]), int(product[2])
        return Solution(str(a * b), f"the exact product of {a} and {b}", tuple(product_steps(a, b)), f"print({a} * {b})")
    expression = None
    if question.startswith("Calculate "):
        expression = question.removeprefix("Calculate ").rstrip(".").strip()
    elif "arithmetic problem:" in question:
        expression = question.split("arithmetic problem:", 1)[1].rstrip("= ").strip()
    if expression:
        try:
            steps, value = arithmetic_steps(expression)
        except (SyntaxError, ValueError):  # words, not an expression ("the time arithmetic problem: ...")
            return None
        # Its divisions are exact: floor division prints the integer the grader wants (/ prints 2.0).
        code = f"print({expression.replace('/', '//')})"
        return Solution(str(value), f"the value of {expression}", tuple(steps) or (f"{expression} = {value}",), code)
    if item.worked:
        lines = [line.strip() for line in item.worked.splitlines() if line.strip() and not line.startswith("####")]
        return Solution(item.answer, "the number the question asks for", tuple(lines), "")
    if item.domain == "facts":  # the table's answer: what is learned is the format, not the fact
        # Its program prints the answer (single-quoted, as repr writes it): agentic mode learns the
        # tool protocol on string answers too, not on numbers alone.
        return Solution(item.answer, "the fact asked for", (f"I recall that the answer is {item.answer}.",), f"print({item.answer!r})")
    return None


class SolverTeacher:
    """The model behind a solver endpoint: a function of the request body (a Responder)."""

    def __init__(self, items: Iterable[SuiteItem]):
        self.solutions = {item.question: solution for item in items if (solution := solve(item)) is not None}

    def __call__(self, body: dict) -> str:
        messages = body.get("messages") or []
        first = messages[0]["content"] if messages else ""
        if first.startswith("You regulate"):
            return "PLAN_NEW" if "Current plan: none" in first else "CONTINUE"
        if first.startswith("Plan the next steps"):
            task = _TASK.search(first)
            return self._plan(self.solutions.get(task[1].strip()) if task else None)
        query = messages[1]["content"] if len(messages) > 1 else ""
        solution = self.solutions.get(query.strip())
        message = messages[-1]["content"] if messages[-1]["role"] == "assistant" else ""
        if message.endswith(PLAN_OPENER):  # the planner, in the agent's message
            return self._plan(solution)
        if message.endswith(PLAN_HEAD):  # the configurator: plan once, then follow it
            return "\n\n" if PLAN_OPENER in message else "\n- Current State:"
        if solution is None:
            return REFUSAL
        if "</classification>" in (body.get("stop") or []):
            label = "toolcalling_agent" if solution.code else "reasoning_agent"
            return f"This needs exact arithmetic.\n<classification>\n{label}\n</classification>"
        return self._continue(solution, messages[-1]["content"] if messages[-1]["role"] == "assistant" else "")

    @staticmethod
    def _plan(solution: Solution | None) -> str:
        if solution is None or not solution.code:
            return " unclear"
        return (f" need {solution.goal}; nothing computed yet\n- Action: run python to compute it\n"
                f"- Expected Outcome: the exact value is printed\n- Next Action: answer with the printed value\n"
                f"- Expected Outcome: the answer is given")

    @staticmethod
    def _continue(solution: Solution, transcript: str) -> str:
        """The next piece of the assistant turn, from where the transcript stands."""
        if transcript.endswith("<answer>"):  # instant mode, or the forced answer
            return f"{solution.answer}</answer>"
        if transcript.endswith("<reasoning>"):
            return "\n".join(solution.steps) + f"\nSo the answer is {solution.answer}.</reasoning>\n<answer>{solution.answer}</answer>"
        if "<tool_response>" in transcript:
            printed = _RESULT.findall(transcript)
            value = printed[-1].strip() if printed else solution.answer
            return f"The tool printed {value}.\n<answer>{value}</answer>"
        if not solution.code:
            return "\n".join(solution.steps) + f"</plan>\n<answer>{solution.answer}</answer>"
        return (f"Goal: {solution.goal}. Path: compute it with python. Success: an exact integer is printed.</plan>\n"
                f"<tool_call>\n{python_call(solution.code)}\n</tool_call>")
