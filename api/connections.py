"""Connections that would otherwise never end, or read without bound: for every HTTP request a deadline to
arrive whole and a bound on its request line and headers (the WebSocket upgrade's included), a WebSocket
handshake that websockets refuses answered and closed, and caps on the connections each caller, and all
callers together, hold open on a listener (the WebSocket's idle timeout is in speech_socket, Wyoming's in
wyoming)."""

from __future__ import annotations

import asyncio
import json
from collections import Counter
from collections.abc import Callable
from http import HTTPStatus
from typing import ClassVar

import h11
from uvicorn.protocols.http.h11_impl import H11Protocol
from uvicorn.protocols.websockets.websockets_sansio_impl import WebSocketsSansIOProtocol
from websockets.http11 import MAX_LINE_LENGTH, MAX_NUM_HEADERS

from tts_core.errors import ChorusError, ErrorCode, Overloaded, RateLimited

# The WebSocket handshake's own limits (websockets reads the upgrade with them), so that every route has the
# same: a request line or a header line over 8 KiB, or over 128 headers, is refused before any route sees it.
MAX_LINE_BYTES, MAX_HEADERS = MAX_LINE_LENGTH, MAX_NUM_HEADERS
MAX_HEAD_BYTES = 16 * 1024  # the request line and headers together (h11's bound on a head still arriving)


def head_refusal(request: h11.Request) -> h11.RemoteProtocolError | None:
    """Why a request's head is over the limits (414: its request line, 431: its headers), as h11 says a request
    it cannot take; None when it is within them. Lines are measured as they are sent, CRLF included."""
    line = len(request.method) + len(request.target) + len(b"  HTTP/1.1\r\n")
    if line > MAX_LINE_BYTES:
        return h11.RemoteProtocolError(f"the request line is longer than {MAX_LINE_BYTES} bytes", 414)
    headers = [len(name) + len(value) + len(b": \r\n") for name, value in request.headers]
    if len(headers) > MAX_HEADERS:
        return h11.RemoteProtocolError(f"more than {MAX_HEADERS} headers", 431)
    if max(headers, default=0) > MAX_LINE_BYTES:
        return h11.RemoteProtocolError(f"a header line is longer than {MAX_LINE_BYTES} bytes", 431)
    if line + sum(headers) > MAX_HEAD_BYTES:
        return h11.RemoteProtocolError(f"the request line and headers are longer than {MAX_HEAD_BYTES} bytes", 431)
    return None


def client_name(client: tuple[str, int] | None) -> str:
    return "{}:{}".format(*client) if client else "unknown client"


class BoundedHead(h11.Connection):
    """h11, refusing a request whose head is over the limits. h11's own bound holds only while a head is still
    arriving: one read (up to 256 KiB) can bring a longer head whole, and h11 takes it. The last refusal is
    kept, so that the answer can say which status and why (uvicorn answers every refusal 400)."""

    refusal: h11.RemoteProtocolError | None = None

    def next_event(self):
        try:
            event = super().next_event()
            if isinstance(event, h11.Request) and (refusal := head_refusal(event)) is not None:
                raise refusal
        except h11.RemoteProtocolError as refusal:
            self.refusal = refusal
            raise
        return event


class BoundedHttpProtocol(H11Protocol):
    """uvicorn's h11 protocol, plus a deadline for each request to arrive whole and a bound on its head.

    uvicorn closes keep-alive connections idle between requests (timeout_keep_alive), but waits for
    ever for a new connection's first byte and for the rest of a request that has begun: a client
    sending a header byte every few seconds holds its connection for ever (slowloris). Here a
    request's headers and body must be complete within `deadline_s` of the connection opening or of
    the request's first byte, or the connection is closed. A head over the limits (head_refusal) is
    answered 414 or 431, with a log line, and the connection closed, on every route.

    Why here: an ASGI middleware never sees a request whose headers are incomplete, and a guard
    around the transport would have to parse HTTP again to tell when a request is whole; h11 knows
    (`their_state`). uvicorn takes a protocol class (Config(http=...)); h11 is pinned, rather than
    httptools when it happens to be installed, so the deadline always applies.
    """

    deadline_s: ClassVar[float] = 10.0
    write_timeout_s: ClassVar[float] = 30.0  # a client that takes nothing sent to it this long is cut off
    _write_stalled: asyncio.TimerHandle | None = None
    open_connections: ClassVar[OpenSockets | None] = None  # the HTTP connections open, per caller and in all
    is_proxy: ClassVar[Callable[[str], bool]] = staticmethod(lambda peer: False)  # counted in all only
    _deadline: asyncio.TimerHandle | None = None
    _upgraded = False
    _counted: tuple[str | None] | None = None  # the caller this connection is counted for, once counted

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.conn = BoundedHead(h11.SERVER, MAX_HEAD_BYTES)

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(transport)
        if self.open_connections is not None:
            peer = self.client[0] if self.client else "unknown"
            caller = None if self.is_proxy(peer) else peer
            try:
                self.open_connections.open(caller)
            except ChorusError as refusal:  # answered before any request, then closed: its file is free at once
                self.logger.info("%s - refused: %s", client_name(self.client), refusal.message)
                transport.write(_refusal_bytes(refusal))
                transport.close()
                return
            self._counted = (caller,)
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
        self._upgraded = True  # the WebSocket protocol owns the connection from here, and its caps count it
        self._disarm_deadline()
        self._uncount()
        super().handle_websocket_upgrade(event)

    def send_400_response(self, msg: str) -> None:
        """uvicorn's answer to a request h11 refuses, always 400: here with the refusal's own status and reason."""
        refusal = self.conn.refusal
        status, reason = (refusal.error_status_hint, str(refusal)) if refusal else (400, msg)
        self.logger.info("%s - refused %d: %s", client_name(self.client), status, reason)
        body = reason.encode() + b"\n"
        headers = [(b"content-type", b"text/plain; charset=utf-8"), (b"content-length", b"%d" % len(body)),
                   (b"connection", b"close")]
        response = h11.Response(status_code=status, headers=headers, reason=HTTPStatus(status).phrase)
        for event in (response, h11.Data(data=body), h11.EndOfMessage()):
            self.transport.write(self.conn.send(event))
        self.transport.close()

    def pause_writing(self) -> None:
        """The client takes nothing of what is sent (its socket's buffers are full): a stream's send waits. One that
        stops reading and stays connected held its stream, and a stop, for ever; after write_timeout_s it is cut
        off, as a client that left (the stream ends, its engine work is freed)."""
        super().pause_writing()
        if self._write_stalled is None:
            self._write_stalled = self.loop.call_later(self.write_timeout_s, self._write_timed_out)

    def resume_writing(self) -> None:
        super().resume_writing()
        self._disarm_write_timeout()

    def _disarm_write_timeout(self) -> None:
        if self._write_stalled is not None:
            self._write_stalled.cancel()
            self._write_stalled = None

    def _write_timed_out(self) -> None:
        self._write_stalled = None
        if not self.transport.is_closing():
            self.logger.info("%s - cut off: it took nothing sent to it for %s s", client_name(self.client),
                             self.write_timeout_s)
        self.transport.abort()  # what is still buffered for it is dropped: close() would wait to send it

    def connection_lost(self, exc: Exception | None) -> None:
        self._disarm_write_timeout()
        self._disarm_deadline()
        self._uncount()
        super().connection_lost(exc)

    def _uncount(self) -> None:
        if self._counted is not None:
            self.open_connections.close(self._counted[0])
            self._counted = None

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
            self.logger.info("%s - closed: the request did not arrive whole within %s s", client_name(self.client),
                             self.deadline_s)
            self.transport.close()


def bounded_http_protocol(deadline_s: float, connections: OpenSockets | None = None,
                          is_proxy: Callable[[str], bool] = lambda peer: False,
                          write_timeout_s: float = 30.0) -> type[BoundedHttpProtocol]:
    """The protocol class to hand uvicorn (Config(http=...)), with this deadline, this write timeout and these caps
    (a trusted proxy's connections, each many callers', count in all only)."""
    return type("BoundedHttpProtocol", (BoundedHttpProtocol,),
                {"deadline_s": deadline_s, "open_connections": connections, "is_proxy": staticmethod(is_proxy),
                 "write_timeout_s": write_timeout_s})


def _refusal_bytes(refusal: ChorusError) -> bytes:
    """A whole HTTP answer to a connection refused before its first request (h11 sends none before one)."""
    body = json.dumps(refusal.body()).encode()
    headers = {"content-type": "application/json", "content-length": str(len(body)), "connection": "close",
               **refusal.headers()}
    head = f"HTTP/1.1 {refusal.status} {HTTPStatus(refusal.status).phrase}\r\n" + "".join(
        f"{name}: {value}\r\n" for name, value in headers.items())
    return head.encode("latin-1") + b"\r\n" + body


class AnsweredHandshakeProtocol(WebSocketsSansIOProtocol):
    """uvicorn's websockets protocol, answering and closing a handshake that websockets cannot read.

    websockets parses the upgrade again, more strictly than h11 (a Transfer-Encoding, a header value h11
    takes); when it cannot read one it queues its refusal (or only an end of stream) and waits for the caller
    to send it, while uvicorn only looks for the request it did not get: nothing was answered and the
    connection stayed open for ever, past the header deadline (the upgrade disarms it). uvicorn takes the
    class as Config(ws=...)."""

    def data_received(self, data: bytes) -> None:
        super().data_received(data)
        refused = self.conn.handshake_exc
        if refused is not None and not self.handshake_initiated and not self.transport.is_closing():
            cause = refused.__cause__
            self.logger.info("%s - WebSocket handshake refused: %s%s", client_name(self.client), refused,
                             f" ({type(cause).__name__})" if cause else "")  # its text may quote a header's value
            answer = b"".join(self.conn.data_to_send())  # websockets' own refusal, if it made one
            reason = f"{refused}: {cause}" if cause else str(refused)
            self.transport.write(answer or self.conn.reject(400, f"{reason}\n").serialize())
            self.transport.close()


def too_many_sockets(limit: int, what: str) -> RateLimited:
    error = RateLimited(f"at most {limit} {what} may be open per caller; close one first", 1, {})
    error.code = ErrorCode.TOO_MANY_SOCKETS  # RateLimited's kind and status (429); the code says which limit
    return error


class OpenSockets:
    """The connections a listener holds open (`what`: "WebSockets", "Wyoming connections"), per caller and in
    all: each one holds a file descriptor and memory until it closes, so neither one caller nor all of them
    together may hold more than their share. Touched only on the event loop: no lock."""

    def __init__(self, what: str, max_per_caller: int, max_total: int):
        self.what, self.max_per_caller, self.max_total = what, max_per_caller, max_total
        self._open: Counter[str] = Counter()

    def open(self, caller: str | None) -> None:
        """Count one more connection for caller: RateLimited if it already holds the most it may, Overloaded if
        all callers together do. None: a connection counted in all only (a trusted proxy's, many callers')."""
        if caller is not None and self._open[caller] >= self.max_per_caller:
            raise too_many_sockets(self.max_per_caller, self.what)
        if self._open.total() >= self.max_total:
            raise Overloaded(f"the server holds the most {self.what} it may ({self.max_total}); retry shortly", 1,
                             ErrorCode.TOO_MANY_CONNECTIONS)
        self._open[caller] += 1

    def close(self, caller: str | None) -> None:
        self._open[caller] -= 1
        if self._open[caller] <= 0:
            del self._open[caller]
