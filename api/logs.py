"""Keeping credentials and spoken texts out of the log.

Browsers cannot set headers on a WebSocket, so keys and texts travel in query strings, and
uvicorn's access log writes every request line whole. `RedactingFilter` sits on the log handler
and rewrites, in every record (uvicorn's, the libraries', ours, tracebacks included), query
values and fields named like credentials or texts, bearer tokens and Chorus keys to [redacted].
"""

from __future__ import annotations

import logging
import re
from urllib.parse import unquote_plus

REDACTED = "[redacted]"
SECRET_NAMES = frozenset({"api_key", "apikey", "key", "token", "access_token", "authorization", "text", "input"})

_NAMES = "|".join(sorted(SECRET_NAMES, key=len, reverse=True))
# name=value in a query string or a plain message (the value ends at &, space or a quote)
_PARAMETER = re.compile(r"(?:(?<=[?&;\s])|^)([^=&?;\s\"']+)=([^&;\s\"']*)")
# "input": "...", 'text': '...', token="..." as JSON, a dict's repr or keyword arguments print them
_QUOTED_FIELD = re.compile(r"""(?<![\w-])(["']?(?:""" + _NAMES + r""")["']?\s*[:=]\s*)(["'])(?:\\.|(?!\2)[^\\])*\2""",
                           re.IGNORECASE | re.DOTALL)
_SCHEME_TOKEN = re.compile(r"\b(bearer\s+)[^\s\"',;]+|\b(basic\s+)[A-Za-z0-9+/=]{8,}", re.IGNORECASE)
_CHORUS_KEY = re.compile(r"\bck-[A-Za-z0-9_-]{4,}")


def _parameter(match: re.Match) -> str:
    name = match.group(1)
    if unquote_plus(name).lower() in SECRET_NAMES and match.group(2) != REDACTED:
        return f"{name}={REDACTED}"
    return match.group(0)


def redact(text: str) -> str:
    """text with every credential and spoken text it carries replaced by [redacted]."""
    text = _QUOTED_FIELD.sub(lambda match: f"{match.group(1)}{match.group(2)}{REDACTED}{match.group(2)}", text)
    text = _PARAMETER.sub(_parameter, text)
    text = _SCHEME_TOKEN.sub(lambda match: f"{match.group(1) or match.group(2)}{REDACTED}", text)
    return _CHORUS_KEY.sub(REDACTED, text)


class RedactingFilter(logging.Filter):
    """Put on a handler (a logger's filters would miss the records its children propagate)."""

    _tracebacks = logging.Formatter()

    def filter(self, record: logging.LogRecord) -> bool:
        try:
            message = record.getMessage()
        except Exception:  # a malformed call: logging reports it when it formats the record
            return True
        cleaned = redact(message)
        if cleaned != message:  # only such records lose their args (a secret may sit in msg or in args)
            record.msg, record.args = cleaned, None
        if record.exc_info and not record.exc_text:  # the formatter reuses exc_text as it is
            record.exc_text = redact(self._tracebacks.formatException(record.exc_info))
        if record.stack_info:
            record.stack_info = redact(record.stack_info)
        return True


def redacting_handler() -> logging.Handler:
    """The process's one log handler (stderr): uvicorn's records, the access log too, reach it by propagation."""
    handler = logging.StreamHandler()
    handler.addFilter(RedactingFilter())
    return handler
