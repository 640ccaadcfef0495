"""Every listener bounds what it reads and what it holds (issue #30), on a real server with small caps:

- a request line over 8 KiB, a header line over 8 KiB, over 128 headers or a head over 16 KiB is answered
  414/431 and closed on every route, the WebSocket upgrade included (it was never answered nor closed), and so
  is an upgrade websockets cannot read (400);
- WebSockets are capped in all, not only per caller; a web page from another origin is refused (403);
- a key revoked while its socket is open ends the socket's work with an invalid_api_key error;
- a client hanging up as its utterance starts is a 499 and an info line, not a 500 with a traceback;
- Wyoming closes idle and half-open connections, caps them per address and in all, and answers an event
  whose lengths are not whole numbers of bytes within the limit with an error event, then closes.

Wyoming callers are told apart by their source address (any 127.x.y.z reaches 127.0.0.1 on Linux), WebSocket
callers by X-Forwarded-For (the server trusts 127.0.0.1 as a proxy)."""

from __future__ import annotations

import json
import socket
import time
from functools import partial
from urllib.parse import urlsplit

import httpx
import pytest
from websockets.exceptions import ConnectionClosed, InvalidStatus
from websockets.sync.client import connect
from wyoming.error import Error
from wyoming.event import Event, read_event, write_event
from wyoming.info import Describe, Info

from bench.server import free_port, start_server
from tests.faults.conftest import connect_as, receive_event, speak
from tests.serve import metric, wait_until

pytestmark = pytest.mark.slow  # servers, browsers or clusters: the full run only (see pytest.ini)

ADMIN_TOKEN = "listeners-admin"
ADMIN = {"Authorization": f"Bearer {ADMIN_TOKEN}"}
ALLOWED_ORIGIN = "https://app.example"
WS_MAX_CONNECTIONS = 3
WYOMING_IDLE_TIMEOUT_S = 4.0
WYOMING_MAX_PER_CALLER = 3
WYOMING_MAX_CONNECTIONS = 12
WAIT_S = 15  # for any one answer, or for the server to close a connection it should close
UPGRADE = (b"Host: x\r\nUpgrade: websocket\r\nConnection: Upgrade\r\nSec-WebSocket-Version: 13\r\n"
           b"Sec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\n")


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    """(the server, its Wyoming port)"""
    wyoming_port = free_port()
    process = start_server(
        tmp_path_factory.mktemp("listeners"), log_level="info", calibration_sizes="1", trusted_proxies="127.0.0.1",
        admin_token=ADMIN_TOKEN, allowed_origins=ALLOWED_ORIGIN, ws_max_connections=str(WS_MAX_CONNECTIONS),
        operator_defaults='{"anonymous_tier": "enterprise", "degrade_enabled": false}',
        wyoming_port=str(wyoming_port), wyoming_idle_timeout_s=str(WYOMING_IDLE_TIMEOUT_S),
        wyoming_max_per_caller=str(WYOMING_MAX_PER_CALLER), wyoming_max_connections=str(WYOMING_MAX_CONNECTIONS))
    yield process, wyoming_port
    process.stop()


def answered(base: str, source: str, status: int) -> float:
    return metric(base, rf'tts_requests_total\{{source="{source}",status="{status}"\}}')


def read_to_end(connection: socket.socket) -> bytes:
    """Everything the server sends until it closes the connection (socket.timeout if it does not, in WAIT_S)."""
    connection.settimeout(WAIT_S)
    received = b""
    while chunk := connection.recv(65536):
        received += chunk
    return received


# --- WebSockets: caps, origins, keys, hang-ups (the cap test first: nothing else holds a socket yet) ----------


def test_websockets_are_capped_in_all_callers_together(server):
    base = server[0].base_url
    held = [connect_as(base, f"10.30.0.{n}") for n in range(WS_MAX_CONNECTIONS)]  # one each: under the caller cap
    try:
        assert [speak(socket_)["type"] for socket_ in held] == ["done"] * WS_MAX_CONNECTIONS
        with connect_as(base, "10.30.0.99") as refused:
            error = receive_event(refused, WAIT_S)["error"]
            assert error["code"] == "too_many_connections" and error["type"] == "server_overloaded"
            with pytest.raises(ConnectionClosed) as closed:
                refused.recv(timeout=WAIT_S)
            assert closed.value.rcvd.code == 1008
        held.pop().close()

        def another_is_accepted() -> bool:  # the server sees the close a moment later
            with connect_as(base, "10.30.0.98") as socket_:
                try:
                    return speak(socket_)["type"] == "done"
                except ConnectionClosed:  # refused (error event, close) before it spoke
                    return False

        assert wait_until(another_is_accepted, WAIT_S), "a closed socket still counts against the total"
    finally:
        for socket_ in held:
            socket_.close()


def test_a_web_page_from_another_origin_cannot_open_the_websocket(server):
    base = server[0].base_url
    url = base.replace("http://", "ws://") + "/v1/audio/speech/stream"
    with pytest.raises(InvalidStatus) as refused:
        connect(url, origin="https://evil.example", open_timeout=WAIT_S)
    assert refused.value.response.status_code == 403
    own = "http://" + urlsplit(base).netloc  # the server's own page, one listed, and a client that is no page
    for origin in (own, ALLOWED_ORIGIN, None):
        with connect(url, origin=origin, open_timeout=WAIT_S) as socket_:
            assert speak(socket_)["type"] == "done", origin


def test_a_key_revoked_while_its_socket_is_open_ends_the_sockets_work(server):
    base = server[0].base_url
    made = httpx.post(f"{base}/admin/api/keys", headers=ADMIN, json={"name": "revoked", "tier": "enterprise"})
    assert made.status_code == 201, made.text
    url = base.replace("http://", "ws://") + "/v1/audio/speech/stream"
    with connect(url, additional_headers={"Authorization": f"Bearer {made.json()['key']}"},
                 open_timeout=WAIT_S) as socket_:
        assert speak(socket_)["type"] == "done"
        assert httpx.delete(f"{base}/admin/api/keys/{made.json()['id']}", headers=ADMIN).status_code == 200
        socket_.send(json.dumps({"text": "Spoken after the key was revoked."}))
        event = receive_event(socket_, WAIT_S)
        assert event["type"] == "error", event  # not "started": nothing more is spoken
        assert event["error"]["code"] == "invalid_api_key" and event["error"]["type"] == "authentication_error"
        with pytest.raises(ConnectionClosed) as closed:
            socket_.recv(timeout=WAIT_S)
    assert closed.value.rcvd.code == 1008
    assert answered(base, "websocket", 401) == 1


def test_a_client_hanging_up_as_its_utterance_starts_is_a_499_not_a_500(server):
    process, hang_ups = server[0], 20
    base = process.base_url

    def counts() -> dict[int, float]:
        return {status: answered(base, "websocket", status) for status in (200, 499, 500)}

    def answered_in_all(expected: float) -> bool:
        return sum(counts().values()) == expected

    before = counts()
    for n in range(hang_ups):  # the text, then the close frame at once: "started" goes to a client that has left
        with connect_as(base, f"10.30.1.{n}") as socket_:
            socket_.send(json.dumps({"text": "Hello there, this is the start of something longer."}))
        # one at a time: a socket counts against the total cap until the server has ended its utterance
        assert wait_until(partial(answered_in_all, sum(before.values()) + n + 1), WAIT_S), counts()
    after = counts()
    assert after[500] == before[500] == 0 and after[499] - before[499] >= hang_ups / 2
    assert "Traceback" not in process.log_path.read_text()


# --- request lines and headers, on every route and the upgrade ----------------------------------------------


@pytest.mark.parametrize("head, status", [
    (b"GET /v1/audio/speech/stream?x=" + b"a" * 9000 + b" HTTP/1.1\r\n" + UPGRADE, 414),
    (b"GET /v1/audio/speech/stream HTTP/1.1\r\n" + UPGRADE + b"X-Long: " + b"a" * 9000 + b"\r\n", 431),
    (b"GET /v1/audio/speech/stream HTTP/1.1\r\n" + UPGRADE + b"".join(b"X-%d: 1\r\n" % n for n in range(150)), 431),
    (b"GET /v1/audio/speech/stream HTTP/1.1\r\n" + UPGRADE + b"Transfer-Encoding: chunked\r\n", 400),  # websockets'
    (b"GET /health?x=" + b"a" * 9000 + b" HTTP/1.1\r\nHost: x\r\n", 414),
    (b"GET /health HTTP/1.1\r\nHost: x\r\n" + b"".join(b"X-%d: %s\r\n" % (n, b"a" * 4000) for n in range(25)), 431),
], ids=["upgrade line", "upgrade header line", "upgrade headers", "upgrade websockets cannot read", "http line",
        "http head in one read"])
def test_a_head_over_the_limits_is_answered_and_closed(server, head, status):
    address = urlsplit(server[0].base_url)
    connections = [socket.create_connection((address.hostname, address.port), timeout=WAIT_S) for _ in range(10)]
    try:
        for connection in connections:
            connection.sendall(head + b"\r\n")
        answers = {read_to_end(connection).split(b"\r\n")[0] for connection in connections}  # closed, each one
    finally:
        for connection in connections:
            connection.close()
    assert len(answers) == 1 and answers.pop().startswith(b"HTTP/1.1 %d " % status)
    said = "WebSocket handshake refused" if status == 400 else f"refused {status}"  # and a line says why
    assert wait_until(lambda: said in server[0].log_path.read_text())


def test_an_upgrade_within_the_limits_still_opens(server):
    address = urlsplit(server[0].base_url)
    with socket.create_connection((address.hostname, address.port), timeout=WAIT_S) as connection:
        connection.sendall(b"GET /v1/audio/speech/stream?x=" + b"a" * 8000 + b" HTTP/1.1\r\n" + UPGRADE + b"\r\n")
        assert connection.recv(4096).startswith(b"HTTP/1.1 101 ")


# --- Wyoming ------------------------------------------------------------------------------------------------


def wyoming(port: int, source: str) -> socket.socket:
    return socket.create_connection(("127.0.0.1", port), timeout=WAIT_S, source_address=(source, 0))


def ask(connection: socket.socket, event: Event) -> Event | None:
    """Send one event; the server's next one (None: it closed the connection)."""
    write_event(event, connection.makefile("wb"))
    return read_event(connection.makefile("rb"))


def refused_and_closed(connection: socket.socket) -> str:
    """The code of the error event the server sends before it closes the connection (which it must)."""
    reader = connection.makefile("rb")
    event = read_event(reader)
    assert event is not None and Error.is_type(event.type), event
    assert reader.read() == b"", "the connection stays open"
    return Error.from_event(event).code


def hang_up(connection: socket.socket) -> None:
    """Close, and wait for the server to close its end: by then it no longer counts the connection."""
    connection.shutdown(socket.SHUT_WR)
    read_to_end(connection)
    connection.close()


def test_idle_and_half_open_wyoming_connections_are_closed(server):
    port, kinds = server[1], {"silent": b"", "half a header": b'{"type": "desc'}
    connections = {}
    for n in range(10):
        kind = list(kinds)[n % len(kinds)]
        connection = wyoming(port, f"127.0.2.{n + 1}")
        connection.sendall(kinds[kind])
        connections[connection] = kind
    opened = time.monotonic()
    try:
        for connection, kind in connections.items():
            try:
                assert read_to_end(connection) == b"", kind
            except TimeoutError:
                pytest.fail(f"a {kind} connection is still open after {WAIT_S} s")
        closed_after_s = time.monotonic() - opened
    finally:
        for connection in connections:
            connection.close()
    assert WYOMING_IDLE_TIMEOUT_S * 0.8 <= closed_after_s <= WYOMING_IDLE_TIMEOUT_S + WAIT_S
    with wyoming(port, "127.0.2.99") as connection:  # one that speaks is served
        assert Info.is_type(ask(connection, Describe().event()).type)


def test_one_address_may_hold_only_so_many_wyoming_connections(server):
    port = server[1]
    held = [wyoming(port, "127.0.3.1") for _ in range(WYOMING_MAX_PER_CALLER)]
    try:
        assert all(Info.is_type(ask(connection, Describe().event()).type) for connection in held)
        with wyoming(port, "127.0.3.1") as refused:
            assert refused_and_closed(refused) == "too_many_sockets"
        with wyoming(port, "127.0.3.2") as other:  # another address is served
            assert Info.is_type(ask(other, Describe().event()).type)
        hang_up(held.pop())
        with wyoming(port, "127.0.3.1") as again:
            assert Info.is_type(ask(again, Describe().event()).type)
    finally:
        for connection in held:
            connection.close()


def test_wyoming_connections_are_capped_in_all(server):
    port = server[1]
    held = [wyoming(port, f"127.0.4.{n + 1}") for n in range(WYOMING_MAX_CONNECTIONS)]
    try:
        assert all(Info.is_type(ask(connection, Describe().event()).type) for connection in held)
        with wyoming(port, "127.0.4.200") as refused:
            assert refused_and_closed(refused) == "too_many_connections"
    finally:
        for connection in held:
            hang_up(connection)


@pytest.mark.parametrize("lengths, code", [
    ('"data_length": 1e999', "invalid_event_length"), ('"data_length": -1', "invalid_event_length"),
    ('"payload_length": "12"', "invalid_event_length"), ('"data_length": 12.5', "invalid_event_length"),
    ('"payload_length": 1180591620717411303424', "event_too_large"),
])
def test_a_wyoming_event_whose_lengths_cannot_be_read_is_answered_then_closed(server, lengths, code):
    with wyoming(server[1], "127.0.5.1") as connection:
        connection.sendall(b'{"type": "describe", %s}\n' % lengths.encode())
        assert refused_and_closed(connection) == code
    with wyoming(server[1], "127.0.5.1") as connection:  # and the server serves on
        assert Info.is_type(ask(connection, Describe().event()).type)


HTTP_MAX_PER_CALLER, HTTP_MAX_CONNECTIONS = 2, 4


@pytest.fixture(scope="module")
def capped_server(tmp_path_factory):
    """HTTP connections capped small; 127.0.0.1 is a trusted proxy (its connections count in all only), 127.0.0.3 a
    caller of its own. Idle connections are held for the test's length (a long header deadline)."""
    process = start_server(tmp_path_factory.mktemp("capped"), log_level="info", calibration_sizes="1",
                           trusted_proxies="127.0.0.1", header_timeout_s="60",
                           http_max_per_caller=str(HTTP_MAX_PER_CALLER), http_max_connections=str(HTTP_MAX_CONNECTIONS))
    yield process
    process.stop()


def _held(server: str, source: str) -> socket.socket:
    """An idle connection from `source` that the server has taken (its answer to a first request: none yet)."""
    address = urlsplit(server)
    return socket.create_connection((address.hostname, address.port), timeout=WAIT_S, source_address=(source, 0))


def _refused(server: str, source: str) -> tuple[int, dict]:
    """The status and error body a new connection from `source` is answered with before it sends anything, and
    that it is then closed."""
    with _held(server, source) as refused:
        answer = b""
        while chunk := refused.recv(65536):  # the server closes it after its answer
            answer += chunk
    head, _, body = answer.partition(b"\r\n\r\n")
    return int(head.split()[1]), json.loads(body)


def _served(server: str, source: str) -> bool:
    with _held(server, source) as held:
        held.sendall(b"GET /health HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
        return held.recv(65536).startswith(b"HTTP/1.1 200")


def test_http_connections_are_capped_per_caller_and_in_all(capped_server):
    server = capped_server.base_url
    caller = [_held(server, "127.0.0.3") for _ in range(HTTP_MAX_PER_CALLER)]
    # one more from the same address: 429 too_many_sockets with Retry-After, then closed (no file held)
    status, body = _refused(server, "127.0.0.3")
    assert status == 429 and body["error"]["code"] == "too_many_sockets"
    # a trusted proxy speaks for many callers: it is not held to one caller's share, only to the total
    proxy = [_held(server, "127.0.0.1") for _ in range(HTTP_MAX_CONNECTIONS - HTTP_MAX_PER_CALLER)]
    status, body = _refused(server, "127.0.0.1")
    assert status == 503 and body["error"]["code"] == "too_many_connections"
    for held in caller + proxy:
        held.close()
    # once they are closed, the server serves again
    assert wait_until(lambda: _served(server, "127.0.0.3"), WAIT_S)
    assert "refused: at most 2 HTTP connections" in capped_server.log_path.read_text()
