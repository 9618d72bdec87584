"""How the suite is grouped, ordered and spread over pytest-xdist's workers (a plugin of
tests/conftest.py).

`make test` runs `pytest -n 2 --dist loadgroup`. The heavy multi-process tests are the xdist
group HEAVY, which one worker runs one test at a time: the users of the vLLM pair first (it lives
in that worker, from its first user to its last), then the tests that launch trainer ranks. Two
of them at once on two cores was slower than one after the other (each wants both cores, and
their threads wait on each other's). tests/workers.py adds FIXED_PORTS, the tests that name fixed
ports. A work unit is such a group or else a test module, so a module's fixtures are set up once.
Units go out longest first by the last run's report (tests/durations.py), HEAVY ahead of all:
the worker that takes it runs nothing else meanwhile, and the other takes the rest."""

from __future__ import annotations

import pytest
from xdist.scheduler import LoadGroupScheduling

from tests.durations import last_report, plain_id

HEAVY = "heavy"


def uses_vllm(item: pytest.Item) -> bool:
    return "vllm_pair" in getattr(item, "fixturenames", ())


def is_heavy(item: pytest.Item) -> bool:
    return uses_vllm(item) or item.get_closest_marker("ranks") is not None


def unit(item: pytest.Item) -> str:
    """The work unit of a test: its xdist group, else its module."""
    group = item.get_closest_marker("xdist_group")
    return group.args[0] if group else item.nodeid.split("::", 1)[0]


def longest_first(items: list[pytest.Item]) -> None:
    """Orders items unit by unit, HEAVY first, then by the last run's seconds, longest first; a
    unit keeps its tests' order, HEAVY's with the vLLM pair's users ahead."""
    try:
        seconds = last_report()
    except FileNotFoundError:  # no run yet: the collection's order
        seconds = {}
    totals: dict[str, float] = {}
    for item in items:
        totals[unit(item)] = totals.get(unit(item), 0.0) + seconds.get(plain_id(item.nodeid), 0.0)
    position = {item.nodeid: index for index, item in enumerate(items)}
    items.sort(key=lambda item: (unit(item) != HEAVY, -totals[unit(item)], unit(item), not uses_vllm(item), position[item.nodeid]))


@pytest.hookimpl(tryfirst=True)  # before xdist appends each test's group to its node id
def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        if uses_vllm(item) and not item.get_closest_marker("vllm"):
            item.add_marker(pytest.mark.vllm)
        if is_heavy(item):
            if item.get_closest_marker("xdist_group"):
                raise pytest.UsageError(f"{item.nodeid}: a heavy test runs in the xdist group {HEAVY} and no other")
            item.add_marker(pytest.mark.xdist_group(HEAVY))
    longest_first(items)


def pytest_collection_finish(session: pytest.Session) -> None:
    # Without its @group, xdist would hand a group's tests to any worker: two vLLM pairs, ranks beside ranks.
    if session.config.getoption("loadgroup", False):
        lost = [item.nodeid for item in session.items if item.get_closest_marker("xdist_group") and "@" not in item.nodeid]
        if lost:
            raise pytest.UsageError(f"pytest-xdist left {lost[0]} without its group: a pytest it does not support (pytest-xdist#1386)")


@pytest.hookimpl(optionalhook=True)
def pytest_xdist_make_scheduler(config: pytest.Config, log):
    return SuiteScheduling(config, log) if config.getvalue("dist") == "loadgroup" else None


class SuiteScheduling(LoadGroupScheduling):
    """xdist's loadgroup, with a module as the unit of the tests outside any group, handed out in
    the order of the collection (longest_first) rather than by how many tests a unit holds."""

    def __init__(self, config: pytest.Config, log=None) -> None:
        super().__init__(config, log)
        self.config.option.loadscopereorder = False

    def _split_scope(self, nodeid: str) -> str:
        scope = super()._split_scope(nodeid)
        return nodeid.split("::", 1)[0] if scope == nodeid else scope
