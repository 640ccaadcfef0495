"""A cloned voice deleted while requests in it run or wait (issue 44, case 1), on the real engine (the tiny random
Pocket TTS): the running ones finish in the voice they started with, a queued one fails alone with a 400
voice_not_found, and the model goes on for everyone else. Before, every turn raised "pocket has no voice" and no
step ran again."""

import math

import numpy as np
import pytest
import torch

from tests.pocket_models import build_tiny_pocket, random_voice, registry_spec
from tests.serve import wait_until
from tts_core.engines.contract import EngineInput
from tts_core.errors import ErrorCode, InvalidRequest
from tts_core.ops.metrics import Metrics
from tts_core.scheduler.queue import RequestQueue
from tts_core.scheduler.records import QueuedItem
from tts_core.scheduler.strategies import make_engine_loop

LONG = "This sentence is long enough to keep the tiny model busy for a good number of steps, " * 2


@pytest.fixture(scope="module")
def engine(tmp_path_factory):
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # tiny tensors: two intra-op threads only wait on each other on a busy machine
    folder = build_tiny_pocket(tmp_path_factory.mktemp("pocket") / "tiny-pocket")
    spec = registry_spec(folder, {"tiny": {"fixed_length": True, "max_running": 2}},
                         tmp_path_factory.mktemp("registry"))
    yield spec.load()
    torch.set_num_threads(threads)


def queued(engine, text: str, voice: str) -> QueuedItem:
    [tokens] = engine.tokenize(text, voice)
    return QueuedItem(EngineInput(tokens, voice), key=engine.batch_key(voice, 1.0), deadline=math.inf)


@pytest.mark.slow  # generates with a tiny model
@pytest.mark.parametrize("codec_stage", ["off", "on"])
def test_a_voice_deleted_while_its_requests_run_and_wait_stalls_nobody(engine, codec_stage):
    engine.add_voice("alice", random_voice(12, seed=3))
    loop = make_engine_loop(engine, RequestQueue(16), Metrics(), "adaptive", calibration_sizes=(1,),
                            codec_stage=codec_stage)
    loop.start()
    try:
        assert loop.calibrated.wait(120)
        running = [queued(engine, LONG, "alice") for _ in range(2)]
        loop.submit(running)
        assert wait_until(lambda: loop.running_count() == 2, timeout_s=60, every_s=0.01)  # both run: no room left
        waiting_alice, waiting_other = queued(engine, "Hello.", "alice"), queued(engine, "Hello there.", "tiny")
        loop.submit([waiting_alice, waiting_other])

        def delete() -> list[int]:
            engine.remove_voice("alice")
            return engine.running()
        running_then = loop.run_on_engine(delete).result(timeout=60)
        assert {item.input.id for item in running} <= set(running_then)  # deleted while both ran
        for item in running:  # each finishes in the voice it began with: its whole budget, fixed_length
            audio = item.future.result(timeout=300).audio
            assert audio.size >= engine.frames_needed(item.input) * engine.sample_rate / engine.frame_rate * 0.9
            assert np.isfinite(audio).all() and np.abs(audio).max() > 0
        with pytest.raises(InvalidRequest, match="no voice 'alice'") as refused:
            waiting_alice.future.result(timeout=300)
        assert refused.value.code == ErrorCode.VOICE_NOT_FOUND and refused.value.status == 400
        assert waiting_other.future.result(timeout=300).audio.size > 0
        after = queued(engine, "And the model goes on.", "tiny")
        loop.submit([after])
        assert after.future.result(timeout=300).audio.size > 0
        assert loop.status().turns.count == 0 and not engine.running()
    finally:
        loop.stop()
