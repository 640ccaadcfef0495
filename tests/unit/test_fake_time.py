"""Unit tests run on simulated time: the queue and both engine loops read a FakeClock, which only a fake
engine's cost (or the test) moves, so a policy's wait or a calibration sweep costs no real time."""

import re
import threading
from pathlib import Path

from tts_core.scheduler.queue import RequestQueue

TESTS = Path(__file__).resolve().parents[1]
SLEEP = re.compile(r"\btime\.sleep\(|from time import [^\n]*\bsleep\b")


def test_unit_tests_and_fake_engines_never_sleep():
    """A test that sleeps waits on the machine's speed (and passes or fails with its load): move the fake
    clock, or wait on an event."""
    files = [*sorted((TESTS / "unit").glob("*.py")), TESTS / "fakes.py"]
    assert [path.name for path in files if SLEEP.search(path.read_text())] == []


def test_a_wait_for_a_moment_ends_when_the_fake_time_reaches_it(clock):
    queue = RequestQueue(10, clock=clock)
    moment = clock.now() + 0.5
    woke_at = []
    waiter = threading.Thread(target=lambda: (queue.wait_until(moment), woke_at.append(clock.now())))
    waiter.start()
    clock.sleep(0.25)  # the waiter waits on (or has not yet begun to)
    clock.sleep(0.25)
    waiter.join(5)
    assert not waiter.is_alive() and woke_at[0] >= moment


def test_a_waiter_wakes_for_news_before_its_moment(clock):
    queue = RequestQueue(10, clock=clock)
    woke = threading.Event()
    waiter = threading.Thread(target=lambda: (queue.wait_until(clock.now() + 60), woke.set()))
    waiter.start()
    queue.wake()  # an errand for the engine's thread: no fake time passes
    assert woke.wait(5)
    waiter.join(5)
