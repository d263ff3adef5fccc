"""HTTP/1.1 over a bare socket, for tests about the connection itself (head limits, keep-alive,
when the server closes): what an HTTP client library hides."""

from __future__ import annotations

import socket


def connect(port: int, timeout: float = 30) -> socket.socket:
    sock = socket.create_connection(("127.0.0.1", port), timeout=timeout)
    sock.settimeout(timeout)
    return sock


def read_response(sock: socket.socket) -> bytes:
    """One whole HTTP response (head and Content-Length body): TCP may deliver it in pieces."""
    data = b""
    while b"\r\n\r\n" not in data:
        chunk = sock.recv(65536)
        assert chunk, f"connection closed mid-response: {data[:200]!r}"
        data += chunk
    body = data.partition(b"\r\n\r\n")[2]
    length = int(header(data, b"content-length") or 0)
    while len(body) < length:
        chunk = sock.recv(65536)
        assert chunk, "connection closed mid-body"
        body += chunk
        data += chunk
    return data


def header(response: bytes, name: bytes) -> bytes | None:
    """The value of header `name` (lower case) in a response's head, or None."""
    head = response.partition(b"\r\n\r\n")[0]
    for line in head.split(b"\r\n")[1:]:
        key, _, value = line.partition(b":")
        if key.strip().lower() == name:
            return value.strip()
    return None


def read_all(sock: socket.socket) -> bytes:
    """Everything until the server closes the connection (a reset counts as closed)."""
    chunks = []
    try:
        while chunk := sock.recv(65536):
            chunks.append(chunk)
    except ConnectionResetError:
        pass
    return b"".join(chunks)
