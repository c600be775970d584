"""``sweep --address``: a Ray address checked while parsing, and reached within a bounded time.

``ray.init(address=...)`` against a port nobody listens on retries for minutes (its GCS client
waits out its own timeouts in C++, deaf to signals), and a malformed address ends in a
traceback. Here the address is parsed up front (``parse_address``, an argparse type) and, before
Ray is asked, a TCP connection and a gRPC handshake (Ray's GCS and its client server both speak
gRPC, over HTTP/2) must succeed within ``connect_timeout()`` seconds, or one line says what did not answer.
"""

from __future__ import annotations

import argparse
import ipaddress
import os
import re
import socket
from typing import NamedTuple

from ..errors import HisparseError

# Seconds to wait for a remote Ray to answer (TCP connect, then the gRPC handshake).
DEFAULT_TIMEOUT_S = 15.0
TIMEOUT_ENV = "HISPARSE_RAY_TIMEOUT"
CLIENT_PORT = 10001  # Ray client's default port (ray://host)
KEYWORDS = ("auto", "local")  # Ray finds a running instance / starts a new local one
_LABEL = re.compile(r"(?!-)[A-Za-z0-9-]{1,63}(?<!-)")


class Address(NamedTuple):
    """A remote Ray: ``scheme`` "" (the GCS, host:port) or "ray://" (Ray client)."""

    scheme: str
    host: str
    port: int


def _host_ok(host: str) -> bool:
    if host.startswith("[") and host.endswith("]"):
        try:
            return ipaddress.ip_address(host[1:-1]).version == 6
        except ValueError:
            return False
    if re.fullmatch(r"[0-9.]+", host):
        try:
            ipaddress.IPv4Address(host)
        except ValueError:
            return False
        return True
    return 0 < len(host) <= 253 and all(_LABEL.fullmatch(label) for label in host.split("."))


def split_address(text: str) -> Address | None:
    """The remote address in ``text`` (None for a keyword); ValueError saying what is wrong."""
    value = text.strip()
    if value in KEYWORDS:
        return None
    scheme = ""
    if "://" in value:
        scheme, _, value = value.partition("://")
        if scheme != "ray":
            raise ValueError(f"unknown scheme {scheme + '://'!r} (a Ray address is host:port or ray://host[:port])")
        scheme = "ray://"
    if value.startswith("["):  # [IPv6]:port
        host, _, rest = value.partition("]")
        host, port_text = host + "]", rest[1:] if rest.startswith(":") else rest
    else:
        host, _, port_text = value.rpartition(":") if ":" in value else (value, "", "")
    if port_text == "" and scheme:
        port_text = str(CLIENT_PORT)
    if port_text == "" or (":" in host and not host.startswith("[")):
        raise ValueError("expected host:port (e.g. 10.0.0.5:6379), ray://host[:port], auto or local "
                         "(an IPv6 address in brackets)")
    if not _host_ok(host):
        raise ValueError(f"{host!r} is not a host name or IP address")
    if not (port_text.isascii() and port_text.isdigit()) or not 1 <= int(port_text) <= 65535:
        raise ValueError(f"port {port_text!r} is not a number from 1 to 65535")
    return Address(scheme, host, int(port_text))


def parse_address(text: str) -> str:
    """An argparse type: a well-formed Ray address (not yet contacted)."""
    try:
        split_address(str(text))
    except ValueError as exc:
        raise argparse.ArgumentTypeError(f"{exc}; got {str(text)[:80]!r}") from None
    return str(text).strip()


def connect_timeout() -> float:
    """The bound on reaching a remote Ray: HISPARSE_RAY_TIMEOUT seconds, else 15."""
    raw = os.environ.get(TIMEOUT_ENV, "")
    try:
        value = float(raw)
    except ValueError:
        return DEFAULT_TIMEOUT_S
    return value if 0 < value < 3600 else DEFAULT_TIMEOUT_S


def check_reachable(text: str, timeout: float | None = None) -> None:
    """Raise one line unless the Ray at ``text`` accepts a connection and answers gRPC within
    ``timeout`` seconds (keywords are left to Ray: they name no remote end)."""
    address = split_address(text)
    if address is None:
        return
    limit = connect_timeout() if timeout is None else timeout
    where = f"--address {text}"
    host = address.host.strip("[]")
    try:
        with socket.create_connection((host, address.port), timeout=limit) as conn:
            answered = _speaks_http2(conn)
    except TimeoutError:
        raise HisparseError(f"{where}: no answer within {limit:g} s (is a Ray cluster running there? "
                            f"{TIMEOUT_ENV} sets the wait)") from None
    except OSError as exc:
        raise HisparseError(f"{where}: cannot connect ({exc.strerror or exc}); is a Ray cluster running there?") from None
    if not answered:
        raise HisparseError(f"{where}: something listens there but does not answer as Ray does (no gRPC "
                            "handshake)")


# HTTP/2's client preface and an empty SETTINGS frame: a gRPC server answers with its SETTINGS.
_PREFACE = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n" + bytes([0, 0, 0, 4, 0, 0, 0, 0, 0])
_SETTINGS = 4


def _speaks_http2(conn: socket.socket) -> bool:
    """Whether the server on ``conn`` answers the HTTP/2 preface with a SETTINGS frame (the
    socket's timeout bounds the wait: TimeoutError)."""
    conn.sendall(_PREFACE)
    head = b""
    while len(head) < 9:
        data = conn.recv(9 - len(head))
        if not data:
            return False
        head += data
    return head[3] == _SETTINGS
