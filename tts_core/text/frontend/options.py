"""What the front end does to a request's text: one switch per kind of thing it rewrites.

The names are Kokoro-FastAPI's where it has the option (normalize, unit_normalization,
url_normalization, email_normalization, phone_normalization, optional_pluralization_normalization,
replace_remaining_symbols), so its callers' bodies work here unchanged. A kind switched off is left
as written (its expressions are still recognised, so no other rule reads part of one: with dates
off, "2026-11-30" stays "2026-11-30", not three numbers).
"""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, ConfigDict, Field, model_validator
from pydantic_core import PydanticCustomError

from ...errors import ErrorCode


class NormalizationOptions(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True, frozen=True)

    normalize: bool = Field(True, description="false: the text is spoken as written (white space tidied)")
    markdown_normalization: bool = Field(
        True, description="read markdown and HTML as text: markup, code blocks and images' addresses are not read")
    emoji_normalization: bool = Field(True, description="leave emoji out")
    number_normalization: bool = Field(
        True, description="numbers as words: 12, 1st, 3.14, -5, 5-10, 1999 (a year), 50%")
    currency_normalization: bool = Field(True, description="$5, $3.50, €20, £1.5 million")
    date_normalization: bool = Field(True, description="2026-11-30, 11/30/2026, Nov 30, 2026, 30 November")
    time_normalization: bool = Field(True, description="3:30 pm, 14:05, 7am")
    unit_normalization: bool = Field(True, description="units after a number: 5 km, 10kg, 20°C, 100 MB")
    abbreviation_normalization: bool = Field(True, description="Dr., Mr., e.g., i.e., etc., vs.")
    phone_normalization: bool = Field(True, description="phone numbers digit by digit: (555) 123-4567")
    url_normalization: bool = Field(True, description="web addresses: example.com/docs as 'example dot com slash docs'")
    email_normalization: bool = Field(True, description="e-mail addresses: 'jane at example dot com'")
    optional_pluralization_normalization: bool = Field(True, description="file(s) as 'files'")
    replace_remaining_symbols: bool = Field(
        True, description="& + = @ / # as words; markup symbols left over (* _ | ...) as pauses")

    @model_validator(mode="before")
    @classmethod
    def _known_names(cls, values: Any) -> Any:
        """A misspelt option is refused with the names there are (extra="forbid" alone does not name them)."""
        if isinstance(values, dict) and (unknown := sorted(set(values) - set(cls.model_fields))):
            raise PydanticCustomError(ErrorCode.UNKNOWN_OPTION, "unknown option {unknown}; the options are {known}",
                                      {"unknown": ", ".join(map(repr, unknown)), "known": ", ".join(cls.model_fields)})
        return values


def requested(options: NormalizationOptions | None, normalize: bool = True) -> NormalizationOptions:
    """A request's options: its own or the defaults, all off when it says normalize: false."""
    options = options or NormalizationOptions()
    return options if normalize else options.model_copy(update={"normalize": False})
