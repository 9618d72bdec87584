"""The native protocol's episode (gearshift.protocol.native): a chat conversation in which the
engine's parsers return the policy's tool calls as `tool_calls` and its thinking as
`reasoning_content`, for policies that call tools natively (Qwen3 and Agents-A1 on vLLM with
--tool-call-parser and --reasoning-parser).

Routing, the budget, the sandbox calls, scoring and storing are EpisodeRunner's; only the mode
loop differs. Per turn the request is the whole conversation so far, rebuilt from the trajectory
by the function training renders it with:
- instant: thinking off, no tools; reasoning: thinking on, no tools; one generation, the answer;
- agentic: tools on; per turn the configurator (and planner) continue the conversation with the
  SR2AM block (as in the text protocol's transcript), which is then the assistant message the
  generation continues (continue_final_message); its tool calls run
  in parallel (malformed ones refused with a result the model reads) and come back as one `tool`
  message per call; an assistant message without tool calls is the answer."""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import AsyncIterator

from gearshift.api.common.v1.common_pb2 import NativeRequest, PolicyProtocol, ToolResult, Turn
from gearshift.api.executor.v1 import executor_pb2
from gearshift.protocol import native, parsers
from gearshift.protocol.sr2am import plan_block_separator
from gearshift.sampling import sampling_options
from gearshift.services.executor import metrics
from gearshift.services.executor.episode import Budget, EpisodeRunner, EpisodeState, event, said_chunk


class NativeEpisodeRunner(EpisodeRunner):
    """EpisodeRunner speaking the native protocol (policy_client.protocol: native)."""

    protocol = PolicyProtocol.POLICY_PROTOCOL_NATIVE

    def _mode_loop(self, state: EpisodeState, budget: Budget) -> AsyncIterator[executor_pb2.SolveEvent]:
        return self._conversation(state, budget)

    async def _conversation(self, state: EpisodeState, budget: Budget) -> AsyncIterator[executor_pb2.SolveEvent]:
        trajectory = state.trajectory
        agentic = native.offers_tools(trajectory.mode)
        tools = native.tool_schemas(await self._tool_specs()) if agentic else []
        trajectory.native.CopyFrom(NativeRequest(
            tools_json=json.dumps(tools) if tools else "",
            chat_template_kwargs_json=json.dumps(native.CHAT_TEMPLATE_KWARGS[trajectory.mode]),
        ))
        known = frozenset(tool["function"]["name"] for tool in tools)
        if not agentic:  # the one message is the answer: its content streams as the answer, trimmed
            state.said = parsers.get("think")(parse_tools=False, parse_reasoning=False)
        steps = budget.max_steps or (self.config.max_steps_agentic if agentic else 1)
        for index in range(steps):
            if budget.exhausted(state.trajectory.usage):
                return
            turn = Turn(index=index)
            started = time.monotonic()
            if agentic:  # the SR2AM block, as the policy goes on in its own message after "Plan:"
                opening = {"role": "assistant", "content": plan_block_separator(first_turn=not index)}
                await self._decide(state, turn, native_messages=[*native.messages(trajectory), opening])
                yield event(index, plan=executor_pb2.PlanMade(decision=turn.plan_decision, plan=turn.plan))
            calls = []
            async for item in self._chat(state, turn, tools, calls):
                yield item
            if not calls:  # an assistant message without calls: the answer
                state.trajectory.turns.append(turn)
                if state.last_finish != "length":
                    for item in self._answer(state, turn.output.strip()):
                        yield item
                return  # cut by the turn's token limit: a message the policy did not end is no answer (BUDGET_EXHAUSTED)
            read = native.read_calls(calls, known)
            for item in read:
                yield event(index, tool_call=item.call)
            results = await self._run_native_calls(state, turn, read)
            for result in results:
                yield event(index, tool_result=result)
            state.plan_progress += 1
            turn.wall_seconds = time.monotonic() - started
            state.trajectory.turns.append(turn)
        # Steps used up: the trajectory ends without an answer (BUDGET_EXHAUSTED).

    async def _chat(self, state: EpisodeState, turn: Turn, tools: list[dict], calls: list) -> AsyncIterator[executor_pb2.SolveEvent]:
        """One generation on the conversation so far (continuing the turn's opening message, when
        it has one), streaming content and reasoning; the engine's tool calls go to calls."""
        trajectory = state.trajectory
        remaining = state.turn_tokens(self.config.max_tokens_per_turn)
        if not remaining:  # planning spent the output budget: the turn is cut where it starts
            state.last_finish = "length"
            return
        content, reasoning, finish, usage, token_ids, logprobs = [], [], None, None, None, None
        opened = native.opening_message(turn) is not None
        async for chunk in metrics.awaiting_policy(self.policy.stream_chat(
            native.messages(trajectory, upcoming=turn),
            continue_final_message=opened,
            add_generation_prompt=not opened,
            tools=tools or None,
            max_tokens=remaining,
            **sampling_options(state.next_sampling(state.sampling)),
            chat_template_kwargs=native.served_kwargs(trajectory),
            **({"chat_template": self.policy.chat_template} if self.policy.chat_template else {}),
        )):
            if chunk.text:
                content.append(chunk.text)
                yield event(turn.index, chunk=said_chunk(chunk.text, state.said.feed(chunk.text) if not tools else []))
            if chunk.reasoning:
                reasoning.append(chunk.reasoning)
                yield event(turn.index, chunk=executor_pb2.OutputChunk(reasoning=chunk.reasoning))
            calls += chunk.tool_calls
            finish, usage, token_ids = chunk.finish_reason or finish, chunk.usage or usage, chunk.token_ids or token_ids
            logprobs = chunk.logprobs or logprobs
        state.last_finish = finish
        turn.output, turn.reasoning_content = "".join(content), "".join(reasoning)
        turn.token_ids.extend(token_ids or [])
        if token_ids and logprobs is not None and len(logprobs) == len(token_ids):
            turn.token_logprobs.extend(logprobs)
        if usage is not None:
            state.account(turn, usage.tokens())

    async def _run_native_calls(self, state: EpisodeState, turn: Turn, read: list[native.ReadCall]) -> list[ToolResult]:
        """Runs the well-formed calls in parallel in the sandbox; the refused ones get the
        platform's error result. Every call is kept with its result, in the engine's order, as
        the conversation replays them."""
        turn.tool_calls.extend(item.call for item in read)

        async def result_of(item: native.ReadCall) -> ToolResult:
            return native.refusal_result(item) if item.refusal else await self._execute(state.trajectory.id, item.call)

        results = list(await asyncio.gather(*(result_of(item) for item in read)))
        turn.tool_results.extend(results)
        return results


def runner_class(protocol: str) -> type[EpisodeRunner]:
    """The episode runner of a policy_client.protocol setting."""
    return NativeEpisodeRunner if protocol == "native" else EpisodeRunner

