"""An exception raised inside an engine (issue 44, case 7), on a real HTTP server: the caller gets our message (the
model, the exception's class), never the exception's own text, which can hold raw tensors; the server's log has it
whole, once; and the server goes on serving."""

from __future__ import annotations

import logging

import httpx
import pytest
import torch

from app import create_app
from tests.fakes import POISON, FakeEngine
from tests.serve import serve_in_thread
from tts_core.config import Settings

pytestmark = pytest.mark.slow  # servers, browsers or clusters: the full run only (see pytest.ini)

TENSOR_TEXT = str(torch.full((8,), float("nan")))  # tensor([nan, nan, ...])


class TensorTextEngine(FakeEngine):
    """Raises, for a poisoned item, what a model raises when its numbers go wrong: a message with a tensor in it."""

    def synthesize(self, batch):
        if any(POISON in item.tokens for item in batch):
            raise ValueError(f"Discriminant has negative values: {TENSOR_TEXT}")
        return super().synthesize(batch)


class PoisonFirst(TensorTextEngine):
    def tokenize(self, text: str, voice: str):
        tokens = super().tokenize(text, voice)
        if text.startswith("poison"):
            tokens[0][0] = POISON
        return tokens


def test_an_engine_error_answers_our_message_and_is_logged_whole_once(tmp_path, caplog):
    settings = Settings(data_dir=tmp_path, batch_policy="sequential", calibration_sizes=[1], model_aliases={},
                        voice_aliases={})
    with serve_in_thread(create_app(settings, engines=[PoisonFirst()])) as base:
        def speak(text: str) -> httpx.Response:
            return httpx.post(f"{base}/v1/audio/speech", timeout=30,
                              json={"model": "fake", "voice": "fake-voice", "input": text, "response_format": "wav"})

        with caplog.at_level(logging.WARNING):
            failed = speak("poison in this sentence")
        assert failed.status_code == 500
        error = failed.json()["error"]
        assert error == {"message": "synthesis failed in model fake (ValueError); retry, or report it if it repeats",
                         "type": "server_error", "param": None, "code": "synthesis_failed"}
        assert "tensor" not in failed.text and "nan" not in failed.text
        logged = [record for record in caplog.records if record.exc_info and TENSOR_TEXT in str(record.exc_info[1])]
        assert len(logged) == 1  # the whole exception, with its traceback, once
        assert speak("a sentence after it").status_code == 200  # the model serves on
