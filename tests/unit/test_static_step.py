"""Pocket TTS's step over static state (tts_core/engines/static_step.py): padded to running-set buckets, eager
or compiled per bucket, checked against eager at load, on a tiny random model saved and loaded through
from_pretrained. The compiled engines here trace with `aot_eager` (dynamo's whole graph, as inductor gets it,
without generating code: seconds, not a minute a graph); bench.steps measures inductor's."""

import pytest
import torch
from torch._dynamo.utils import counters

from tests.pocket_models import build_tiny_pocket, request
from tts_core.engines.pocket_tts import PocketTTSEngine
from tts_core.engines.static_step import CHECK_TOLERANCE, bucket_of, buckets

TEXTS = ["Hi.", "Good day, you.", "Hey", "Yo!", "How are you?", "One two.", "Fine.", "A", "See you soon."]


@pytest.fixture(scope="module", autouse=True)
def one_thread():
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


@pytest.fixture(scope="module")
def folder(tmp_path_factory):
    return build_tiny_pocket(tmp_path_factory.mktemp("static") / "tiny-pocket")


def engine_of(folder, **options) -> PocketTTSEngine:
    options = {"max_running": 4, "seed": 7, "step_backend": "aot_eager", **options}
    return PocketTTSEngine(str(folder), [], device="cpu", **options)


@pytest.fixture(scope="module")
def compiled(folder):
    return engine_of(folder, step_mode="compiled")


def run(engine, joins: dict[int, int], steps: int | None = None) -> tuple[dict[int, torch.Tensor], int]:
    """Requests join at their steps (`joins`: step -> how many) while rows are free, each finished one is
    released at once; returns each request's frames by its order of joining, and the steps run."""
    waiting = [at for at, count in sorted(joins.items()) for _ in range(count)]
    made, order, step = {}, {}, 0
    while (waiting or engine.running()) and (steps is None or step < steps):
        due = [at for at in waiting if at <= step][: engine.max_running - len(engine.running())]
        for at in due:
            waiting.remove(at)
        first = len(order)
        items = [request(engine, TEXTS[(first + i) % len(TEXTS)], "default") for i in range(len(due))]
        order.update((item.id, first + i) for i, item in enumerate(items))
        for item_id in engine.admit(items) + engine.step():
            made[order[item_id]] = engine.latents(item_id)
            engine.release(item_id)
        step += 1
    return made, step


def test_buckets_are_powers_of_two_up_to_the_most_running():
    assert buckets(64) == [1, 2, 4, 8, 16, 32, 64] and buckets(3) == [1, 2, 3] and buckets(1) == [1]
    assert [bucket_of(n, buckets(16)) for n in (1, 2, 3, 5, 9, 16)] == [1, 2, 4, 8, 16, 16]


def test_padding_rows_change_no_frame_and_no_draw_of_the_seed(folder):
    """Rows joining and leaving at different steps, sampled (temperature 0.7) with the model's own end of
    speech: the step padded to buckets of 8 (3 running: 4 rows) gives the frames of the step padded to 3 (1, 2, 3),
    draw for draw (never more than 3 running, so that both run the same schedule)."""
    joins = {0: 1, 1: 2, 60: 1, 62: 2}
    small, _ = run(engine_of(folder, max_running=3), joins)
    large, _ = run(engine_of(folder, max_running=8), joins)
    assert sorted(small) == sorted(large) == list(range(6))
    assert len({len(frames) for frames in small.values()}) == 1  # each ended by its end of speech, at its own step
    assert all(len(frames) < 55 for frames in small.values())
    for index, frames in small.items():
        assert frames.shape == large[index].shape
        assert torch.abs(frames - large[index]).max() <= 1e-5


def test_the_compiled_step_is_one_graph_per_bucket_checked_against_eager(compiled):
    status = compiled.step_status()
    capacity = compiled._cache.capacity
    assert status["step_mode"] == "compiled" and status["step_mode_reason"] == ""
    assert sorted(status["step_compile_s"]) == sorted(f"{size}@{capacity}" for size in (1, 2, 4))
    assert compiled._runner.compiled.keys() == {(1, capacity), (2, capacity), (4, capacity)}


def test_fifty_steps_of_joins_and_leaves_recompile_nothing_and_match_eager(folder, compiled):
    joins = {0: 2, 3: 1, 5: 3, 11: 2, 17: 4, 26: 3, 35: 2, 42: 3}
    graphs = counters["stats"]["unique_graphs"]
    before = compiled.step_status()["steps_compiled"]
    made, steps = run(compiled, joins, steps=50)
    assert steps == 50 and counters["stats"]["unique_graphs"] == graphs  # no recompile (dynamo's counters)
    assert compiled.step_status()["steps_compiled"] - before == 50 and compiled._cache.capacity == 512
    eager, _ = run(engine_of(folder, step_mode="eager"), joins, steps=50)
    assert made.keys() == eager.keys() and len(made) >= 6
    for index, frames in made.items():
        assert frames.shape == eager[index].shape
        assert torch.abs(frames - eager[index]).max() <= CHECK_TOLERANCE
    for item_id in compiled.running():
        compiled.release(item_id)


class DifferentWhenCompiled(PocketTTSEngine):
    """A step whose compiled graph differs from its eager run: the self-check must refuse it."""

    def _step_body(self, count, noise):
        frames, ended = super()._step_body(count, noise)
        return (frames + 1e-2 if torch.compiler.is_compiling() else frames), ended


def test_a_compiled_step_that_differs_or_fails_to_compile_leaves_the_model_eager(folder):
    differs = DifferentWhenCompiled(str(folder), [], device="cpu", max_running=2,
                                    step_mode="compiled", step_backend="aot_eager")
    status = differs.step_status()
    assert status["step_mode"] == "eager" and "differs from eager by 0.01" in status["step_mode_reason"]
    assert differs._runner.compiled == {}
    fails = engine_of(folder, max_running=2, step_mode="compiled", step_backend="no-such-backend")
    assert fails.step_status()["step_mode"] == "eager"
    assert "compiling the step for 1@512 failed" in fails.step_status()["step_mode_reason"]
    made, _ = run(fails, {0: 2})  # and it serves, eager
    assert len(made) == 2


def test_auto_steps_eager_on_the_cpu_and_says_why(folder):
    engine = engine_of(folder, max_running=1)
    assert engine.step_status()["step_mode"] == "eager"
    assert "auto on the CPU" in engine.step_status()["step_mode_reason"]
    with pytest.raises(ValueError, match="step_mode is one of"):
        engine_of(folder, step_mode="fast")
