"""Every process a test starts is stopped, whatever becomes of the test (tests/processes.py)."""

from __future__ import annotations

import atexit

import pytest

from tests.processes import Owners, marked, stop

OWNERS = Owners()
OWNERS.watch()


def _stop_marked(owner: str) -> None:
    if owner in OWNERS.started or owner == OWNERS.session:
        stop(marked(owner))


def _stop_session() -> None:
    stop(marked(OWNERS.session))


atexit.register(_stop_session)  # pytest stopped short of its session's end


@pytest.hookimpl(wrapper=True)
def pytest_fixture_setup(fixturedef, request):
    fixturedef._chorus_owner = OWNERS.push(f"fixture {fixturedef.argname}")
    try:
        return (yield)
    finally:
        OWNERS.pop()


def pytest_fixture_post_finalizer(fixturedef, request):
    """What the fixture started and its teardown left running (a teardown that failed, or never stopped it)."""
    owner = getattr(fixturedef, "_chorus_owner", None)
    if owner is not None:
        fixturedef._chorus_owner = None
        _stop_marked(owner)


@pytest.hookimpl(wrapper=True)
def pytest_runtest_call(item):
    """What the test's body started and left running, once it is over (passed, failed or timed out)."""
    owner = OWNERS.push(f"test {item.nodeid}")
    try:
        return (yield)
    finally:
        OWNERS.pop()
        _stop_marked(owner)


# The longest modules (docs/testing.md's figures), queued first: on two workers, one of them queued last would run
# on alone at the end while the other worker idles. The rest keep their order. (The first four go two to a worker,
# in the order given: the two that run Ray, the first and third, run one after the other.)
LONGEST_FIRST = ["tests/integration/test_ray_serve.py", "tests/integration/test_gpu_check.py",
                 "tests/integration/test_bench.py", "tests/integration/test_upstream.py",
                 "tests/integration/test_kokoro_voices.py", "tests/integration/test_streaming.py",
                 "tests/integration/test_soak.py", "tests/faults/test_text_limits.py"]


def pytest_collection_modifyitems(items):
    place = {module: number for number, module in enumerate(LONGEST_FIRST)}
    items.sort(key=lambda item: place.get(item.nodeid.split("::")[0], len(place)))


def pytest_sessionfinish(session):
    _stop_session()
