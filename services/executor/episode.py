"""One episode, free of gRPC servicing: route, run the mode loop, call tools, account tokens and
cost, score, store. Yields SolveEvents as things happen; the last one carries the stored
trajectory.

The whole episode is one assistant turn that grows: the routing prefix, then each generation,
tool responses appended by the environment (A^2FM). The policy server keeps the chat template;
the executor continues the assistant message (`continue_final_message`, as vLLM offers it).
The native protocol (a chat conversation with structured tool calls) is NativeEpisodeRunner's,
in native.py: the same episode, routing, planning, tools and wrap-up, other mode loops.

The episode's budget is its deadline (gearshift.deadlines): every call it makes (router,
planner, sandbox, reward, store, the policy) ends by the budget's end, and a step the budget
runs out in ends the episode BUDGET_EXHAUSTED with the turns it finished. The wrap-up (score,
store) runs in a task of its own, which neither the caller going away nor the executor stopping
cuts short: an interrupted episode is stored CANCELLED with its turns so far."""

from __future__ import annotations

import asyncio
import json
import logging
import time
import uuid
from collections.abc import AsyncIterator
from dataclasses import dataclass, field

import grpc
from gearshift.api.common.v1.common_pb2 import (
    Mode,
    Plan,
    PlanDecision,
    PlanningStats,
    PolicyProtocol,
    RoutingStrategy,
    SampledSpan,
    Sampling,
    TokenUsage,
    ToolCall,
    ToolResult,
    Trajectory,
    TrajectoryStatus,
    Turn,
)
from gearshift.api.executor.v1 import executor_pb2
from gearshift.api.planner.v1 import planner_pb2, planner_pb2_grpc
from gearshift.api.reward.v1 import reward_pb2, reward_pb2_grpc
from gearshift.api.router.v1 import router_pb2, router_pb2_grpc
from gearshift.api.sandbox.v1 import sandbox_pb2, sandbox_pb2_grpc
from gearshift.api.store.v1 import store_pb2, store_pb2_grpc
from gearshift import deadlines, tracing
from gearshift.errors import DeadlineExceeded, GearshiftError, InvalidArgument
from gearshift.policy_client import PolicyClient
from gearshift.pricing import CostTable, add_usage
from gearshift.protocol import a2fm, prompts
from gearshift.protocol.parsers import Splitter
from gearshift.protocol.parsers import a2fm as a2fm_format
from gearshift.protocol.sampled import sampled_span, shifted
from gearshift.protocol.sr2am import plan_block, plan_block_separator
from gearshift.sampling import SEEDS, sampling_options, with_seed
from gearshift.services.executor import metrics
from gearshift.services.executor.durable_store import UNAVAILABLE, DurableStore
from gearshift.settings import STORE_WRITE_MARGIN_SECONDS, ExecutorSettings, Limits
from google.protobuf.timestamp_pb2 import Timestamp

log = logging.getLogger("gearshift.executor")
ROUTING_TURN = -1
# A call that failed DEADLINE_EXCEEDED this close to the budget's end (or after it) failed because the budget ran out.
BUDGET_SLACK_SECONDS = 0.25
MIN_TOOL_SECONDS = 0.05
# How long a Solve naming its trajectory id waits for the store to say whether that id already ran.
LOOKUP_SECONDS = 2.0
# Sandbox statuses that end one tool call, not the episode: the model reads them as the call's error.
TOOL_ERRORS = {
    grpc.StatusCode.INVALID_ARGUMENT: lambda exc: exc.details() or "invalid call",
    grpc.StatusCode.NOT_FOUND: lambda exc: exc.details() or "not found",
    grpc.StatusCode.UNAVAILABLE: lambda exc: f"the sandbox is unavailable ({exc.details()}); the call did not run",
    grpc.StatusCode.DEADLINE_EXCEEDED: lambda exc: "the sandbox did not answer in time; the call was abandoned",
    grpc.StatusCode.CANCELLED: lambda exc: "the sandbox replica stopped before the call finished",
}


@dataclass
class Downstream:
    """The services an episode calls."""

    router: router_pb2_grpc.RouterStub
    planner: planner_pb2_grpc.PlannerStub
    sandbox: sandbox_pb2_grpc.SandboxStub
    reward: reward_pb2_grpc.RewardStub
    store: store_pb2_grpc.TrajectoryStoreStub


@dataclass
class Budget:
    max_steps: int
    max_tokens: int
    deadline: float  # time.monotonic() value
    max_output_tokens: int = 0  # 0: only max_tokens bounds what the policy generates

    def exhausted(self, usage: TokenUsage) -> bool:
        return (usage.input_tokens + usage.output_tokens >= self.max_tokens or time.monotonic() >= self.deadline
                or 0 < self.max_output_tokens <= usage.output_tokens)

    def ran_out_in(self, exc: BaseException) -> bool:
        """Whether exc is a call cut short by the budget's end (its deadline, which every call carries)."""
        out_of_time = isinstance(exc, DeadlineExceeded) or (
            isinstance(exc, grpc.aio.AioRpcError) and exc.code() == grpc.StatusCode.DEADLINE_EXCEEDED)
        return out_of_time and time.monotonic() >= self.deadline - BUDGET_SLACK_SECONDS

    def turn_tokens(self, per_turn: int, usage: TokenUsage) -> int:
        """The most tokens the next generation may take: the per-turn cap, within the output budget."""
        return max(0, min(per_turn, self.max_output_tokens - usage.output_tokens)) if self.max_output_tokens else per_turn


@dataclass
class EpisodeState:
    """What is known so far; becomes the stored trajectory."""

    trajectory: Trajectory
    sampling: Sampling  # how the policy's turns sample
    explore: Sampling | None  # the caller's sampling for routing and planning too; None: greedy
    transcript: str = ""  # the assistant turn so far
    plan: Plan = field(default_factory=Plan)
    plan_progress: int = 0
    last_finish: str | None = None  # why the last generation stopped: "stop", "length", ...
    budget: Budget | None = None  # set when the episode starts
    calls: int = 0  # model calls made so far (a seeded episode's k-th samples with seed + k)
    said: Splitter = field(default_factory=a2fm_format.EpisodeText)  # reads the answer and reasoning to stream

    def turn_tokens(self, per_turn: int) -> int:
        """The most tokens the next generation may take."""
        return self.budget.turn_tokens(per_turn, self.trajectory.usage) if self.budget else per_turn

    def next_sampling(self, sampling: Sampling | None) -> Sampling | None:
        """The sampling of the episode's next model call: with a seed, the k-th call samples with
        seed + k, so the episode repeats without every call drawing the same random numbers."""
        if sampling is None or not sampling.HasField("seed"):
            return sampling
        self.calls += 1
        return with_seed(sampling, (sampling.seed + self.calls - 1) % SEEDS)

    def account(self, turn: Turn | None, usage: TokenUsage) -> None:
        """Counts one model call's tokens: the trajectory's usage (priced, and held against the
        token budget) is the sum of every call of the episode; a turn's, of its own calls."""
        add_usage(self.trajectory.usage, usage)
        if turn is not None:
            add_usage(turn.usage, usage)

    def inject(self, turn: Turn, text: str) -> None:
        """Writes platform text into the turn (an opener the model continues from); the turn
        records where, so training masks it and the stored turn still replays exactly."""
        start = len(turn.output)
        turn.output += text
        self.transcript += text
        turn.injected_spans.extend((start, len(turn.output)))


def event(turn: int, **kind) -> executor_pb2.SolveEvent:
    return executor_pb2.SolveEvent(turn=turn, **kind)


class EpisodeRunner:
    """Runs episodes; one per executor process, shared by concurrent requests."""

    protocol = PolicyProtocol.POLICY_PROTOCOL_TEXT

    def __init__(self, policy: PolicyClient, downstream: Downstream, config: ExecutorSettings, limits: Limits,
                 costs: CostTable, model_version: str, stored: DurableStore):
        self.policy = policy
        self.down = downstream
        self.stored = stored  # the store's Put with the spool behind it: how a finished trajectory is kept
        self.config = config
        self.limits = limits
        self.costs = costs
        self.model_version = model_version
        self._tools: list[sandbox_pb2.ToolSpec] | None = None
        self._saving: set[asyncio.Task] = set()  # wrap-ups under way (saved() waits for them)

    # Entry point

    async def solve(self, request: executor_pb2.SolveRequest) -> AsyncIterator[executor_pb2.SolveEvent]:
        self._validate(request)
        state = self._new_state(request)
        tracing.bind_trajectory(state.trajectory.id)  # every log line and span of the episode from here on
        started = time.monotonic()
        budget = state.budget = self._budget(request.budget, started)
        # Every call of the episode, routing's and the idempotency check's included, ends by the
        # budget's end (or the caller's deadline, when that is sooner).
        with deadlines.within(budget.deadline):
            # Routing starts beside the idempotency check, a store round-trip on every request that
            # names its trajectory id (evaluation, rollouts, teaching): the check costs no time then.
            routed = asyncio.ensure_future(self._route(request, state))
            try:
                stored = await self._already_stored(request.trajectory_id)
            except BaseException:
                _discard(routed)
                raise
            if stored is not None:  # an idempotent retry: the episode already ran
                _discard(routed)
                yield event(ROUTING_TURN, final=executor_pb2.Final(trajectory=stored))
                return
            try:
                async for item in self._run(state, budget, routed):
                    yield item
            except asyncio.CancelledError:  # the caller went away, or the executor is stopping
                state.trajectory.status = TrajectoryStatus.TRAJECTORY_STATUS_CANCELLED
                await self._save(state, request, started, score=False)
                raise
            except (GearshiftError, grpc.aio.AioRpcError) as exc:
                if not budget.ran_out_in(exc):
                    state.trajectory.status = TrajectoryStatus.TRAJECTORY_STATUS_FAILED
                    await self._save(state, request, started, score=False)
                    raise
                # The budget ran out during a step: the episode ends as one that ran out between steps.
                log.info("episode %s: its budget ran out during a step (%s)", state.trajectory.id, exc)
                state.trajectory.status = TrajectoryStatus.TRAJECTORY_STATUS_BUDGET_EXHAUSTED
        await self._save(state, request, started, score=bool(request.reference_answer))
        yield event(ROUTING_TURN, final=executor_pb2.Final(trajectory=state.trajectory))

    async def _save(self, state: EpisodeState, request, started: float, score: bool) -> None:
        """The wrap-up (_finish) in a task of its own, which a cancellation of the episode does
        not stop: the caller going away, or the executor stopping, cannot lose what the episode
        did; a stopping executor waits for it (saved())."""
        saving = asyncio.ensure_future(self._finish_in_time(state, request, started, score))
        self._saving.add(saving)
        saving.add_done_callback(_saved)
        saving.add_done_callback(self._saving.discard)
        await asyncio.shield(saving)

    async def _finish_in_time(self, state: EpisodeState, request, started: float, score: bool) -> None:
        # The wrap-up may outlast the budget, and the caller's deadline, by the margin the drain
        # gives an episode at its limit to score and store itself (the durable store has its own bound).
        with deadlines.within(state.budget.deadline + STORE_WRITE_MARGIN_SECONDS, replace=True):
            await self._finish(state, request, started, score)

    async def saved(self, timeout: float) -> None:
        """Waits, at most timeout seconds, for the wrap-ups under way (a stopping executor's)."""
        if self._saving:
            await asyncio.wait(set(self._saving), timeout=timeout)

    def _route(self, request: executor_pb2.SolveRequest, state: EpisodeState):
        return self.down.router.Route(router_pb2.RouteRequest(
            query=request.query, strategy=request.strategy, forced_mode=request.mode, sampling=state.next_sampling(state.explore),
            conversation=request.conversation,
        ))

    async def _run(self, state: EpisodeState, budget: Budget, routed: asyncio.Future) -> AsyncIterator[executor_pb2.SolveEvent]:
        route = await routed
        trajectory = state.trajectory
        trajectory.mode = route.mode
        trajectory.routing_strategy = route.strategy
        trajectory.routing_rationale = route.rationale
        if route.HasField("sampled"):
            trajectory.routing_sampled.append(route.sampled)
        state.account(None, route.usage)
        yield event(ROUTING_TURN, mode_chosen=executor_pb2.ModeChosen(mode=route.mode, strategy=route.strategy, rationale=route.rationale))
        async for item in self._mode_loop(state, budget):
            yield item
        if not trajectory.status:
            trajectory.status = TrajectoryStatus.TRAJECTORY_STATUS_BUDGET_EXHAUSTED

    # Mode loops

    def _mode_loop(self, state: EpisodeState, budget: Budget) -> AsyncIterator[executor_pb2.SolveEvent]:
        """The episode after routing: the assistant turn opens with the routing head."""
        mode = state.trajectory.mode
        state.transcript = a2fm.episode_prefix(mode, state.trajectory.routing_rationale)
        state.said.feed(prompts.MODE_OPENERS[mode])
        return (self._agentic if mode == Mode.MODE_AGENTIC else self._direct)(state, budget)

    async def _direct(self, state: EpisodeState, budget: Budget) -> AsyncIterator[executor_pb2.SolveEvent]:
        """Instant and reasoning mode: generate until </answer>, continuing if cut by length."""
        steps = budget.max_steps or self.config.max_steps_other
        for index in range(steps):
            if budget.exhausted(state.trajectory.usage):
                return
            turn = Turn(index=index)
            async for item in self._generate(state, turn, stop=["</answer>"]):
                yield item
            state.trajectory.turns.append(turn)
            answer = a2fm_format.tag_content(state.transcript, "answer")
            if answer is not None and state.transcript.endswith("</answer>"):
                for item in self._answer(state, answer):
                    yield item
                return
            if state.last_finish != "length":  # the model stopped without closing its answer
                for item in self._answer(state, answer if answer is not None else _untagged(state.transcript)):
                    yield item
                return
        async for item in self._at_step_limit(state, budget, steps):
            yield item

    async def _agentic(self, state: EpisodeState, budget: Budget) -> AsyncIterator[executor_pb2.SolveEvent]:
        """Agentic mode: per turn regulate (and maybe plan), generate, run the tool calls."""
        tools = await self._known_tools()
        steps = budget.max_steps or self.config.max_steps_agentic
        for index in range(steps):
            if budget.exhausted(state.trajectory.usage):
                return
            turn = Turn(index=index)
            started = time.monotonic()
            yield await self._regulate(state, turn)
            async for item in self._generate(state, turn, stop=list(a2fm_format.STOP_WORDS)):
                yield item
            step = a2fm_format.read_step(turn.output, tools)
            if step.answer is not None:
                state.trajectory.turns.append(turn)
                for item in self._answer(state, step.answer):
                    yield item
                return
            calls = [ToolCall(id=ident, name=call.name, arguments_json=call.arguments) for ident, call in step.calls or []]
            for call in calls:
                yield event(index, tool_call=call)
            results = await self._run_tools(state, turn, calls, step.problems)
            for result in results:
                yield event(index, tool_result=result)
            state.plan_progress += 1 if turn.tool_calls else 0
            turn.wall_seconds = time.monotonic() - started
            state.trajectory.turns.append(turn)
            if step.calls is None and state.last_finish != "length":
                # Neither a call nor an answer: ask for the answer rather than loop on nothing.
                async for item in self._force_answer(state, index + 1, a2fm.FORCED_ANSWER_OPENER):
                    yield item
                return
        async for item in self._at_step_limit(state, budget, steps):
            yield item

    async def _at_step_limit(self, state: EpisodeState, budget: Budget, index: int) -> AsyncIterator[executor_pb2.SolveEvent]:
        """The steps ran out without an answer: the trajectory ends BUDGET_EXHAUSTED, or with
        answer_at_step_limit one more turn asks for the answer (budget forcing, as in s1)."""
        opener = a2fm.forced_answer_opener(state.transcript)
        if self.config.answer_at_step_limit and opener is not None and not budget.exhausted(state.trajectory.usage):
            async for item in self._force_answer(state, index, opener):
                yield item

    async def _force_answer(self, state: EpisodeState, index: int, opener: str) -> AsyncIterator[executor_pb2.SolveEvent]:
        turn = Turn(index=index)
        state.inject(turn, opener)
        state.said.feed(opener)
        yield event(index, answer_asked=executor_pb2.AnswerAsked(opener=opener))
        async for item in self._generate(state, turn, stop=["</answer>"]):
            yield item
        state.trajectory.turns.append(turn)
        for item in self._answer(state, a2fm_format.tag_content(state.transcript, "answer") or ""):
            yield item

    # Pieces

    async def _regulate(self, state: EpisodeState, turn: Turn) -> executor_pb2.SolveEvent:
        """The configurator (and planner) in the agent's own message; the turn's output opens
        with the SR2AM block of the decision."""
        samples = await self._decide(state, turn, transcript=state.transcript + plan_block_separator(first_turn=not turn.index))
        block, opener = plan_block(turn.plan_decision, turn.plan, first_turn=not turn.index)
        state.transcript += block  # the agent's own reasoning (SR2AM): learned in training
        turn.output += block
        turn.sampled.extend(shifted(span, len(plan_block_separator(first_turn=not turn.index))) for span in samples)
        state.inject(turn, opener)
        return event(turn.index, plan=executor_pb2.PlanMade(decision=turn.plan_decision, plan=turn.plan))

    async def _decide(self, state: EpisodeState, turn: Turn, transcript: str = "", native_messages: list[dict] | None = None) -> list[SampledSpan]:
        """Records the configurator's decision for the turn, and a new plan when it asks for one
        and the planner writes one; returns what the policy sampled of them in the agent's
        message: the text protocol's transcript, or the native protocol's chat messages."""
        belief = planner_pb2.BeliefState(
            query=state.trajectory.query, history=state.trajectory.turns, current_plan=state.plan, plan_progress=state.plan_progress,
            transcript=transcript, conversation=state.trajectory.conversation,
        )
        if native_messages:
            belief.native_messages_json = json.dumps(native_messages)
            belief.native.CopyFrom(state.trajectory.native)
        decision = await self.down.planner.Regulate(planner_pb2.RegulateRequest(state=belief, sampling=state.next_sampling(state.explore)))
        state.account(turn, decision.usage)
        turn.plan_decision = decision.decision
        samples = [decision.sampled] if decision.HasField("sampled") else []
        if decision.decision == PlanDecision.PLAN_DECISION_PLAN_NEW:
            planned = await self.down.planner.Plan(planner_pb2.PlanRequest(state=belief, sampling=state.next_sampling(state.explore)))
            state.account(turn, planned.usage)
            if planned.plan.steps:
                state.plan, state.plan_progress = planned.plan, 0
                turn.plan.CopyFrom(planned.plan)
                samples += [planned.sampled] if planned.HasField("sampled") else []
            else:
                turn.plan_decision = PlanDecision.PLAN_DECISION_ACT  # the planner produced nothing usable
                samples = []  # the block is the platform's, not what was sampled
        return samples

    async def _generate(self, state: EpisodeState, turn: Turn, stop: list[str]) -> AsyncIterator[executor_pb2.SolveEvent]:
        """Continues the assistant turn, streaming chunks; closes a tag the stop word cut."""
        remaining = state.turn_tokens(self.config.max_tokens_per_turn)
        if not remaining:  # planning spent the output budget: the turn is cut where it starts
            state.last_finish = "length"
            return
        text, finish, usage, token_ids, logprobs = [], None, None, None, None
        async for chunk in metrics.awaiting_policy(self.policy.stream_chat(
            prompts.messages(state.trajectory.query, state.transcript, state.trajectory.conversation),
            max_tokens=remaining,
            **sampling_options(state.next_sampling(state.sampling)),
            stop=stop,
            continue_final_message=True,
            add_generation_prompt=False,
        )):
            if chunk.text:
                text.append(chunk.text)
                yield event(turn.index, chunk=said_chunk(chunk.text, state.said.feed(chunk.text)))
            finish, usage, token_ids = chunk.finish_reason or finish, chunk.usage or usage, chunk.token_ids or token_ids
            logprobs = chunk.logprobs or logprobs
        output = "".join(text)
        if finish == "stop":
            output += _closing_tag(state.transcript + output, stop)  # the stop word the model sampled
        state.last_finish = finish
        state.transcript += output
        span = sampled_span(len(turn.output), len(turn.output) + len(output), token_ids, logprobs)
        if span is not None:
            turn.sampled.append(span)
        turn.output += output
        if usage is not None:
            state.account(turn, usage.tokens())

    async def _run_tools(self, state: EpisodeState, turn: Turn, calls: list[ToolCall], problems: list[str]) -> list[ToolResult]:
        """Runs the calls in parallel. Rejected calls become error results too, so the model is
        told what was wrong and the stored turn replays exactly what it saw."""
        turn.tool_calls.extend(calls)
        results = list(await asyncio.gather(*(self._execute(state.trajectory.id, call) for call in calls)))
        results += [ToolResult(call_id=f"{a2fm.REJECTED_CALL_PREFIX}{n}", is_error=True, error=error) for n, error in enumerate(problems, 1)]
        turn.tool_results.extend(results)
        state.transcript += a2fm.tool_response_of(results)
        return results

    async def _execute(self, trajectory_id: str, call: ToolCall) -> ToolResult:
        # The tool's own limit within what is left of the budget: the sandbox stops it and says so in time.
        limit = max(deadlines.bound(self.config.tool_timeout_seconds), MIN_TOOL_SECONDS)
        request = sandbox_pb2.ExecuteRequest(call=call, trajectory_id=trajectory_id, timeout_seconds=limit)
        try:
            with tracing.span(f"tool {call.name}", **{"gearshift.tool.name": call.name}) as span:
                reply = await self.down.sandbox.Execute(request, timeout=self.config.tool_timeout_seconds + 5)
                tracing.annotate(span, **{"gearshift.tool.is_error": reply.result.is_error})
        except grpc.aio.AioRpcError as exc:
            if exc.code() not in TOOL_ERRORS:
                raise
            # The model's call was bad (arguments, size), or no sandbox replica could run it (after
            # the channel's retries): tell the model, keep the episode going.
            return ToolResult(call_id=call.id, name=call.name, is_error=True, error=TOOL_ERRORS[exc.code()](exc))
        return reply.result

    async def _tool_specs(self) -> list[sandbox_pb2.ToolSpec]:
        """The sandbox's tools, asked once."""
        if self._tools is None:
            self._tools = list((await self.down.sandbox.ListTools(sandbox_pb2.ListToolsRequest())).tools)
        return self._tools

    async def _known_tools(self) -> frozenset[str]:
        return frozenset(tool.name for tool in await self._tool_specs())

    def _answer(self, state: EpisodeState, answer: str) -> list[executor_pb2.SolveEvent]:
        """The answer event, after what the episode text still held back (a "<" that never
        became a tag)."""
        state.trajectory.answer = answer
        state.trajectory.status = TrajectoryStatus.TRAJECTORY_STATUS_COMPLETED
        index = state.trajectory.turns[-1].index if state.trajectory.turns else ROUTING_TURN
        answered = [event(index, answer=executor_pb2.Answer(text=answer))]
        rest = said_chunk("", state.said.finish())
        return [event(index, chunk=rest), *answered] if rest.answer or rest.reasoning else answered

    # Set-up and wrap-up

    def _validate(self, request: executor_pb2.SolveRequest) -> None:
        if not request.query.strip():
            raise InvalidArgument("query is empty")
        if len(request.query) > self.limits.max_query_chars:
            raise InvalidArgument(f"query longer than {self.limits.max_query_chars} characters")
        if len(request.reference_answer) > self.limits.max_answer_chars:
            raise InvalidArgument(f"reference_answer longer than {self.limits.max_answer_chars} characters")
        prompts.check_conversation(request.conversation, self.limits.max_query_chars * 8)
        if request.mode not in Mode.values():
            raise InvalidArgument(f"unknown mode {request.mode}")
        if request.strategy not in RoutingStrategy.values():
            raise InvalidArgument(f"unknown routing strategy {request.strategy}")
        budget = request.budget
        if budget.max_steps < 0 or budget.max_tokens < 0 or budget.max_wall_seconds < 0 or budget.max_output_tokens < 0:
            raise InvalidArgument("budget fields must not be negative")
        if request.trajectory_id:
            try:
                request.trajectory_id = str(uuid.UUID(request.trajectory_id))  # the store keeps canonical ids
            except ValueError:
                raise InvalidArgument("trajectory_id must be a UUID") from None

    def _budget(self, asked: executor_pb2.Budget, started: float) -> Budget:
        return Budget(
            max_steps=asked.max_steps,  # 0: the mode's default
            max_tokens=asked.max_tokens or self.config.max_tokens,
            deadline=started + (asked.max_wall_seconds or self.config.max_wall_seconds),
            max_output_tokens=asked.max_output_tokens,
        )

    def _new_state(self, request: executor_pb2.SolveRequest) -> EpisodeState:
        created = Timestamp()
        created.GetCurrentTime()
        trajectory = Trajectory(
            id=request.trajectory_id or str(uuid.uuid4()),
            query=request.query,
            requested_mode=request.mode,
            reference_answer=request.reference_answer,
            task_source=request.task_source or "user",
            split=request.split,
            run_id=request.run_id,
            model_version=self.model_version,
            labels=dict(request.labels),
            purpose=request.purpose,
            created_at=created,
            usage=TokenUsage(),
            conversation=request.conversation,
            protocol=self.protocol,
        )
        if request.HasField("sampling"):  # rollouts: every model call explores, routing and planning too
            return EpisodeState(trajectory, request.sampling, request.sampling)
        config = self.config
        sampling = Sampling(temperature=config.temperature, top_p=config.top_p, frequency_penalty=config.frequency_penalty)
        return EpisodeState(trajectory, sampling, None)

    async def _already_stored(self, trajectory_id: str) -> Trajectory | None:
        if not trajectory_id:
            return None
        spooled = await self.stored.spooled(trajectory_id)
        if spooled is not None:  # ran and was acknowledged; the store does not have it yet
            return spooled
        try:
            reply = await self.down.store.Get(store_pb2.GetRequest(id=trajectory_id), timeout=LOOKUP_SECONDS)
        except grpc.aio.AioRpcError as exc:
            if exc.code() == grpc.StatusCode.NOT_FOUND:
                return None
            if exc.code() in UNAVAILABLE:
                # The store is away (the gateway names a fresh id for every stream, so this is
                # rarely a retry): run the episode rather than fail it; the store's Put keeps
                # the first copy of an id, so a true retry that runs again is stored once.
                log.warning("episode %s: the store did not answer whether it already ran (%s); running it", trajectory_id, exc.code().name)
                return None
            raise
        return reply.trajectory

    async def _finish(self, state: EpisodeState, request, started: float, score: bool) -> None:
        """Stats, cost, reward, then the store: the trajectory is stored, or spooled while the store
        is unavailable, before the reply ends (durable_store.py)."""
        trajectory = state.trajectory
        trajectory.wall_seconds = time.monotonic() - started
        trajectory.planning.CopyFrom(planning_stats(trajectory))
        if score:  # an episode that ran out of budget is scored too: it has no correct answer
            scored = (await self.down.reward.Score(
                reward_pb2.ScoreRequest(reference_answer=request.reference_answer, rollouts=[trajectory])
            )).scored[0]
            trajectory.reward.CopyFrom(scored.reward)
            state.account(None, scored.judge_usage)
        trajectory.cost.CopyFrom(self.costs.price_trajectory(trajectory))  # every model call, a judge's included
        tracing.describe_episode(trajectory)  # on the Solve span: mode and why, tokens, cost
        log.debug("episode %s: %s, %s, %d input and %d output tokens, $%.6f, %.2f s", trajectory.id, Mode.Name(trajectory.mode),
                  TrajectoryStatus.Name(trajectory.status), trajectory.usage.input_tokens, trajectory.usage.output_tokens,
                  trajectory.cost.total_usd, trajectory.wall_seconds)
        await self.stored.put(trajectory)


def _saved(task: asyncio.Task) -> None:
    """Logs a wrap-up that failed, which no one may be waiting for (its episode was cancelled)."""
    if not task.cancelled() and task.exception() is not None:
        log.error("an episode's trajectory could not be stored: %r", task.exception())


def _discard(task: asyncio.Future) -> None:
    """Cancels a call whose answer is no longer wanted, and retrieves its outcome so that asyncio
    does not report it as an exception nobody read."""
    task.cancel()
    task.add_done_callback(lambda done: done.cancelled() or done.exception())


def planning_stats(trajectory: Trajectory) -> PlanningStats:
    """SR2AM metrics: planning frequency, mean plan depth, agent-generated tokens."""
    planned = [turn for turn in trajectory.turns if turn.plan_decision]
    new_plans = [turn for turn in planned if turn.plan_decision == PlanDecision.PLAN_DECISION_PLAN_NEW]
    return PlanningStats(
        planning_frequency=len(new_plans) / len(planned) if planned else 0.0,
        mean_plan_depth=sum(len(t.plan.steps) for t in new_plans) / len(new_plans) if new_plans else 0.0,
        reasoning_tokens=sum(turn.usage.output_tokens for turn in trajectory.turns),
    )


def said_chunk(text: str, pieces: list) -> executor_pb2.OutputChunk:
    """A chunk of the policy's text with the answer and reasoning it adds (parsers' pieces)."""
    said = {kind: "".join(piece.text for piece in pieces if piece.kind == kind) for kind in ("content", "reasoning")}
    return executor_pb2.OutputChunk(text=text, answer=said["content"], reasoning=said["reasoning"])


def _closing_tag(text: str, stop: list[str]) -> str:
    """The stop word that ended the text: the closer of the last opened tag among the stops."""
    best, where = "", -1
    for word in stop:
        opened = text.rfind("<" + word[2:])
        if opened > where and opened >= text.rfind(word):
            best, where = word, opened
    return best


def _untagged(text: str) -> str:
    """A last-resort answer from text that never closed its tags: the text after the last tag."""
    tail = text.rsplit(">", 1)[-1].strip()
    return tail or text.strip()

