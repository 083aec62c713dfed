"""The control channel between the ComfyUI process and rank 0 of a worker group.

The handshake is `multiprocessing.connection`'s HMAC challenge with a per-launch random key, both
ways, before a single message is read, so an unauthenticated peer gets nothing; it is bounded in
time (a kernel receive/send timeout on the socket), so a peer that connects and stays silent is
dropped after HANDSHAKE_SECONDS instead of holding rank 0. After it, messages follow protocol.py:
JSON with binary payloads, bounded in size, never pickles. Rank 0 binds to loopback unless told
another address (attach mode across hosts). Attach takes its key only from the environment and connects
only to an address the environment allows (attach_key, check_attach_address).
"""

from __future__ import annotations

import os
import secrets
import socket
import struct
import time
from multiprocessing import AuthenticationError
from multiprocessing.connection import Connection, answer_challenge, deliver_challenge

from .. import settings
from ..errors import UserInputError
from ..settings import ATTACH_ALLOW_ENV, KEY_BYTES, KEY_ENV, decode_key  # noqa: F401  (the channel's variables)
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


def attach_key() -> str:
    """The key for attached workers: $TPU_DIFFUSERS_CONTROL_KEY of this process, never a workflow's (a shared
    workflow would carry it to everyone it is shared with)."""
    key = settings.get(KEY_ENV)
    if not key:
        raise UserInputError(f"attach needs the workers' key: set ${KEY_ENV} for the ComfyUI process to the key "
                             "the workers printed (or start the workers with that same variable), then restart "
                             "ComfyUI.")
    return key


def check_attach_address(address: str) -> None:
    """Refuse an attach address that $TPU_DIFFUSERS_ATTACH_ALLOW does not list. A workflow names it, and whoever
    made the workflow may not be who runs it: the prompt, its input images and local paths go there. Loopback is
    not allowed by default either: any local user can listen on a loopback port and relay the handshake to the
    real workers (it proves the key, it does not bind the connection), reading every message after it."""
    host, port = parse_address(address)
    allowed = settings.get(ATTACH_ALLOW_ENV) or ()
    if (host.lower(), port) in allowed or (host.lower(), None) in allowed:
        return
    listed = ", ".join(_entry_text(*entry) for entry in allowed) or "nothing (it is unset)"
    raise UserInputError(f"address '{address}' is not in ${ATTACH_ALLOW_ENV}, so attach does not connect there: "
                         "a workflow chooses the address, and the prompt, its images and local paths would go to "
                         f"it. If these are your workers, add {address} to ${ATTACH_ALLOW_ENV} (comma-separated "
                         f"host:port or host) for the ComfyUI process and restart ComfyUI. It allows: {listed}.")


def _entry_text(host: str, port: int | None) -> str:
    host = f"[{host}]" if ":" in host else host
    return f"{host}:{port}" if port else host


class Channel:
    """One authenticated connection: messages with payloads, both ways."""

    def __init__(self, sock: socket.socket, peer: str):
        self.sock, self.peer = sock, peer

    def send(self, message: dict, payloads: list[bytes] = ()) -> None:
        protocol.send(self.sock, message, payloads)

    def receive(self, timeout: float | None = None,
                max_bytes: int = protocol.MAX_MESSAGE_BYTES) -> tuple[dict, list[bytes]] | None:
        return protocol.receive(self.sock, timeout, max_bytes)

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
