"""A model's calibration kept in the database across restarts, and the background recheck that yields to requests.

On the fake clock: a fake engine's calls cost simulated time; the recheck waits for a quiet spell that only the
test's advancing of the clock ends, so what ran before it is exact."""

import threading

import pytest

from storage import Storage, sqlite_url
from tests.fakes import FakeEngine, flat_cost
from tests.unit.conftest import make_item
from tts_core.ops.metrics import Metrics
from tts_core.scheduler.engine_loop import RECHECK_QUIET_S
from tts_core.scheduler.one_shot import CALIBRATION_LENGTHS
from tts_core.scheduler.queue import RequestQueue
from tts_core.scheduler.strategies import make_engine_loop

SIZES = (1, 2, 4)
WARM_UP_CALLS = 1 + len(CALIBRATION_LENGTHS)  # a cold run, one per length
SWEEP_RUNS = 2 * len(CALIBRATION_LENGTHS) * len(SIZES)  # two runs of each length and size
WAIT_S = 30


class TimedEngine(FakeEngine):
    """Records the simulated moment each call starts at, beside what it ran."""

    def __init__(self, **options):
        super().__init__(**options)
        self.started_at: list[float] = []

    def synthesize(self, batch):
        self.started_at.append(self.clock.now())
        return super().synthesize(batch)


@pytest.fixture
def loops(clock):
    started = []

    def start(database, max_batch_size: int = 16):
        engine = TimedEngine(cost=flat_cost, clock=clock)
        store = Storage(sqlite_url(database))  # a new process's view: a fresh connection to the same file
        store.migrate()
        loop = make_engine_loop(engine, RequestQueue(64, 2.0, clock=clock), Metrics(), "adaptive", max_batch_size,
                                100_000, SIZES, calibrations=store.calibrations)
        loop.start()
        started.append(loop)
        assert loop.ready.wait(WAIT_S) and loop.calibrated.wait(WAIT_S)
        return loop, engine
    yield start
    for loop in started:
        loop.stop()


def test_a_restart_reuses_the_kept_calibration_and_rechecks_it_once_quiet(loops, clock, tmp_path):
    database = tmp_path / "chorus.db"
    first, first_engine = loops(database)
    assert first.swept.is_set() and len(first_engine.seen) == WARM_UP_CALLS + SWEEP_RUNS  # calibrated by sweeping
    fitted = first.strategy.policy.cost_model.coefficients.copy()
    first.stop()

    again, engine = loops(database)  # the restart: calibrated from the file, before any sweep run
    assert len(engine.seen) == WARM_UP_CALLS and not again.swept.is_set()
    assert again.strategy.policy.cost_model.coefficients == pytest.approx(fitted)
    assert again.strategy.policy.cost_model.fitted
    ready_at = clock.now()
    clock.advance_to(ready_at + RECHECK_QUIET_S)  # a quiet spell: the recheck runs, in the background
    assert again.swept.wait(WAIT_S)
    assert len(engine.seen) == WARM_UP_CALLS + SWEEP_RUNS
    assert min(engine.started_at[WARM_UP_CALLS:]) >= ready_at + RECHECK_QUIET_S


def test_a_kept_calibration_is_of_its_settings_and_another_is_swept_for(loops, tmp_path):
    database = tmp_path / "chorus.db"
    first, _ = loops(database)
    first.stop()
    other, engine = loops(database, max_batch_size=8)  # a setting the timings depend on: not the kept one
    assert other.swept.is_set() and len(engine.seen) == WARM_UP_CALLS + SWEEP_RUNS


def test_the_recheck_yields_to_requests_and_waits_for_quiet_after_them(loops, clock, tmp_path):
    database = tmp_path / "chorus.db"
    loops(database)[0].stop()
    loop, engine = loops(database)
    early = make_item(10, tag=41)
    loop.submit([early])  # before the quiet spell: served at once, no recheck run before it
    early.future.result(timeout=WAIT_S)
    assert engine.seen[WARM_UP_CALLS:] == [[41]]
    served_at = clock.now()

    engine.gate.clear()  # the recheck's first run is held on the engine; an item comes meanwhile
    engine.calls_started = threading.Semaphore(0)
    clock.advance_to(served_at + RECHECK_QUIET_S)
    assert engine.calls_started.acquire(timeout=WAIT_S)
    late = make_item(10, tag=42)
    loop.submit([late])
    engine.gate.set()
    late.future.result(timeout=WAIT_S)
    assert engine.seen[WARM_UP_CALLS + 2] == [42]  # right after the run under way
    late_served_at = clock.now()
    clock.advance_to(late_served_at + RECHECK_QUIET_S)
    assert loop.swept.wait(WAIT_S)
    assert min(engine.started_at[WARM_UP_CALLS + 3:]) >= late_served_at + RECHECK_QUIET_S
    assert len(engine.seen) == WARM_UP_CALLS + SWEEP_RUNS + 2
