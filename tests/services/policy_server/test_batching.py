"""Continuous batching on the tiny model: generations decoded together give exactly what each
gives alone, keep their own sampling, stop words, streams and cancellation, join and leave at
any step, stay on their weights across a hot switch, and the caps hold."""

from __future__ import annotations

import asyncio
import contextlib
import gc
import weakref

import httpx
import pytest
from gearshift.errors import ResourceExhausted
from gearshift.policy_client import PolicyClient
from gearshift.services.policy_server.core import PolicyEngine
from gearshift.services.policy_server.generation import GenerationResult
from gearshift.services.policy_server.schemas import ChatCompletionRequest, CompletionRequest
from gearshift.services.policy_server.server import running
from gearshift.settings import PolicyServerSettings

from tests.services.policy_server.conftest import policy_settings

# Prompts of very different lengths, so that rows carry different amounts of padding.
PROMPTS = [
    "Hi",
    "The quick brown fox jumps over the lazy dog.",
    "Once upon a time, in a kingdom by the sea, there lived a princess who " * 3,
    "List: " + ", ".join(str(n) for n in range(60)),
]


@contextlib.asynccontextmanager
async def engine_on(checkpoint, **policy):
    settings = PolicyServerSettings(model=str(checkpoint), port=0, threads=1, max_tokens_cap=3000, **policy)
    engine = await PolicyEngine.start(settings, checkpoint.parent)
    try:
        yield engine
    finally:
        engine.close()


def completion(engine: PolicyEngine, prompt: str, **fields):
    return engine.completion_jobs(CompletionRequest(prompt=prompt, **{"temperature": 0, "ignore_eos": True} | fields))[0]


async def alone(engine: PolicyEngine, jobs) -> list[GenerationResult]:
    """Each job run by itself (the scheduler has nothing else to batch it with)."""
    return [await engine.generate_all(job) for job in jobs]


async def test_batched_greedy_outputs_are_those_of_each_request_alone(tiny_checkpoints):
    async with engine_on(tiny_checkpoints[0], prefix_cache_mib=0) as engine:
        jobs = [completion(engine, p, max_tokens=n) for p, n in zip(PROMPTS, (24, 40, 16, 32))]
        assert len({len(job.prompt_ids) for job in jobs}) == 4
        solo = await alone(engine, jobs)
        assert engine.scheduler.stats.largest_batch == 1

        first_three = engine.submit(jobs[:3])
        stream = first_three[0].items()
        await anext(stream)  # the batch is running; the fourth joins it at the next step
        late = engine.submit(jobs[3:])
        results = await asyncio.gather(*(g.result() for g in first_three[1:] + late))
        rest = [item async for item in stream]
        batched = [rest[-1], *results]

        assert engine.scheduler.stats.largest_batch == 4
        assert [r.text for r in batched] == [r.text for r in solo]
        assert [r.completion_tokens for r in batched] == [24, 40, 16, 32]
        assert len({r.text for r in solo}) == 4


async def test_each_row_keeps_its_own_sampling_parameters(tiny_checkpoints):
    async with engine_on(tiny_checkpoints[0], prefix_cache_mib=0) as engine:
        jobs = [
            completion(engine, PROMPTS[1], max_tokens=30, temperature=1.0, seed=1),
            completion(engine, PROMPTS[1], max_tokens=30, temperature=0.7, top_p=0.9, seed=2),
            completion(engine, PROMPTS[1], max_tokens=30),
            completion(engine, PROMPTS[2], max_tokens=30, temperature=1.3, seed=1),
        ]
        solo = await alone(engine, jobs)
        batched = await asyncio.gather(*(g.result() for g in engine.submit(jobs)))
        assert engine.scheduler.stats.largest_batch == 4
        assert [r.text for r in batched] == [r.text for r in solo]
        assert len({r.text for r in solo[:3]}) == 3  # same prompt: the parameters made the difference


async def test_stop_words_and_streams_stay_per_request_in_a_batch(tmp_path, tiny_checkpoints):
    sampled = {"max_tokens": 40, "temperature": 1.0, "ignore_eos": True}
    async with running(policy_settings(tmp_path, tiny_checkpoints[0], prefix_cache_mib=0)) as server:
        async with PolicyClient(server.base_url, "smollm2", retries=0) as client:
            solo = [(await client.complete(p, seed=i, **sampled)).text for i, p in enumerate(PROMPTS)]
            stop = solo[1][len(solo[1]) // 2 :][:3]

            async def streamed(index: int):
                stops = [stop] if index == 1 else None
                chunks = [c async for c in client.stream(PROMPTS[index], seed=index, stop=stops, **sampled)]
                return "".join(c.text for c in chunks), chunks[-1].finish_reason

            together = await asyncio.gather(*(streamed(i) for i in range(4)))
        assert server.engine.scheduler.stats.largest_batch >= 3
    assert together[1] == (solo[1][: solo[1].find(stop)], "stop")
    assert [together[i] for i in (0, 2, 3)] == [(solo[i], "length") for i in (0, 2, 3)]


async def test_cancelling_one_row_leaves_the_others_running(tiny_checkpoints):
    async with engine_on(tiny_checkpoints[0], prefix_cache_mib=0) as engine:
        short = [completion(engine, p, max_tokens=60) for p in PROMPTS[:2]]
        solo = await alone(engine, short)
        endless = completion(engine, PROMPTS[2], max_tokens=1900)
        generations = engine.submit([endless, *short])
        stream = generations[0].items()
        await anext(stream)
        await stream.aclose()  # the requester went away
        for _ in range(100):
            if engine.scheduler.running == 2:
                break
            await asyncio.sleep(0.01)
        assert engine.scheduler.running == 2
        results = await asyncio.gather(*(g.result() for g in generations[1:]))
        assert [r.text for r in results] == [r.text for r in solo]
        assert engine.in_flight == 0


async def test_a_switch_during_a_batch_keeps_each_row_on_its_weights(tiny_checkpoints):
    old_dir, new_dir = tiny_checkpoints
    async with engine_on(old_dir) as engine:
        old_weights = weakref.ref(engine.current)
        on_old = [completion(engine, p, max_tokens=120) for p in PROMPTS[:2]]
        expected_old = await alone(engine, on_old)
        running_old = engine.submit(on_old)
        first = running_old[0].items()
        await anext(first)

        report = await engine.switch(str(new_dir))
        assert report.in_flight == 2
        on_new = [completion(engine, p, max_tokens=10) for p in PROMPTS[:2]]
        new_results = await asyncio.gather(*(g.result() for g in engine.submit(on_new)))
        assert engine.scheduler.in_flight(old_weights()) == 2  # the new rows finished while the old ones ran

        old_results = [[item async for item in first][-1], await running_old[1].result()]
        assert [r.text for r in old_results] == [r.text for r in expected_old]
        assert [r.text for r in new_results] == [r.text for r in await alone(engine, on_new)]
        assert [r.text for r in new_results] != [r.text[: len(n.text)] for r, n in zip(expected_old, new_results)]
        del on_old, running_old, first
        gc.collect()
        assert old_weights() is None  # freed with its last row


async def test_a_prefix_cache_hit_gives_the_tokens_of_a_miss(tiny_checkpoints):
    """A four-turn episode continuing one assistant message, as the executor sends it."""
    async def episode(engine: PolicyEngine, **sampling) -> list[GenerationResult]:
        transcript, results = "<plan>", []
        for turn in range(4):
            messages = [{"role": "system", "content": "You are an agent."}, {"role": "user", "content": PROMPTS[2]},
                        {"role": "assistant", "content": transcript}]
            request = ChatCompletionRequest(
                messages=messages, continue_final_message=True, add_generation_prompt=False, max_tokens=12, ignore_eos=True,
                **sampling,
            )
            results.append(await engine.generate_all(engine.chat_jobs(request).jobs[0]))
            transcript += results[-1].text + f"\n<tool_response>result {turn}</tool_response>\n"
        return results

    for sampling in ({"temperature": 0}, {"temperature": 1.0, "seed": 3}):
        async with engine_on(tiny_checkpoints[0], prefix_cache_mib=0) as plain, engine_on(tiny_checkpoints[0]) as cached:
            misses, hits = await episode(plain, **sampling), await episode(cached, **sampling)
        assert [r.text for r in hits] == [r.text for r in misses]
        assert all(r.cached_tokens == 0 for r in misses)
        # From the second turn on, at least the previous turn's prompt comes from the cache, and
        # its output too where the continued text tokenizes as it was generated (the greedy
        # '>>>>' of the random model does not: the tokenizer merges what was sampled one by one).
        for previous, hit in zip(hits, hits[1:]):
            assert previous.prompt_tokens - 2 <= hit.cached_tokens < hit.prompt_tokens
        if "seed" in sampling:
            assert hits[1].cached_tokens >= hits[0].prompt_tokens + hits[0].completion_tokens - 2


async def test_a_full_queue_answers_429_with_retry_after(tmp_path, tiny_checkpoints):
    settings = policy_settings(tmp_path, tiny_checkpoints[0], max_batch_size=1, max_queue=1, retry_after_seconds=2)
    body = {"prompt": PROMPTS[0], "max_tokens": 2000, "temperature": 0, "ignore_eos": True}
    async with running(settings) as server, httpx.AsyncClient(base_url=server.base_url, timeout=60) as http:
        async with http.stream("POST", "/completions", json={**body, "stream": True}) as busy:
            lines = busy.aiter_lines()  # kept open: closing it would hang up and free the slot
            while not (await anext(lines)).startswith("data: "):
                pass  # once data flows, the one batch slot is taken
            queued = asyncio.create_task(http.post("/completions", json={**body, "max_tokens": 3}))
            for _ in range(200):
                if server.engine.scheduler.waiting == 1:
                    break
                await asyncio.sleep(0.01)
            refused = await http.post("/completions", json=body)
            assert refused.status_code == 429 and refused.headers["retry-after"] == "2"
            assert refused.json()["error"]["type"] == "rate_limit_error"  # as the gateway's 429 (tests/services/gateway/test_errors.py)
            assert "capacity" in refused.json()["error"]["message"]
            async with PolicyClient(server.base_url, "smollm2", retries=0) as client:
                with pytest.raises(ResourceExhausted):
                    await client.complete("x", max_tokens=1)
        assert (await queued).json()["usage"]["completion_tokens"] == 3  # the queued one ran once the slot freed
        metrics = (await http.get(server.base_url.removesuffix("/v1") + "/metrics")).text
        assert "gearshift_policy_rejected_total 2.0" in metrics


async def test_the_token_cap_keeps_requests_that_do_not_fit_together_apart(tiny_checkpoints):
    async with engine_on(tiny_checkpoints[0], max_batch_tokens=150, prefix_cache_mib=0) as engine:
        jobs = [completion(engine, p, max_tokens=60) for p in PROMPTS[:3]]  # 61, 71 and 110+ slots each
        results = await asyncio.gather(*(g.result() for g in engine.submit(jobs)))
        assert engine.scheduler.stats.largest_batch == 2  # the first two fit together (2 x 71), never all three
        assert [r.text for r in results] == [r.text for r in await alone(engine, jobs)]


async def test_a_sequence_joining_its_batch_is_counted_once(tiny_checkpoints):
    """The count is read from the event loop while the scheduler thread moves a prefilled
    sequence into its batch: for a moment it sits in both lists, and it must count once."""
    from gearshift.services.policy_server.scheduler import RunningBatch

    async with engine_on(tiny_checkpoints[0]) as engine:
        scheduler = engine.scheduler
        sequence = object.__new__(type("Row", (), {"loaded": engine.current}))
        scheduler._admitting.append(sequence)
        scheduler._batches[-1] = RunningBatch(engine.current, rows=[sequence])
        try:
            assert scheduler.in_flight() == 1 and scheduler.running == 1
        finally:
            scheduler._admitting.remove(sequence)
            del scheduler._batches[-1]


async def test_bfloat16_weights_batch_like_they_decode_alone(tiny_checkpoints):
    """dtype bfloat16: the weights (and so the KV cache) are bfloat16, and batching still gives
    each row what it gets alone."""
    import torch

    async with engine_on(tiny_checkpoints[0], dtype="bfloat16", prefix_cache_mib=0) as engine:
        assert next(engine.current.model.parameters()).dtype == torch.bfloat16
        jobs = [completion(engine, p, max_tokens=24, temperature=0, ignore_eos=True) for p in PROMPTS]
        solo = await alone(engine, jobs)
        batched = await asyncio.gather(*(g.result() for g in engine.submit(jobs)))
    assert [r.text for r in batched] == [r.text for r in solo] and all(r.completion_tokens == 24 for r in solo)


async def test_the_server_decodes_what_it_loaded_with_the_hand_written_step_and_leaves_a_trainers_module_alone(tiny_checkpoints):
    from gearshift import weights
    from gearshift.services.policy_server import runner

    async with engine_on(tiny_checkpoints[0]) as engine:
        await engine.generate_all(completion(engine, "Hi", max_tokens=4))
        assert engine.current.model in runner._decoders
        await engine.switch(str(tiny_checkpoints[1]))
        await engine.generate_all(completion(engine, "Hi", max_tokens=4))
        assert engine.current.model in runner._decoders  # switched-to weights too

    # A trainer serves the module it is updating: its parameters must stay the optimizer's.
    trained = weights.load(str(tiny_checkpoints[0]), tiny_checkpoints[0].parent)
    parameters = [(name, id(p), p.requires_grad) for name, p in trained.model.named_parameters()]
    engine = PolicyEngine(trained, PolicyServerSettings(model="training", port=0, threads=1), tiny_checkpoints[0].parent)
    try:
        await engine.generate_all(completion(engine, "Hi", max_tokens=4))
    finally:
        engine.close()
    assert trained.model not in runner._decoders
    assert [(name, id(p), p.requires_grad) for name, p in trained.model.named_parameters()] == parameters
