"""What the tab's tables share: times are shown in the browser's own time zone. Each is a <time> (UTC until
LOCAL_TIMES_JS rewrites it), in a column of HTML; every other column is plain text (it holds names that
callers and admins chose)."""

from __future__ import annotations

import html
from datetime import UTC, datetime

import gradio as gr

LOCAL_TIMES_JS = """
const local = () => {
  for (const time of document.querySelectorAll('time[datetime]:not([data-local])')) {
    time.textContent = new Date(time.getAttribute('datetime')).toLocaleString([], {dateStyle: 'medium',
                                                                                   timeStyle: 'medium'});
    time.dataset.local = '';
  }
};
new MutationObserver(local).observe(document.body, {childList: true, subtree: true, characterData: true});
local();
"""


def time_cell(moment: str | datetime | None) -> str:
    """A stored time (ISO text or a datetime, UTC) as a <time> the browser shows in its own zone."""
    if not moment:
        return ""
    moment = datetime.fromisoformat(moment) if isinstance(moment, str) else moment
    moment = (moment if moment.tzinfo else moment.replace(tzinfo=UTC)).astimezone(UTC)
    return (f'<time datetime="{html.escape(moment.isoformat())}">'
            f'{moment.strftime("%Y-%m-%d %H:%M:%S")} UTC</time>')


def empty_hint(words: str) -> gr.Markdown:
    """What an empty table is for and how a row gets there, under it (shown until the table has rows: hinted)."""
    return gr.Markdown(words, elem_classes=["chorus-empty-table"])


def hinted(rows: list, words: str) -> str:
    """The hint under a table: its words while the table is empty, nothing once it has rows."""
    return "" if rows else words


def datatypes(columns: list[str], times: tuple[str, ...]) -> list[str]:
    return ["html" if column in times else "str" for column in columns]
