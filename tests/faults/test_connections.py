"""Connections that never finish are closed: HTTP requests that do not arrive whole within the
header timeout, idle WebSockets; and one caller cannot hold more than its share of sockets."""

from __future__ import annotations

import json
import select
import socket
import time
from urllib.parse import urlsplit

import httpx
import pytest
from websockets.exceptions import ConnectionClosed

from tests.faults.conftest import (
    HEADER_TIMEOUT_S,
    WS_IDLE_TIMEOUT_S,
    WS_MAX_PER_CALLER,
    connect_as,
    receive_event,
    speak,
)

pytestmark = pytest.mark.slow  # servers, browsers or clusters: the full run only (see pytest.ini)

SLOW_STARTS = {
    "silent": b"",  # connects, never sends a byte
    "trickled headers": b"GET /health HTTP/1.1\r\nHost: x\r\n",  # then a header byte at a time
    "trickled body": b"POST /v1/audio/speech HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                     b"Content-Length: 100000\r\n\r\n{",  # then a body byte at a time
}


def closed_by_peer(connection: socket.socket) -> bool:
    try:
        if select.select([connection], [], [], 0)[0]:
            return connection.recv(4096) == b""
        return False
    except OSError:  # reset
        return True


def test_requests_that_do_not_arrive_whole_are_closed_within_the_header_timeout(hostile_server):
    address = urlsplit(hostile_server.base_url)
    connections = {}
    for n in range(30):  # ten of each kind
        kind = list(SLOW_STARTS)[n % len(SLOW_STARTS)]
        connection = socket.create_connection((address.hostname, address.port), timeout=5)
        connection.sendall(SLOW_STARTS[kind])
        connections[connection] = kind
    opened, open_after, deadline = time.monotonic(), dict(connections), time.monotonic() + HEADER_TIMEOUT_S + 10
    try:
        while open_after and time.monotonic() < deadline:  # bounded: each round trickles one byte per connection
            for connection, kind in list(open_after.items()):
                if closed_by_peer(connection):
                    del open_after[connection]
                elif kind != "silent":
                    try:
                        connection.send(b"a")
                    except OSError:
                        del open_after[connection]
            time.sleep(0.2)
        closed_after_s = time.monotonic() - opened
    finally:
        for connection in connections:
            connection.close()
    assert not open_after, f"still open after {HEADER_TIMEOUT_S + 10} s: {sorted(set(open_after.values()))}"
    assert closed_after_s >= HEADER_TIMEOUT_S * 0.8  # closed by the deadline, not at once


def test_requests_that_arrive_in_time_are_served(hostile_server):
    address = urlsplit(hostile_server.base_url)
    with socket.create_connection((address.hostname, address.port), timeout=10) as connection:
        for piece in (b"GET /health HTTP/1.1\r\n", b"Host: x\r\n", b"\r\n"):  # slow, but whole in time
            connection.sendall(piece)
            time.sleep(HEADER_TIMEOUT_S / 5)
        assert connection.recv(4096).startswith(b"HTTP/1.1 200")
    with httpx.Client(base_url=hostile_server.base_url) as client:  # keep-alive reuses the connection
        assert [client.get("/health").status_code for _ in range(3)] == [200, 200, 200]


def test_an_idle_websocket_is_closed_with_1001(hostile_server):
    with connect_as(hostile_server.base_url, "10.14.1.1") as socket_:
        started = time.monotonic()
        with pytest.raises(ConnectionClosed) as closed:
            socket_.recv(timeout=WS_IDLE_TIMEOUT_S + 10)
    assert closed.value.rcvd is not None and closed.value.rcvd.code == 1001 and "idle" in closed.value.rcvd.reason
    assert time.monotonic() - started >= WS_IDLE_TIMEOUT_S * 0.8


def test_a_websocket_is_not_idle_while_it_is_spoken_to(hostile_server):
    text = " ".join(f"Sentence number {n} keeps the engine and the socket busy." for n in range(40))
    with connect_as(hostile_server.base_url, "10.14.1.2") as socket_:
        socket_.send(json.dumps({"text": text}))
        # Silent for twice the idle timeout, and reading nothing: the utterance is still being made or
        # waits to be sent (its audio is far more than the socket buffers), so the socket is not idle.
        time.sleep(2 * WS_IDLE_TIMEOUT_S)
        while (event := receive_event(socket_))["type"] not in ("done", "error"):
            pass
        assert event["type"] == "done"
        with pytest.raises(ConnectionClosed) as closed:  # then idle: closed
            socket_.recv(timeout=WS_IDLE_TIMEOUT_S + 10)
    assert closed.value.rcvd.code == 1001


def test_one_caller_may_hold_only_so_many_websockets(hostile_server):
    base, caller = hostile_server.base_url, "10.14.2.1"
    held = [connect_as(base, caller) for _ in range(WS_MAX_PER_CALLER)]
    try:
        with connect_as(base, caller) as refused:
            error = receive_event(refused, 10)["error"]
            assert error["type"] == "rate_limit_exceeded" and error["code"] == "too_many_sockets"
            with pytest.raises(ConnectionClosed) as closed:
                refused.recv(timeout=30)
            assert closed.value.rcvd.code == 1008
        assert [speak(socket_)["type"] for socket_ in held] == ["done"] * WS_MAX_PER_CALLER  # they still work
        with connect_as(base, "10.14.2.2") as other_caller:  # and another caller is not affected
            assert speak(other_caller)["type"] == "done"
        held.pop().close()

        def another_is_accepted() -> bool:  # the server sees the close a moment later
            with connect_as(base, caller) as socket_:
                socket_.send(json.dumps({"text": "One more."}))
                return receive_event(socket_)["type"] == "started"

        deadline = time.monotonic() + 10
        while not another_is_accepted():
            assert time.monotonic() < deadline, "a closed socket still counts against its caller"
            time.sleep(0.1)
    finally:
        for socket_ in held:
            socket_.close()
