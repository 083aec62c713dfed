"""The control channel between the ComfyUI process and rank 0 of a worker group.

Built on `multiprocessing.connection`: its HMAC challenge with a per-launch random key runs
before a single message is read, so an unauthenticated peer gets nothing. Messages are JSON
(and raw bytes for images), never pickles. Rank 0 binds to loopback unless told another
address (attach mode across hosts). Every wait on the ComfyUI side has a timeout.
"""

from __future__ import annotations

import json
import secrets
import threading
from multiprocessing import AuthenticationError
from multiprocessing.connection import Client, Connection, Listener

from ..errors import UserInputError
from ..settings import KEY_BYTES, KEY_ENV, decode_key  # noqa: F401  (KEY_ENV: the channel's variable)


def new_key() -> str:
    return secrets.token_hex(KEY_BYTES)


def parse_address(address: str) -> tuple[str, int]:
    host, sep, port = address.rpartition(":")
    if not sep or not host or not port.isdigit():
        raise UserInputError(f"address '{address}' is not host:port (e.g. 10.0.0.2:7777).")
    return host.strip("[]"), int(port)


def listen(address: str, key: str) -> Listener:
    return Listener(parse_address(address), authkey=decode_key(key))


def connect(address: str, key: str, timeout: float) -> Connection:
    """Connect and authenticate within `timeout` seconds.

    Each cause of failure has its own error: a malformed address or key is a UserInputError before
    anything is sent; nothing listening, no answer in time or a dropped handshake is a ConnectionError
    (worth retrying while workers start); a key the workers refuse is a UserInputError.
    """
    target, authkey = parse_address(address), decode_key(key)
    result: dict = {}
    lock = threading.Lock()

    def attempt():
        try:
            conn = Client(target, authkey=authkey)
        except (OSError, EOFError, AuthenticationError) as e:
            result["error"] = e
            return
        with lock:
            if result.get("abandoned"):
                conn.close()  # too late: the caller has moved on
            else:
                result["conn"] = conn

    thread = threading.Thread(target=attempt, daemon=True)  # Client() itself has no timeout
    thread.start()
    thread.join(timeout)
    with lock:
        result["abandoned"] = "conn" not in result
    if "conn" in result:
        return result["conn"]
    error = result.get("error")
    if isinstance(error, AuthenticationError):
        raise UserInputError(f"the workers at {address} refused the key: check the key they printed at start.")
    if isinstance(error, ConnectionRefusedError):
        raise ConnectionError(f"nothing listens at {address} (connection refused): start the workers, or check "
                              "the host and port they printed.")
    if error is None:
        raise ConnectionError(f"no answer from {address} within {timeout:.0f}s: is it the workers' control "
                              "channel, and are they busy with another client?")
    if isinstance(error, EOFError):
        raise ConnectionError(f"{address} closed the connection during the handshake: is it the workers' "
                              "control channel?")
    raise ConnectionError(f"cannot reach {address} ({error}).")


def send(conn: Connection, message: dict, payload: bytes | None = None) -> None:
    conn.send_bytes(json.dumps({**message, "has_payload": payload is not None}).encode())
    if payload is not None:
        conn.send_bytes(payload)


def receive(conn: Connection, timeout: float | None = None) -> tuple[dict, bytes | None] | None:
    """The next message and its payload; None if nothing came within `timeout` seconds."""
    if timeout is not None and not conn.poll(timeout):
        return None
    message = json.loads(conn.recv_bytes())
    payload = conn.recv_bytes() if message.pop("has_payload") else None
    return message, payload
