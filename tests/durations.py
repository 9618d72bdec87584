"""The guard against a suite that grows slow unnoticed: every run records each test's seconds
(set-up, call and tear-down together) in .test-durations.json, and a test that took longer than
SLOW_SECONDS must carry a mark that names why (REASON_MARKS, or `slow` with a reason).
tests/test_durations.py checks the last run's report; the end of each run lists the offenders.

docs/results/test-durations.json is the report of the last full `make test` on the reference
machine, committed: a clean checkout has no run of its own yet."""

from __future__ import annotations

import json
import os
from collections import defaultdict
from pathlib import Path

import pytest

ROOT = Path(__file__).parents[1]
REPORT = ROOT / ".test-durations.json"
COMMITTED = ROOT / "docs" / "results" / "test-durations.json"
SLOW_SECONDS = 60.0
# Marks that say what makes a test slow: the real model, the vLLM servers, trainer ranks.
REASON_MARKS = ("model", "vllm", "ranks")


def last_report() -> dict[str, float]:
    """Node id (without xdist's @group) -> seconds, from this checkout's last run, else the committed one."""
    path = REPORT if REPORT.exists() else COMMITTED
    return json.loads(path.read_text())["seconds"]


def why_slow(item: pytest.Item) -> str | None:
    """The reason a test's marks give for its being slow; None when they give none."""
    for name in REASON_MARKS:
        if item.get_closest_marker(name):
            return name
    slow = item.get_closest_marker("slow")
    return slow.args[0] if slow and slow.args else None


def reasons(items: list[pytest.Item]) -> dict[str, str | None]:
    """Node id (without @group) -> why_slow, for these items."""
    return {plain_id(item.nodeid): why_slow(item) for item in items}


def unmarked_slow(seconds: dict[str, float], why: dict[str, str | None]) -> list[str]:
    """The tests in why that took longer than SLOW_SECONDS and carry no reason, slowest first."""
    slow = [(took, node) for node, took in seconds.items() if took > SLOW_SECONDS and node in why and why[node] is None]
    return [f"{node} ({took:.0f} s)" for took, node in sorted(slow, reverse=True)]


def plain_id(nodeid: str) -> str:
    """A node id without the @group suffix pytest-xdist's loadgroup adds."""
    return nodeid.rsplit("@", 1)[0] if nodeid.rfind("@") > nodeid.rfind("]") else nodeid


class Recorder:
    """Adds up each test's phases as the reports arrive (on xdist's controller: from every worker)."""

    def __init__(self) -> None:
        self.seconds: dict[str, float] = defaultdict(float)
        self.cpu: dict[str, float] = defaultdict(float)
        self.why: dict[str, str | None] = {}

    @pytest.hookimpl
    def pytest_runtest_logreport(self, report: pytest.TestReport) -> None:
        node = plain_id(report.nodeid)
        properties = dict(report.user_properties)
        self.seconds[node] += report.duration
        self.cpu[node] += properties.get("cpu", 0.0)
        self.why[node] = properties.get("why_slow")

    @pytest.hookimpl
    def pytest_sessionfinish(self, session: pytest.Session) -> None:
        if not self.seconds:
            return
        # Merged into the last report, so a run of a few tests keeps the others' figures.
        known = json.loads(REPORT.read_text()) if REPORT.exists() else {}
        merged = {key: known.get(key, {}) | {node: round(value, 2) for node, value in figures.items()}
                  for key, figures in (("seconds", self.seconds), ("cpu_seconds", self.cpu))}
        REPORT.write_text(json.dumps({"slow_seconds": SLOW_SECONDS} | {key: dict(sorted(value.items())) for key, value in merged.items()}, indent=1) + "\n")

    @pytest.hookimpl
    def pytest_terminal_summary(self, terminalreporter) -> None:
        if offenders := unmarked_slow(self.seconds, self.why):
            terminalreporter.section(f"over {SLOW_SECONDS:.0f} s without a mark naming why ({', '.join(REASON_MARKS)}, slow(reason))")
            for line in offenders:
                terminalreporter.line(line)


def pytest_configure(config: pytest.Config) -> None:
    # xdist's workers report to the controller, which records for all of them.
    if not hasattr(config, "workerinput"):
        config.pluginmanager.register(Recorder(), "gearshift-durations")


def cpu_seconds() -> float:
    """This process's CPU and that of the children it has reaped (the services and ranks a test started)."""
    times = os.times()
    return times.user + times.system + times.children_user + times.children_system


CPU_MARK = pytest.StashKey[float]()


@pytest.hookimpl(hookwrapper=True, tryfirst=True)
def pytest_runtest_protocol(item: pytest.Item):
    item.stash[CPU_MARK] = cpu_seconds()
    yield


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo):
    # Each phase's CPU, carried to the controller in its report; a copy, as the report shares the item's list.
    report = (yield).get_result()
    now = cpu_seconds()
    report.user_properties = [*report.user_properties, ("cpu", now - item.stash[CPU_MARK])]
    item.stash[CPU_MARK] = now


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    # Carried to the controller in each report: it collects no items of its own under xdist.
    for item in items:
        item.user_properties.append(("why_slow", why_slow(item)))
