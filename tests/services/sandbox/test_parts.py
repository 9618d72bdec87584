"""Small parts tested alone: output collection with its end marker, page text extraction,
the token budget, the URL allowlist, uid allocation, the seccomp program, CPU accounting over a
process tree."""

from __future__ import annotations

import asyncio
import subprocess
import sys

import pytest
from gearshift.services.sandbox.isolation import seccomp
from gearshift.services.sandbox.usage import tree_usage
from gearshift.services.sandbox.pages import host_allowed, readable_text, truncate_tokens
from gearshift.services.sandbox.workers import SpawnError, UidAllocator, _collect, _Collected

MARKER = b"\x00end-abc\x00"


async def _collected(chunks: list[bytes], keep: int = 100, stop: int = 1000) -> _Collected:
    reader = asyncio.StreamReader()
    for chunk in chunks:
        reader.feed_data(chunk)
    reader.feed_eof()
    into = _Collected()
    await _collect(reader, MARKER, keep, stop, into)
    return into


async def test_marker_split_across_reads_ends_the_output():
    reader = asyncio.StreamReader()
    into = _Collected()
    task = asyncio.create_task(_collect(reader, MARKER, 100, 1000, into))
    for piece in (b"hello\x00en", b"d-ab", b"c\x00late"):
        reader.feed_data(piece)
        await asyncio.sleep(0)
    await asyncio.wait_for(task, 1)
    assert into.marked and bytes(into.kept) == b"hello" and into.total == 5


async def test_output_keeps_its_head_and_stops_past_the_limit():
    into = await _collected([b"x" * 600, b"y" * 600], keep=100, stop=1000)
    assert into.overflow and len(into.kept) == 100 and into.total > 1000
    ended = await _collected([b"abc"])
    assert not ended.marked and bytes(ended.kept) == b"abc"


def test_readable_text_drops_scripts_navigation_and_markup():
    title, text = readable_text(
        "<html><head><title> A  page </title><style>p{}</style></head><body><nav>skip</nav>"
        "<p>First &amp; best.</p><div>Second<br>line</div><script>evil()</script></body></html>"
    )
    assert title == "A page"
    assert text == "First & best.\nSecond\nline"


def test_token_budget_cuts_and_says_so():
    text, cut = truncate_tokens("one two  three\nfour five", 3)
    assert cut and text.startswith("one two  three\n[... page truncated to 3 tokens ...]")
    assert truncate_tokens("one two", 2) == ("one two", False)


@pytest.mark.parametrize(
    ("host", "allowed"),
    [("example.org", True), ("docs.example.org", True), ("evilexample.org", False), ("wiki.test", True),
     ("sub.wiki.test", False), ("127.0.0.1", False)],
)
def test_allowlist_matches_exact_hosts_and_dotted_suffixes(host, allowed):
    assert host_allowed(host, [".example.org", "wiki.test"]) is allowed


def test_uids_are_unique_among_live_workers():
    uids = UidAllocator(1000, 3)
    taken = [uids.take(), uids.take(), uids.take()]
    assert sorted(taken) == [1000, 1001, 1002]
    with pytest.raises(SpawnError):
        uids.take()
    uids.release(1001)
    assert uids.take() == 1001


@pytest.mark.parametrize("arch", sorted(seccomp.SYSCALLS))
def test_the_worker_filter_assembles_for_each_architecture(arch):
    program = seccomp.worker_filter(arch)
    assert len(program) % 8 == 0 and len(program) // 8 < 200
    assert program[:8] == bytes.fromhex("2000000004000000")  # first: load the architecture


def test_every_refused_system_call_is_known_somewhere():
    known = set().union(*(set(numbers) for numbers in seccomp.SYSCALLS.values()))
    assert set(seccomp.DENIED) <= known and set(seccomp.SETUP_ONLY) <= set(seccomp.DENIED)
    with pytest.raises(OSError):
        seccomp.worker_filter("riscv64")


def test_cpu_of_a_process_tree_counts_children_nobody_waited_for():
    # The parent forks a child that spins 0.3 s and exits; the parent never reaps it.
    code = ("import os, sys, time\nif os.fork() == 0:\n    end = time.process_time() + 0.3\n"
            "    while time.process_time() < end:\n        pass\n    os._exit(0)\n"
            "print('forked', flush=True)\ntime.sleep(30)")
    parent = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True)
    try:
        assert parent.stdout.readline() == "forked\n"
        for _ in range(200):
            usage = tree_usage(parent.pid)
            if usage.cpu_seconds >= 0.28:
                break
            subprocess.run(["sleep", "0.05"])
        assert usage.cpu_seconds >= 0.28
        assert tree_usage(parent.pid, memory=True).memory_bytes > 1 << 20
    finally:
        parent.kill()
        parent.wait()
