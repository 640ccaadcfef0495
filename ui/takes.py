"""The synthesis tab's takes: each synthesis's files in a folder of its own (its pieces as they are made,
for the player; the whole text in the chosen format and its subtitles, for download), and the history
of the browser's takes.

The history is a list in the browser's localStorage (gr.BrowserState), the last HISTORY_SIZE takes:
it is the browser's own, so people who share an address (one office, one proxy) do not see each
other's texts, and the server keeps nothing per caller. The files stay in the folder until it is
pruned (KEEP_FILES_S); an entry whose files are gone is dropped. What the browser sends back is
checked: a take is a folder name of ours and a file name, never a path.
"""

from __future__ import annotations

import html
import json
import re
import shutil
import time
import uuid
from pathlib import Path
from urllib.parse import quote

import numpy as np

from tts_core.audio.encoding import encode
from tts_core.request.captions import SUBTITLE_FORMATS

HISTORY_SIZE = 20
TAKE = re.compile(r"[0-9a-f]{12}")
FILE_NAME = re.compile(r"[\w-]{1,80}\.[a-z0-9]{2,4}")
ROUTE = "ui/files"  # where the browser fetches a take's files (ui/files.py)


def prune(folder: Path, older_than_s: float) -> None:
    limit = time.time() - older_than_s
    for path in folder.glob("*"):
        if path.stat().st_mtime >= limit:
            continue
        if path.is_dir():
            shutil.rmtree(path, ignore_errors=True)
        else:
            path.unlink(missing_ok=True)


def file_stem(voice: str, text: str) -> str:
    """A download's name: the voice and the first words ("en_US-joe-medium-hello-from-the-browser")."""
    words = "-".join(re.findall(r"\w+", text.lower())[:5])[:40].strip("-")
    return "-".join(part for part in (re.sub(r"[^\w-]", "_", voice)[:36], words or "speech") if part)


def file_url(path: Path) -> str:
    """Where the browser fetches a file of a take (ui/files.py): its take's id and its name, relative to the page (so
    it works under any path prefix), never the server's path."""
    return f"{ROUTE}/{path.parent.name}/{quote(path.name)}"


def kept_file(folder: Path, take: str, name: str) -> Path | None:
    """A take's file by what a browser asks for (a take's id and a file's name, never a path), if it is there."""
    if not (TAKE.fullmatch(take) and FILE_NAME.fullmatch(name)):
        return None
    path = folder / take / name
    return path if path.is_file() else None


class Take:
    """One synthesis's folder: numbered pieces, then the whole file, its subtitles and its words."""

    def __init__(self, folder: Path):
        self.id = uuid.uuid4().hex[:12]
        self.folder = folder / self.id
        self.folder.mkdir()
        self.pieces: list[str] = []

    def add_piece(self, audio: np.ndarray, sample_rate: int) -> None:
        path = self.folder / f"piece-{len(self.pieces):04d}.wav"
        path.write_bytes(encode(audio, sample_rate, "wav"))
        self.pieces.append(file_url(path))

    def finish(self, data: bytes, stem: str, response_format: str, subtitle_files: dict[str, str], words: str
               ) -> Path:
        """The whole file, its subtitles beside it (if its words are timed) and its words (for a replay)."""
        path = self.folder / f"{stem}.{response_format}"
        path.write_bytes(data)
        (self.folder / "words.html").write_text(words, encoding="utf-8")
        for kind, text in subtitle_files.items():
            path.with_suffix(f".{kind}").write_text(text, encoding="utf-8")
        return path

    def player(self, **extra) -> str:
        """The player's value: the pieces so far (and, once done, the download)."""
        return json.dumps({"take": self.id, "pieces": self.pieces, **extra})


def entries(history: object, folder: Path) -> list[dict]:
    """The browser's history, kept to well-formed entries whose files are still here."""
    if not isinstance(history, list):
        return []
    kept = []
    for entry in history[:HISTORY_SIZE]:
        if isinstance(entry, dict) and kept_file(folder, str(entry.get("take")), str(entry.get("name"))):
            kept.append(entry)
    return kept


def forget(history: object, take: object, folder: Path) -> list[dict]:
    """The history without the take, whose files are deleted (only a take of this history's)."""
    kept = entries(history, folder)
    if any(entry["take"] == take for entry in kept):
        shutil.rmtree(folder / str(take), ignore_errors=True)
    return [entry for entry in kept if entry["take"] != take]


def replay(entry: dict, folder: Path) -> tuple[str, str]:
    """The player's value for an earlier take, and its words."""
    take = folder / entry["take"]
    pieces = [file_url(path) for path in sorted(take.glob("piece-*.wav"))]
    words = take / "words.html"
    return (json.dumps({"take": entry["take"], "pieces": pieces, "done": True, "replay": time.time(),
                        **downloads(take / entry["name"])}),
            words.read_text(encoding="utf-8") if words.is_file() else "")


def download(path: Path) -> dict:
    return {"download": file_url(path), "name": path.name}


def downloads(path: Path) -> dict:
    """The player's links: the whole file, and its subtitles where its words were timed."""
    kept = [path.with_suffix(f".{kind}") for kind in SUBTITLE_FORMATS]
    return {**download(path), "subtitles": [download(subtitle) for subtitle in kept if subtitle.is_file()]}


def history_html(history: list[dict], folder: Path, what: str = "syntheses") -> str:
    if not history:
        return (f'<p class="chorus-empty">Your {what} will be listed here (the last 20, in this browser, '
                'for an hour).</p>')
    rows = []
    for entry in history:
        text = str(entry.get("text", ""))
        at = float(entry.get("at", 0)) if isinstance(entry.get("at"), (int, float)) else 0.0
        seconds = entry.get("duration_s") if isinstance(entry.get("duration_s"), (int, float)) else 0.0
        link = download(folder / entry["take"] / entry["name"])
        rows.append(
            f'<li data-take="{entry["take"]}"><q>{html.escape(text[:140])}{"…" if len(text) > 140 else ""}</q>'
            f'<small>{html.escape(str(entry.get("label", "")))} · '
            f'<time data-at="{at:.0f}">{time.strftime("%H:%M UTC", time.gmtime(at))}</time> · {seconds:.1f} s</small>'
            f'<span class="chorus-actions"><button data-action="replay">▶ Play</button>'
            f'<a href="{html.escape(link["download"])}" download="{link["name"]}">Download</a>'
            f'<button data-action="forget">Delete</button></span></li>')
    return f'<ol class="chorus-history">{"".join(rows)}</ol>'
