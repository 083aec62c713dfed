"""The messages between ComfyUI and rank 0 of a worker group: framing, bounds and versions.

A message is one frame in `multiprocessing.connection`'s wire format (a 4-byte big-endian length, or
-1 and an 8-byte length, then the body), so a worker of an older pack still reads our hello and is
refused by version instead of crashing. The body is JSON; a message with binary payloads (images,
masks, video frames, previews) lists their sizes in "payloads" and carries them after a NUL byte
(JSON text never holds a raw NUL). Every frame is bounded: one over the receiver's bound (the workers':
MAX_MESSAGE_BYTES; ComfyUI's: what the request it waits on can bring back) is skipped unread, never
allocated, so the stream stays in step and the workers answer with an error instead of a dead group
(ComfyUI's side drops a group that sends more than it asked for).

PROTOCOL_VERSION counts changes to the messages' meaning (ops and fields); the framing above stays.
Every hello carries it and the pack version, and each side refuses a peer of another protocol.
"""

from __future__ import annotations

import json
import os
import re
import selectors
import socket
import struct

from ..errors import WorkerGroupError

PROTOCOL_VERSION = 2  # 2: "generate" carries the request's plan (runtime/plan.py), so ranks plan nothing again
MAX_MESSAGE_BYTES = 16 * 2**30  # a batch of 64 float32 1024x1024 images is 0.8 GiB; video frames fit too
MAX_JSON_BYTES = 2**20
FRAME_STALL_SECONDS = 120.0  # inside a frame, the longest wait for the next bytes before the peer is dropped
_DISCARD_CHUNK = 2**20


def _pack_version() -> str:
    """The version in the pack's pyproject.toml (the runtime folder sits beside it)."""
    path = os.path.join(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))),
                        "pyproject.toml")
    try:
        with open(path) as f:
            found = re.search(r'^version\s*=\s*"([^"]+)"', f.read(), re.M)
    except OSError:
        found = None
    return found.group(1) if found else "unknown"


PACK_VERSION = _pack_version()


class MessageRefused(Exception):
    """A whole frame was read (the stream is still in step) but cannot be used: too large, not JSON,
    payload sizes that do not add up. The receiver answers with an error and reads on."""


# --- frames
def send(sock: socket.socket, message: dict, payloads: list[bytes] = ()) -> None:
    body = json.dumps({**message, "payloads": [len(p) for p in payloads]} if payloads else message).encode()
    parts = [body, *((b"\0", *payloads) if payloads else ())]
    size = sum(len(p) for p in parts)
    header = struct.pack("!i", size) if size <= 0x7FFFFFFF else struct.pack("!iQ", -1, size)
    sock.sendall(header + body if not payloads else header)
    if payloads:
        for part in parts:
            sock.sendall(part)


def wait_readable(sock: socket.socket, timeout: float | None) -> bool:
    """Whether bytes (or the end of the stream) are ready within `timeout` seconds (None: wait for good).
    A selector, not select.select, which refuses file descriptors from 1024 on (a long-lived ComfyUI has them)."""
    with selectors.DefaultSelector() as selector:
        selector.register(sock, selectors.EVENT_READ)
        return bool(selector.select(timeout))


def receive(sock: socket.socket, timeout: float | None = None,
            max_bytes: int = MAX_MESSAGE_BYTES) -> tuple[dict, list[memoryview]] | None:
    """The next message and its payloads (views of one writable buffer, so images become arrays without a
    copy); None if none began within `timeout` seconds. A frame over `max_bytes` (the caller's bound: what
    the request it waits on can bring) is refused before its buffer is allocated. Raises EOFError when the
    peer closed, OSError when it stalled inside a frame, MessageRefused for an unusable frame."""
    if not wait_readable(sock, timeout):
        return None
    sock.settimeout(FRAME_STALL_SECONDS)
    try:
        (size,) = struct.unpack("!i", _read(sock, 4))
        if size == -1:
            (size,) = struct.unpack("!Q", _read(sock, 8))
        if size < 0 or size > max_bytes:
            _discard(sock, max(size, 0))
            raise MessageRefused(f"a message of {size} bytes is over the bound of {max_bytes} bytes")
        head = _read_until_nul(sock, min(size, MAX_JSON_BYTES + 1))
        if len(head) > MAX_JSON_BYTES:
            _discard(sock, size - len(head))
            raise MessageRefused(f"a message's JSON part is over {MAX_JSON_BYTES} bytes")
        rest = _read(sock, size - len(head)) if size > len(head) else bytearray()
    finally:
        sock.settimeout(None)
    try:
        message = json.loads(bytes(head).rstrip(b"\0"))
    except ValueError as e:
        raise MessageRefused(f"a message is not JSON ({e})") from None
    if not isinstance(message, dict) or not isinstance(message.get("op"), str):
        raise MessageRefused("a message is not a JSON object with an 'op'")
    sizes = message.pop("payloads", [])
    if not isinstance(sizes, list) or not all(isinstance(n, int) and n >= 0 for n in sizes) or sum(sizes) != len(rest):
        raise MessageRefused(f"a message announces payloads of {sizes} bytes but carries {len(rest)}")
    payloads, start, view = [], 0, memoryview(rest)
    for n in sizes:
        payloads.append(view[start:start + n])
        start += n
    return message, payloads


def _read(sock: socket.socket, n: int) -> bytearray:
    buffer = bytearray(n)
    view, got = memoryview(buffer), 0
    while got < n:
        count = sock.recv_into(view[got:])
        if not count:
            raise EOFError("the peer closed the connection")
        got += count
    return buffer


def _read_until_nul(sock: socket.socket, limit: int) -> bytes:
    """The JSON part and its NUL (if payloads follow), reading at most `limit` bytes, never past the NUL."""
    head = bytearray()
    while len(head) < limit:
        chunk = sock.recv(min(limit - len(head), 65536), socket.MSG_PEEK)
        if not chunk:
            raise EOFError("the peer closed the connection")
        end = chunk.find(b"\0")
        take = len(chunk) if end < 0 else end + 1
        head += _read(sock, take)
        if end >= 0:
            break
    return bytes(head)


def _discard(sock: socket.socket, n: int) -> None:
    while n:
        n -= len(_read(sock, min(n, _DISCARD_CHUNK)))


# --- hello
def hello() -> dict:
    """The client's first message. has_payload is what workers of packs before protocol 1 read, so
    they answer (and are refused by version) instead of failing on a missing field."""
    return {"op": "hello", "protocol": PROTOCOL_VERSION, "pack": PACK_VERSION, "has_payload": False}


def hello_reply(world_size: int, device: str) -> dict:
    return {"op": "hello", "protocol": PROTOCOL_VERSION, "pack": PACK_VERSION, "world_size": world_size,
            "device": device, "has_payload": False}


def mismatch(peer: dict, who: str, me: str) -> str | None:
    """Why a hello from `who` (e.g. "the workers at host:port") cannot be served by `me`; None if it can."""
    theirs = peer.get("protocol")
    if theirs == PROTOCOL_VERSION:
        return None
    described = (f"protocol {theirs} (pack {peer.get('pack', 'unknown')})" if theirs is not None
                 else "no protocol version (a pack from before protocol 1)")
    return (f"protocol mismatch: {who}: {described}; {me}: protocol {PROTOCOL_VERSION} (pack {PACK_VERSION}). "
            "Start the workers from the same version of TPU Diffusers as ComfyUI's (update the older checkout, "
            "e.g. git pull in both, then restart the workers).")


def refusal(problem: str, world_size: int, device: str) -> dict:
    """The workers' answer to a hello of another protocol: an error (what any client shows) that also
    carries their own versions, so a client of this protocol or later words the refusal itself."""
    return {**hello_reply(world_size, device), "op": "error", "kind": "WorkerGroupError", "message": problem}


def check_hello_reply(reply: dict, address: str) -> dict:
    """The workers' hello (or refusal) as this side sees it; raises WorkerGroupError naming both versions."""
    problem = mismatch(reply, f"the workers at {address}", "ComfyUI's pack here")
    if problem:
        raise WorkerGroupError(problem)
    if reply["op"] == "error":  # refused for another reason than the protocol
        raise WorkerGroupError(reply.get("message", "the workers refused the hello"))
    return reply
