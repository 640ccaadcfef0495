"""Connections that would otherwise never end: a deadline for every HTTP request to arrive whole,
and a cap on the WebSockets each caller holds open (the WebSocket's idle timeout is in speech_socket)."""

from __future__ import annotations

import asyncio
from collections import Counter
from typing import ClassVar

import h11
from uvicorn.protocols.http.h11_impl import H11Protocol

from tts_core.errors import RateLimited


class RequestDeadlineProtocol(H11Protocol):
    """uvicorn's h11 protocol, plus a deadline for each request to arrive whole.

    uvicorn closes keep-alive connections idle between requests (timeout_keep_alive), but waits for
    ever for a new connection's first byte and for the rest of a request that has begun: a client
    sending a header byte every few seconds holds its connection for ever (slowloris). Here a
    request's headers and body must be complete within `deadline_s` of the connection opening or of
    the request's first byte, or the connection is closed.

    Why here: an ASGI middleware never sees a request whose headers are incomplete, and a guard
    around the transport would have to parse HTTP again to tell when a request is whole; h11 knows
    (`their_state`). uvicorn takes a protocol class (Config(http=...)); h11 is pinned, rather than
    httptools when it happens to be installed, so the deadline always applies.
    """

    deadline_s: ClassVar[float] = 10.0
    _deadline: asyncio.TimerHandle | None = None
    _upgraded = False

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(transport)
        self._arm_deadline()  # a connection that never sends a byte is closed too

    def data_received(self, data: bytes) -> None:
        super().data_received(data)
        if self._upgraded:
            return
        if self.conn.their_state in (h11.IDLE, h11.SEND_BODY):  # part of a request is here, not all of it
            self._arm_deadline()
        else:
            self._disarm_deadline()

    def handle_websocket_upgrade(self, event: h11.Request) -> None:
        self._upgraded = True  # the WebSocket protocol owns the connection from here
        self._disarm_deadline()
        super().handle_websocket_upgrade(event)

    def connection_lost(self, exc: Exception | None) -> None:
        self._disarm_deadline()
        super().connection_lost(exc)

    def _arm_deadline(self) -> None:
        if self._deadline is None:  # the deadline runs from the request's first byte, not its latest one
            self._deadline = self.loop.call_later(self.deadline_s, self._deadline_passed)

    def _disarm_deadline(self) -> None:
        if self._deadline is not None:
            self._deadline.cancel()
            self._deadline = None

    def _deadline_passed(self) -> None:
        self._deadline = None
        if not self.transport.is_closing():
            client = "{}:{}".format(*self.client) if self.client else "unknown client"
            self.logger.info("%s - closed: the request did not arrive whole within %s s", client, self.deadline_s)
            self.transport.close()


def request_deadline_protocol(deadline_s: float) -> type[RequestDeadlineProtocol]:
    """The protocol class to hand uvicorn (Config(http=...)), with this deadline."""
    return type("RequestDeadlineProtocol", (RequestDeadlineProtocol,), {"deadline_s": deadline_s})


def too_many_sockets(limit: int) -> RateLimited:
    error = RateLimited(f"at most {limit} WebSockets may be open per caller; close one first", 1, {})
    error.code = "too_many_sockets"  # RateLimited's kind and status (429); the code says which limit
    return error


class OpenSockets:
    """The WebSockets each caller holds open. Touched only on the event loop: no lock."""

    def __init__(self, max_per_caller: int):
        self.max_per_caller = max_per_caller
        self._open: Counter[str] = Counter()

    def open(self, caller: str) -> None:
        """Count one more socket for caller; RateLimited if it already holds the most it may."""
        if self._open[caller] >= self.max_per_caller:
            raise too_many_sockets(self.max_per_caller)
        self._open[caller] += 1

    def close(self, caller: str) -> None:
        self._open[caller] -= 1
        if self._open[caller] <= 0:
            del self._open[caller]
