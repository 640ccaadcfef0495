"""The takes' files as the browser fetches and downloads them: GET ui/files/{take}/{name}, a take by its id (random,
ui/takes.py) and a file of it by its name, so that no link names a path of the server's (Gradio's `file=` links
named the data folder). Every file the UI offers goes this way: the player's pieces, the whole take, its subtitles,
a dialogue's recording and files, and the histories' links. app.py includes the router in the API's app, before
the UI is mounted at `/`."""

from __future__ import annotations

from pathlib import Path

from fastapi import APIRouter
from fastapi.responses import FileResponse

from tts_core.audio.encoding import FORMATS
from tts_core.errors import NotFound
from tts_core.request.captions import SUBTITLE_TYPES

from . import takes

SERVED = {**{name: spec.content_type for name, spec in FORMATS.items() if name != "pcm"}, **SUBTITLE_TYPES}


def router(folder: Path) -> APIRouter:
    """The route to the files of `folder` (the takes' folder, ui.takes_folder)."""
    files = APIRouter()

    @files.api_route(f"/{takes.ROUTE}/{{take}}/{{name}}", methods=["GET", "HEAD"], include_in_schema=False)
    async def take_file(take: str, name: str) -> FileResponse:
        path = takes.kept_file(folder, take, name)
        suffix = name.rpartition(".")[2]
        if path is None or suffix not in SERVED:
            raise NotFound("no such file: a take's files are kept for an hour")
        return FileResponse(path, media_type=SERVED[suffix], filename=name)

    return files
