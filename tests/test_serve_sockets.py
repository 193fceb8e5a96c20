"""Raw-socket helpers of the tests that attack a live ``stealkit serve`` (deadlines, caps, early answers)."""

from __future__ import annotations

import contextlib
import socket

GUARD_S = 60  # a socket's own timeout: only so that a failing test ends; no test asserts a duration


def connect(url: str, source: str = "127.0.0.1") -> socket.socket:
    """A TCP connection to the server at ``url`` from the loopback address ``source``."""
    host, port = url.removeprefix("http://").split(":")
    return socket.create_connection((host, int(port)), timeout=GUARD_S, source_address=(source, 0))


def closed_by_server(s: socket.socket) -> bool:
    """Read until the server closes the connection (True) or the guard timeout passes (False)."""
    try:
        while s.recv(65536):
            pass
        return True
    except ConnectionResetError:
        return True
    except TimeoutError:
        return False


def early(method: str, path: str, key: str | None = None) -> bytes:
    """Headers that promise a 6,000-byte body the server answers without reading."""
    auth_line = b"" if key is None else b"Authorization: Bearer " + key.encode() + b"\r\n"
    return (f"{method} {path} HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n".encode() + auth_line
            + b"Content-Length: 6000\r\n\r\n")


def answer(s: socket.socket) -> bytes:
    """One whole response (head and its Content-Length body), read off the socket; returns the head."""
    data = b""
    while b"\r\n\r\n" not in data:
        chunk = s.recv(65536)
        assert chunk, data
        data += chunk
    head, _, body = data.partition(b"\r\n\r\n")
    assert head.startswith(b"HTTP/1.1 "), head[:80]
    length = next(int(line.split(b":")[1]) for line in head.lower().split(b"\r\n")
                  if line.startswith(b"content-length:"))
    while len(body) < length:
        chunk = s.recv(65536)
        assert chunk, data
        body += chunk
    assert len(body) == length  # nothing more: the next request's answer is read by the next call
    return head


def answer_or_nothing(s: socket.socket, data: bytes) -> bytes | None:
    """Send ``data`` (the rest of a request) and return the answer's status (``b"200"``), or ``None`` when the
    server had closed the connection (refused or evicted: no answer ever comes)."""
    with contextlib.suppress(BrokenPipeError, ConnectionResetError):
        s.sendall(data)
    try:
        first = s.recv(65536)
    except ConnectionResetError:
        return None
    return first.split(b" ")[1] if first.startswith(b"HTTP/1.1 ") else None
