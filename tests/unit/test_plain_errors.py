"""pydantic's validation errors in plain words: a field's name (or the Admin tab's label) as the subject, a
number's whole range, nothing of pydantic's own phrasing."""

import math

import pytest
from pydantic import ValidationError

from api.schemas import SpeechRequest
from tts_core.errors import InvalidSetting
from tts_core.request.operating import OperatorSettings
from tts_core.validation import plain_message

GOOD = {"model": "tts-1", "input": "Hello.", "voice": "alloy"}


def said(change: dict) -> str:
    with pytest.raises(ValidationError) as invalid:
        SpeechRequest.model_validate({**GOOD, **change})
    error = invalid.value.errors()[0]
    name = str(error["loc"][0])
    return plain_message(error, name, SpeechRequest.model_fields.get(name))


@pytest.mark.parametrize("change, words", [
    ({"speed": math.nan}, "speed must be a number between 0.25 and 4"),
    ({"speed": math.inf}, "speed must be a number between 0.25 and 4"),
    ({"speed": 0.1}, "speed must be a number between 0.25 and 4"),
    ({"speed": "fast"}, "speed must be a number between 0.25 and 4"),
    ({"sample_rate": 5}, "sample_rate must be a whole number between 8,000 and 48,000"),
    ({"stream": "yes"}, "stream must be true or false"),
    ({"input": 42}, "input must be a string"),
    ({"model": ""}, "model must not be empty"),
    ({"response_format": "ogg"}, "response_format must be one of 'mp3', 'opus', 'aac', 'flac', 'wav' or 'pcm'"),
    ({"stream_format": "video"}, "stream_format must be one of 'audio' or 'sse'"),
    ({"normalization_options": 5}, "normalization_options must be an object of fields"),
])
def test_request_fields(change, words):
    assert said(change) == words


def test_a_missing_field_and_a_bound_without_its_field():
    assert said({"model": None}) == "model must be a string"
    body = {key: value for key, value in GOOD.items() if key != "model"}
    with pytest.raises(ValidationError) as invalid:
        SpeechRequest.model_validate(body)
    assert plain_message(invalid.value.errors()[0], "model") == "model is required"
    # a socket or batch message validated without its model at hand: the one bound the error names
    assert plain_message({"type": "less_than_equal", "ctx": {"le": 4.0}, "msg": "..."}, "speed") == \
        "speed must be a number at most 4"


@pytest.mark.parametrize("change, words", [
    ({"enter_threshold": 2.0}, "enter_threshold must be a number above 0 and at most 1"),
    ({"cap_text_chars": 0}, "cap_text_chars must be a whole number between 1 and 100,000"),
    ({"tiers": {"free": {"priority": 500}}}, "tiers.free.priority must be a whole number between -100 and 100"),
    ({"tiers": {"free": {"rate_limit": "often"}}}, "tiers.free.rate_limit: 'often' is not a rate limit like "
                                                   "'10/minute'"),
])
def test_operator_settings_refusals_name_the_value(change, words):
    with pytest.raises(InvalidSetting) as refused:
        OperatorSettings().merged(change)
    assert refused.value.message == words
