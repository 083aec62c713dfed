"""The control channel between the ComfyUI process and rank 0 of a worker group.

The handshake is `multiprocessing.connection`'s HMAC challenge with a per-launch random key, both
ways, before a single message is read, so an unauthenticated peer gets nothing; it is bounded in
time (a kernel receive/send timeout on the socket), so a peer that connects and stays silent is
dropped after HANDSHAKE_SECONDS instead of holding rank 0. After it, messages follow protocol.py:
JSON with binary payloads, bounded in size, never pickles. Rank 0 binds to loopback unless told
another address (attach mode across hosts).
"""

from __future__ import annotations

import os
import secrets
import socket
import struct
import time
from multiprocessing import AuthenticationError
from multiprocessing.connection import Connection, answer_challenge, deliver_challenge

from ..errors import UserInputError
from ..settings import KEY_BYTES, KEY_ENV, decode_key  # noqa: F401  (KEY_ENV: the channel's variable)
from . import protocol

HANDSHAKE_SECONDS = 5.0  # a peer that has not authenticated by then is dropped
# TCP keepalive on every channel: a peer whose host vanished without closing the connection (a VM stopped, a
# cable pulled) stops answering the kernel's probes and the connection fails after about 60 + 10 x 6 s of
# silence, so a rank 0 waiting between commands takes the next client instead of blocking forever.
KEEPALIVE = {"TCP_KEEPIDLE": 60, "TCP_KEEPINTVL": 10, "TCP_KEEPCNT": 6}


def new_key() -> str:
    return secrets.token_hex(KEY_BYTES)


def parse_address(address: str) -> tuple[str, int]:
    host, sep, port = address.rpartition(":")
    if not sep or not host or not port.isdigit():
        raise UserInputError(f"address '{address}' is not host:port (e.g. 10.0.0.2:7777).")
    return host.strip("[]"), int(port)


class Channel:
    """One authenticated connection: messages with payloads, both ways."""

    def __init__(self, sock: socket.socket, peer: str):
        self.sock, self.peer = sock, peer

    def send(self, message: dict, payloads: list[bytes] = ()) -> None:
        protocol.send(self.sock, message, payloads)

    def receive(self, timeout: float | None = None) -> tuple[dict, list[bytes]] | None:
        return protocol.receive(self.sock, timeout)

    def close(self) -> None:
        self.sock.close()


def _kernel_timeouts(sock: socket.socket, seconds: float) -> None:
    """Bound each blocking read and write on the socket (0: no bound). The stdlib handshake reads the
    file descriptor directly, so a Python-level socket timeout would not apply to it."""
    whole = int(seconds)
    value = struct.pack("ll", whole, int((seconds - whole) * 1e6))
    for option in (socket.SO_RCVTIMEO, socket.SO_SNDTIMEO):
        sock.setsockopt(socket.SOL_SOCKET, option, value)


def _keepalive(sock: socket.socket) -> None:
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_KEEPALIVE, 1)
    for name, value in KEEPALIVE.items():
        if hasattr(socket, name):  # Linux's names; other systems keep their defaults
            sock.setsockopt(socket.IPPROTO_TCP, getattr(socket, name), value)


def _handshake(sock: socket.socket, authkey: bytes, serving: bool, seconds: float) -> None:
    """Both sides prove they hold the key (the order is Listener.accept's and Client's)."""
    _kernel_timeouts(sock, max(seconds, 0.01))
    conn = Connection(os.dup(sock.fileno()))
    try:
        if serving:
            deliver_challenge(conn, authkey)
            answer_challenge(conn, authkey)
        else:
            answer_challenge(conn, authkey)
            deliver_challenge(conn, authkey)
    finally:
        conn.close()
        _kernel_timeouts(sock, 0)


def listen(address: str) -> socket.socket:
    """Rank 0's listening socket (port 0: the system picks a free one, read back with getsockname)."""
    return socket.create_server(parse_address(address), backlog=8)


def accept(server: socket.socket, key: str) -> Channel:
    """The next client that authenticates within HANDSHAKE_SECONDS. Raises (after closing the client's
    socket) AuthenticationError for a wrong key, EOFError for a peer that left, OSError for a silent one."""
    sock, peer = server.accept()
    try:
        _keepalive(sock)
        _handshake(sock, decode_key(key), serving=True, seconds=HANDSHAKE_SECONDS)
    except BaseException:
        sock.close()
        raise
    return Channel(sock, "%s:%d" % peer[:2])


def connect(address: str, key: str, timeout: float) -> Channel:
    """Connect and authenticate within `timeout` seconds.

    Each cause of failure has its own error: a malformed address or key is a UserInputError before
    anything is sent; nothing listening, no answer in time or a dropped handshake is a ConnectionError
    (worth retrying while workers start); a key the workers refuse is a UserInputError.
    """
    target, authkey = parse_address(address), decode_key(key)
    deadline = time.monotonic() + timeout
    try:
        sock = socket.create_connection(target, timeout=timeout)
    except ConnectionRefusedError:
        raise ConnectionError(f"nothing listens at {address} (connection refused): start the workers, or check "
                              "the host and port they printed.") from None
    except TimeoutError:
        raise ConnectionError(f"no answer from {address} within {timeout:.0f}s (it does not accept connections); "
                              "check the host and port.") from None
    except OSError as e:
        raise ConnectionError(f"cannot reach {address} ({e}).") from None
    sock.settimeout(None)
    try:
        _keepalive(sock)
        _handshake(sock, authkey, serving=False, seconds=deadline - time.monotonic())
    except AuthenticationError:
        sock.close()
        raise UserInputError(f"the workers at {address} refused the key: check the key they printed at start.") \
            from None
    except EOFError:
        sock.close()
        raise ConnectionError(f"{address} closed the connection during the handshake: is it the workers' "
                              "control channel?") from None
    except OSError:
        sock.close()
        raise ConnectionError(f"no answer from {address} within {timeout:.0f}s: is it the workers' control "
                              "channel, and are they busy with another client?") from None
    return Channel(sock, address)
