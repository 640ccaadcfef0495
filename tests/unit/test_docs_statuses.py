"""Every page that says the status an error code answers says the error table's (docs/api.md): docs/operating.md
said the text cap answered 400 while the server answers 503."""

from __future__ import annotations

import re
from pathlib import Path

DOCS = Path(__file__).resolve().parents[2] / "docs"


def table() -> dict[str, int]:
    rows = (re.match(r"\| `([a-z_]+)` \| (\d{3}) \|", line) for line in (DOCS / "api.md").read_text().splitlines())
    return {row.group(1): int(row.group(2)) for row in rows if row}


def test_each_status_said_beside_an_error_code_is_the_tables():
    statuses = table()
    assert statuses["degraded_text_limit"] == 503
    said = [(page.name, number, int(status), code) for page in sorted(DOCS.glob("*.md"))
            for number, line in enumerate(page.read_text().splitlines(), 1)
            for status, code in re.findall(r"\b(\d{3}) `([a-z_]+)`", line)]
    assert any(code == "degraded_text_limit" for _, _, _, code in said)
    wrong = [(page, number, status, code) for page, number, status, code in said
             if code in statuses and statuses[code] != status]
    assert not wrong, wrong
