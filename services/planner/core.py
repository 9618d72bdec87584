"""SR2AM planning, free of gRPC. The policy decides and plans through prompts; when its reply
does not parse, a rule decides instead, so a weak model never stalls the episode."""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field

from gearshift.api.common.v1.common_pb2 import Conversation, NativeRequest, Plan, PlanDecision, SampledSpan, TokenUsage, Turn
from gearshift.errors import InvalidArgument
from gearshift.policy_client import PolicyClient
from gearshift.protocol import prompts
from gearshift.protocol.sampled import sampled_span
from gearshift.protocol.sr2am import PLAN_HEAD, PLAN_OPENER, parse_plan_block, plan_block, render_plan
from gearshift.sampling import sampling_options
from gearshift.settings import PlannerSettings

REGULATE_PROMPT = """You regulate an agent's planning. Decide for the next turn:
PLAN_NEW - write a new plan (no plan yet, the plan is used up, or the last result surprised us);
CONTINUE - keep following the current plan;
ACT - act directly without planning (the next step is obvious).
Task: {query}
Current plan: {plan}
Steps of the plan done: {progress}
Last result: {last}
Answer with one word: PLAN_NEW, CONTINUE or ACT."""

PLAN_PROMPT = """Plan the next steps of an agent as a simulation: from the current state, each action and the state it should lead to. Tools: python, web_search, crawl_page.
Task: {query}
Last result: {last}
Write at most {horizon} steps in exactly this form:
Plan:
- Current State: <goal, givens, progress>
- Action: <next action>
- Expected Outcome: <predicted state>
- Next Action: <...>
- Expected Outcome: <...>"""

# Where a plan ends: the <plan> summary, a call or an answer follows it in the agent's message.
PLAN_STOP = ["<plan>", "<tool_call>", "<answer>", "<reasoning>"]

_DECISION_WORDS = (
    ("PLAN_NEW", PlanDecision.PLAN_DECISION_PLAN_NEW),
    ("CONTINUE", PlanDecision.PLAN_DECISION_CONTINUE),
    ("ACT", PlanDecision.PLAN_DECISION_ACT),
)
LAST_RESULT_CHARS = 400


@dataclass
class Belief:
    query: str
    history: list[Turn]
    plan: Plan
    progress: int
    transcript: str = ""  # the agent's message so far: plan in its context (BeliefState.transcript)
    conversation: Conversation | None = None  # the client's instructions and earlier turns
    native_messages: list[dict] = field(default_factory=list)  # the native protocol's form of transcript
    native: NativeRequest | None = None  # the native episode's tools and chat template arguments

    @property
    def in_context(self) -> bool:
        """Whether the policy continues the agent's own message (text or native), not a prompt."""
        return bool(self.transcript or self.native_messages)


@dataclass
class Continuation:
    """What the policy wrote after the agent's own message, as sampled."""

    text: str
    usage: TokenUsage
    token_ids: list[int] | None
    logprobs: list[float] | None = None  # one per token id, where the server returned them

    @classmethod
    def of(cls, reply) -> Continuation:
        """A chat completion's or a completion's reply."""
        text = reply.text if hasattr(reply, "text") else reply.content or ""
        return cls(text, reply.usage.tokens(), reply.token_ids, reply.logprobs)


@dataclass
class Decision:
    decision: int
    rationale: str
    usage: TokenUsage = field(default_factory=TokenUsage)
    sampled: SampledSpan | None = None  # what the policy sampled of the decision's plan block


@dataclass
class PlanResult:
    plan: Plan
    text: str
    usage: TokenUsage = field(default_factory=TokenUsage)
    sampled: SampledSpan | None = None  # what the policy sampled of the plan block


def last_result(history: list[Turn]) -> str:
    """The most recent tool output (or the last turn's text), clipped for the prompt."""
    for turn in reversed(history):
        if turn.tool_results:
            return "\n".join(r.error or r.output for r in turn.tool_results)[:LAST_RESULT_CHARS]
        if turn.output:
            return turn.output[-LAST_RESULT_CHARS:]
    return "none yet"


def rule_decision(belief: Belief) -> int:
    """SR2AM's intent without a model: plan when there is no usable plan or a step failed."""
    if not belief.plan.steps or belief.progress >= len(belief.plan.steps):
        return PlanDecision.PLAN_DECISION_PLAN_NEW
    last = belief.history[-1] if belief.history else None
    if last is not None and any(result.is_error for result in last.tool_results):
        return PlanDecision.PLAN_DECISION_PLAN_NEW
    return PlanDecision.PLAN_DECISION_CONTINUE


def decision_after_plan_head(text: str) -> int | None:
    """The decision a continuation of "Plan:" makes (the SR2AM blocks of sr2am.plan_block)."""
    if text.startswith("\n-"):
        return PlanDecision.PLAN_DECISION_PLAN_NEW
    if text.lstrip(" ").startswith("None"):
        return PlanDecision.PLAN_DECISION_ACT
    if text.startswith("\n\n") or text == "\n":
        return PlanDecision.PLAN_DECISION_CONTINUE
    return None


def parse_decision(text: str) -> int | None:
    words = re.findall(r"[A-Za-z_]+", text.upper())
    for word in words:
        for name, decision in _DECISION_WORDS:
            if word == name or (name == "PLAN_NEW" and word in ("PLAN", "NEW")):
                return decision
    return None


class SimulativePlanner:
    def __init__(self, policy: PolicyClient, config: PlannerSettings):
        self.policy = policy
        self.config = config

    async def regulate(self, belief: Belief, sampling: dict | None = None) -> Decision:
        """The configurator's decision; sampling (temperature, top_p) defaults to greedy. With the
        agent's message (belief.in_context) the decision is how the policy itself goes on after
        "Plan:" there: a plan, an empty line (continue) or "None" (act), as its transcripts
        teach it; without, it is asked with a prompt of its own."""
        _check(belief)
        if belief.in_context:
            reply = await self._continue(belief, PLAN_HEAD, max_tokens=self.config.regulate_max_tokens, **(sampling or sampling_options()))
            decision = decision_after_plan_head(reply.text)
        else:
            prompt = REGULATE_PROMPT.format(
                query=belief.query,
                plan=render_plan(belief.plan) if belief.plan.steps else "none",
                progress=f"{belief.progress} of {len(belief.plan.steps)}",
                last=last_result(belief.history),
            )
            reply = Continuation.of(await self.policy.chat([{"role": "user", "content": prompt}],
                                                           max_tokens=self.config.regulate_max_tokens, **(sampling or sampling_options())))
            decision = parse_decision(reply.text)
        usable = decision is not None and not (decision == PlanDecision.PLAN_DECISION_CONTINUE and belief.progress >= len(belief.plan.steps))
        sampled = None
        if usable:
            rationale = f"policy chose {PlanDecision.Name(decision)}"
            if belief.in_context:  # the policy continued its own "Plan:": the block's decision is its sample
                sampled = sampled_span(len(PLAN_HEAD), len(decision_text(decision)), reply.token_ids, reply.logprobs)
        else:
            decision = rule_decision(belief)
            rationale = f"policy reply {reply.text!r:.40} was not a usable decision; rule chose {PlanDecision.Name(decision)}"
        return Decision(decision, rationale, reply.usage, sampled)

    async def plan(self, belief: Belief, max_horizon: int, sampling: dict | None = None) -> PlanResult:
        """A simulative plan of at most max_horizon steps; sampling defaults to greedy."""
        _check(belief)
        horizon = min(max_horizon or self.config.max_horizon, self.config.max_horizon)
        opener = PLAN_OPENER
        options = {"max_tokens": self.config.max_tokens, "stop": PLAN_STOP, **(sampling or sampling_options())}
        if belief.in_context:  # continue the agent's own message, as in the transcripts it learns from
            reply = await self._continue(belief, opener, **options)
        else:
            prompt = PLAN_PROMPT.format(query=belief.query, last=last_result(belief.history), horizon=horizon)
            reply = Continuation.of(await self.policy.chat([{"role": "user", "content": prompt}, {"role": "assistant", "content": opener}],
                                                           **options, continue_final_message=True, add_generation_prompt=False))
        text = opener + reply.text
        parsed = parse_plan_block(text)
        plan = complete_steps(parsed.plan, horizon) if parsed else Plan()
        # In the agent's message the plan is its own sample, up to the line plan_block ends it with.
        sampled = sampled_span(len(opener), len(render_plan(plan)) + 1, reply.token_ids, reply.logprobs) if belief.in_context and plan.steps else None
        return PlanResult(plan, text, reply.usage, sampled)

    async def _continue(self, belief: Belief, opener: str, **options) -> Continuation:
        """The policy's continuation of the agent's own message after opener: the text protocol's
        transcript (a continued assistant message), or the native conversation's last message,
        rendered by the engine's chat template as the episode's requests are and continued raw
        (a chat completion would come back split by the engine's parsers)."""
        if not belief.native_messages:
            return Continuation.of(await self.policy.chat(prompts.messages(belief.query, belief.transcript + opener, belief.conversation),
                                                          **options, continue_final_message=True, add_generation_prompt=False))
        *earlier, last = belief.native_messages
        native = belief.native or NativeRequest()
        prompt = await self.policy.render_chat(
            [*earlier, {**last, "content": (last.get("content") or "") + opener}],
            tools=json.loads(native.tools_json) if native.tools_json else None,
            chat_template_kwargs=json.loads(native.chat_template_kwargs_json or "{}") or None,
            continue_final_message=True,
        )
        return Continuation.of(await self.policy.complete(prompt, **options))


def decision_text(decision: int) -> str:
    """The start of a turn's plan block that the decision writes (sr2am.plan_block): the whole
    block for CONTINUE and ACT, the opener a new plan continues from for PLAN_NEW."""
    if decision == PlanDecision.PLAN_DECISION_PLAN_NEW:
        return PLAN_OPENER
    return plan_block(decision, Plan(), first_turn=True)[0]


def complete_steps(plan: Plan, horizon: int) -> Plan:
    """The plan's leading steps that have a state, an action and an expected outcome, at most
    horizon of them: a step missing one would render as a plan block SR2AM's checker rejects.
    No usable step, no plan (the executor then acts without one)."""
    steps = []
    for step in list(plan.steps)[:horizon]:
        if not (step.state and step.action and step.expected_outcome):
            break
        steps.append(step)
    return Plan(steps=steps)


def _check(belief: Belief) -> None:
    if not belief.query.strip():
        raise InvalidArgument("belief state has an empty query")
    if belief.progress < 0:
        raise InvalidArgument("plan_progress must not be negative")
