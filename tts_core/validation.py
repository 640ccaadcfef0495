"""pydantic's validation errors in words a person reads without knowing pydantic: "speed must be a number
between 0.25 and 4", not "Input should be less than or equal to 4" (which is also what a NaN was told).
The API names a field as callers send it, the Admin tab by the label it shows. Also what the routes of the API and
the admin API check alike before any model does: a voice's name, a JSON body they read themselves."""

from __future__ import annotations

import re
from typing import Annotated, Any, get_args

import pydantic_core
from pydantic import StringConstraints
from pydantic.fields import FieldInfo

from .errors import ChorusError, ErrorCode, InvalidRequest

NUMBER_ERRORS = {"float_type", "float_parsing", "int_type", "int_parsing", "int_from_float", "finite_number",
                 "greater_than", "greater_than_equal", "less_than", "less_than_equal"}
FIXED = {"missing": "is required", "bool_type": "must be true or false", "string_type": "must be a string",
         "dict_type": "must be an object of fields", "model_type": "must be an object of fields",
         "model_attributes_type": "must be an object of fields", "list_type": "must be a list",
         "extra_forbidden": "is not a setting this takes"}  # errors whose words need nothing but the name
# the subject pydantic starts its other messages with, replaced by the field's name
SUBJECT = re.compile(r"^(Input|String|Value|List|Dictionary|Decimal|Data) should ")


def plain_message(error: dict, name: str, field: FieldInfo | None = None) -> str:
    """One of pydantic's errors (an item of ValidationError.errors()) as a sentence about `name`; `field`, the
    field it is about where known, gives a number's whole range."""
    kind, context = error.get("type"), error.get("ctx") or {}
    if kind in NUMBER_ERRORS:
        return f"{name} must be {_number(kind, context, field)}"
    if kind in FIXED:
        return f"{name} {FIXED[kind]}"
    if kind == "literal_error":
        return f"{name} must be one of {context['expected']}"
    if kind == "string_too_short":
        return f"{name} must not be empty" if context.get("min_length") == 1 else \
            f"{name} must be at least {context['min_length']} characters long"
    if kind == "string_too_long":
        return f"{name} must be at most {context['max_length']:,} characters long"
    if kind == "string_pattern_mismatch":
        return f"{name} {error.get('input')!r} has characters that are not allowed there"
    if kind == "value_error":
        return f"{name}: {context.get('error', error.get('msg'))}"
    message = error.get("msg", "is not valid")
    return SUBJECT.sub(f"{name} should ", message) if SUBJECT.match(message) else f"{name}: {message}"


def _number(kind: str, context: dict, field: FieldInfo | None) -> str:
    """'a number between 0.25 and 4', 'a whole number above 0 and at most 100' ... from the field's bounds (or,
    without the field, the one bound the error names)."""
    whole = kind.startswith("int") or (field is not None and int in (field.annotation, *get_args(field.annotation)))
    bounds = {key: getattr(bound, key) for bound in (field.metadata if field is not None else [])
              for key in BOUND_WORDS if getattr(bound, key, None) is not None}
    bounds = bounds or {key: value for key, value in context.items() if key in BOUND_WORDS}
    noun = "a whole number" if whole else "a number"
    if "ge" in bounds and "le" in bounds:
        return f"{noun} between {_figure(bounds['ge'])} and {_figure(bounds['le'])}"
    limits = [f"{BOUND_WORDS[key]} {_figure(bounds[key])}" for key in BOUND_WORDS if key in bounds]
    return " ".join([noun, " and ".join(limits)]).strip()


BOUND_WORDS = {"ge": "at least", "gt": "above", "le": "at most", "lt": "below"}  # lower bounds first


def _figure(value: float) -> str:
    return f"{int(value):,}" if float(value).is_integer() else f"{value:g}"


# A voice is looked up by name, never opened as a path: names with separators or controls are refused.
VoiceName = Annotated[str, StringConstraints(min_length=1, max_length=128, pattern=r"^[^/\\\x00-\x1f\x7f]+$")]


def json_body(data: bytes, kind: type[ChorusError] = InvalidRequest) -> Any:
    """A body its route reads itself, parsed as the WebSocket's messages are: pydantic's parser bounds how
    deeply values nest (json.loads would recurse until Python's stack runs out: a RecursionError, a 500)."""
    try:
        return pydantic_core.from_json(data)
    except ValueError as error:
        raise not_json(kind, str(error)) from None


def not_json(kind: type[ChorusError], reason: str) -> ChorusError:
    return kind(f"the request body is not valid JSON: {reason}", None, ErrorCode.INVALID_JSON)
