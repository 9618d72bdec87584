"""ThreadTuner: decode steps move to the thread count that runs them faster, and back."""

import pytest
import torch
from gearshift.services.policy_server import thread_tuner
from gearshift.services.policy_server.thread_tuner import ThreadTuner


class StepClock:
    """The tuner's clock in these tests: a step takes exactly the seconds it is given, where a
    sleep on a loaded machine takes more (the last test tells 10 ms from 9.5)."""

    def __init__(self) -> None:
        self.now = 0.0

    def perf_counter(self) -> float:
        return self.now


CLOCK = StepClock()


@pytest.fixture(autouse=True)
def step_clock(monkeypatch):
    monkeypatch.setattr(thread_tuner, "time", CLOCK)


def steps(tuner: ThreadTuner, count: int, seconds_on: dict[int, float], rows=lambda i: 4) -> None:
    """Runs `count` steps that take seconds_on[threads] on the thread count they run on."""
    for index in range(count):
        tuner.run(rows(index), lambda: setattr(CLOCK, "now", CLOCK.now + seconds_on[torch.get_num_threads()]))


@pytest.fixture(autouse=True)
def restore_threads():
    """The tuner sets this thread's OpenMP thread count; other tests keep theirs."""
    threads = torch.get_num_threads()
    yield
    torch.set_num_threads(threads)


def test_moves_to_one_thread_when_it_is_faster_and_back_when_it_is_not():
    tuner = ThreadTuner(2, every=8, trial=3)
    torch.set_num_threads(tuner.threads)
    steps(tuner, 8 + 3, {2: 0.006, 1: 0.002})  # a busy neighbour: two threads are slower
    assert (tuner.threads, torch.get_num_threads(), tuner.switches) == (1, 1, 1)
    steps(tuner, 8 + 3, {2: 0.001, 1: 0.004})  # the neighbour left
    assert (tuner.threads, torch.get_num_threads(), tuner.switches) == (2, 2, 2)
    steps(tuner, 3 * (8 + 3), {2: 0.010, 1: 0.0095})  # one thread a little faster: not enough
    assert (tuner.threads, tuner.switches) == (2, 2)


def test_a_trial_across_a_batch_size_change_is_dropped():
    tuner = ThreadTuner(2, every=8, trial=3)
    steps(tuner, 8 + 3, {2: 0.006, 1: 0.002}, rows=lambda i: 4 if i < 9 else 5)  # a row joined mid-trial
    assert (tuner.threads, tuner.switches, torch.get_num_threads()) == (2, 0, 2)


def test_never_tries_when_told_not_to_or_with_one_thread():
    for tuner in (ThreadTuner(2, every=0), ThreadTuner(1, every=8)):
        torch.set_num_threads(tuner.threads)
        steps(tuner, 40, {tuner.most: 0.004, 1: 0.001, 2: 0.004})
        assert tuner.switches == 0 and torch.get_num_threads() == tuner.most


def test_a_prefill_between_steps_ends_the_trial():
    tuner = ThreadTuner(2, every=8, trial=3)
    steps(tuner, 9, {2: 0.006, 1: 0.002})  # the trial of one thread has begun
    assert torch.get_num_threads() == 1
    tuner.reset()  # the scheduler prefilled a newcomer
    assert (tuner.threads, torch.get_num_threads()) == (2, 2)
    steps(tuner, 2, {2: 0.006, 1: 0.002})
    assert tuner.switches == 0
