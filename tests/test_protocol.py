"""The control channel's messages on a socket pair: framing, bounds, versions, the bounded handshake."""

from __future__ import annotations

import os
import socket
import struct
import threading
import time
import tracemalloc
from multiprocessing.connection import Connection

import pytest

from tpu_diffusers_runtime.distributed import channel, protocol
from tpu_diffusers_runtime.distributed.group import WorkerGroup, reply_bytes
from tpu_diffusers_runtime.errors import WorkerGroupError
from tpu_diffusers_runtime.handle import PipelineHandle
from tpu_diffusers_runtime.tasks import SampleRequest


@pytest.fixture
def pair():
    a, b = socket.socketpair()
    yield a, b
    a.close()
    b.close()


def test_messages_carry_binary_payloads_in_order(pair):
    a, b = pair
    protocol.send(a, {"op": "result", "shape": [1, 2]}, [b"\x00\x01", b"", bytes(range(256))])
    protocol.send(a, {"op": "progress"})
    assert protocol.receive(b, timeout=5) == ({"op": "result", "shape": [1, 2]}, [b"\x00\x01", b"", bytes(range(256))])
    assert protocol.receive(b, timeout=5) == ({"op": "progress"}, [])
    assert protocol.receive(b, timeout=0.05) is None


def test_the_frames_are_multiprocessing_connections_own(pair):
    """A pack from before protocol 1 reads our hello with Connection.recv_bytes and finds its has_payload."""
    a, b = pair
    protocol.send(a, protocol.hello())
    old_side = Connection(b.detach())
    assert b'"has_payload": false' in old_side.recv_bytes()
    old_side.close()


@pytest.mark.parametrize("frame, why", [
    (struct.pack("!i", 8) + b"not json", "is not JSON"),
    (struct.pack("!i", 2) + b"[]", "not a JSON object with an 'op'"),
    (struct.pack("!i", 30) + b'{"op": "x", "payloads": [9]}\x00a', r"announces payloads of \[9\] bytes but carries 1"),
    (struct.pack("!i", protocol.MAX_JSON_BYTES + 10) + b"{" + b" " * (protocol.MAX_JSON_BYTES + 9),
     "JSON part is over"),
])
def test_an_unusable_message_is_refused_and_the_stream_stays_in_step(pair, frame, why):
    a, b = pair
    threading.Thread(target=lambda: (a.sendall(frame), protocol.send(a, {"op": "next"})), daemon=True).start()
    with pytest.raises(protocol.MessageRefused, match=why):
        protocol.receive(b, timeout=5)
    assert protocol.receive(b, timeout=5) == ({"op": "next"}, [])


def test_a_message_over_the_bound_is_skipped_unread(pair):
    a, b = pair
    protocol.send(a, {"op": "big"}, [b"x" * 5000])
    protocol.send(a, {"op": "next"})
    with pytest.raises(protocol.MessageRefused, match="over the bound of 1000 bytes"):
        protocol.receive(b, timeout=5, max_bytes=1000)
    assert protocol.receive(b, timeout=5) == ({"op": "next"}, [])


def test_a_result_larger_than_the_request_can_make_is_refused_before_it_is_allocated(pair):
    """A peer that has the key (workers, or whatever listens at an attach address) answers a 64x64 prompt
    with a 64 MiB result: ComfyUI's side refuses the frame without holding it in memory."""
    comfyui_side, rank_0 = pair
    request = SampleRequest(prompt="a cat", width=64, height=64, batch_size=1)
    handle = PipelineHandle.of(source="/models/flux", model_class="FluxPipeline")
    images = 1365  # 64 MiB of 64x64 images; made before tracing, so only what the receiving side allocates counts
    oversized = bytes(images * request.output_bytes())

    def answer():
        protocol.receive(rank_0, timeout=30)  # the generate command
        try:
            protocol.send(rank_0, {"op": "result", "info": {}, "shape": [images, 64, 64, 3]}, [oversized])
        except OSError:  # the refusing side may close before the last bytes went out
            pass

    peer = threading.Thread(target=answer, daemon=True)
    peer.start()
    group = WorkerGroup(channel.Channel(comfyui_side, "peer"), "peer", world_size=1)
    tracemalloc.start()
    try:
        with pytest.raises(WorkerGroupError, match=f"over the bound of {reply_bytes(request) + 2**20 + 1} bytes"):
            group.generate(handle, {}, request)  # the peer reads no plan
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    peer.join(timeout=30)
    assert peak < 8 * 2**20, f"{peak / 2**20:.1f} MiB allocated for a refused frame"
    assert group.conn is None  # the group that sent it is dropped


@pytest.mark.parametrize("reply, expected", [
    ({"op": "hello", "world_size": 2, "device": "cpu"}, "no protocol version (a pack from before protocol 1)"),
    ({"op": "hello", "protocol": protocol.PROTOCOL_VERSION + 1, "pack": "7.0", "world_size": 2},
     f"protocol {protocol.PROTOCOL_VERSION + 1} (pack 7.0)"),
])
def test_workers_of_another_protocol_are_refused_naming_both_versions(reply, expected):
    with pytest.raises(WorkerGroupError, match="protocol mismatch") as error:
        protocol.check_hello_reply(reply, "10.0.0.2:7777")
    assert f"the workers at 10.0.0.2:7777: {expected}" in str(error.value)
    assert f"protocol {protocol.PROTOCOL_VERSION} (pack {protocol.PACK_VERSION})" in str(error.value)


def test_a_silent_peer_is_dropped_within_the_handshake_bound(monkeypatch):
    monkeypatch.setattr(channel, "HANDSHAKE_SECONDS", 0.5)
    server = channel.listen("127.0.0.1:0")
    silent = socket.create_connection(server.getsockname())
    started = time.monotonic()
    try:
        with pytest.raises(OSError):
            channel.accept(server, channel.new_key())
        assert time.monotonic() - started < 5
    finally:
        silent.close()
        server.close()


def test_a_socket_whose_descriptor_is_above_1023_is_read(pair):
    """A long-lived ComfyUI holds many files: select.select refuses descriptors from 1024 on."""
    a, b = pair
    high = socket.socket(fileno=os.dup2(b.fileno(), max(1500, b.fileno() + 1)))
    try:
        protocol.send(a, {"op": "progress"}, [b"\x01"])
        assert protocol.receive(high, timeout=5) == ({"op": "progress"}, [b"\x01"])
        assert protocol.receive(high, timeout=0.05) is None
    finally:
        high.close()


def test_both_ends_of_a_channel_probe_a_silent_peer_with_tcp_keepalive():
    """A client whose host vanishes without closing the connection fails rank 0's read instead of holding it."""
    server = channel.listen("127.0.0.1:0")
    key, address = channel.new_key(), "127.0.0.1:%d" % server.getsockname()[1]
    accepted = []
    thread = threading.Thread(target=lambda: accepted.append(channel.accept(server, key)), daemon=True)
    thread.start()
    client = channel.connect(address, key, timeout=10)
    thread.join(10)
    try:
        for end in (accepted[0].sock, client.sock):
            assert end.getsockopt(socket.SOL_SOCKET, socket.SO_KEEPALIVE) == 1
            for name, value in channel.KEEPALIVE.items():
                assert end.getsockopt(socket.IPPROTO_TCP, getattr(socket, name)) == value
    finally:
        client.close()
        accepted[0].close()
        server.close()


def test_a_sound_track_comes_back_from_rank_0_as_comfyuis_audio(pair):
    """Two replicas' videos and sound tracks (real tensors), as rank 0's reply (RankWorker.result) makes them and
    the group (WorkerGroup.generate) reads them over the socket: the frames and each video's waveform in batch
    order, bit for bit, with the sample rate, as ComfyUI's AUDIO; the reply's bound has room for the track."""
    import numpy as np
    import torch

    from tpu_diffusers_runtime.worker_program import RankWorker

    request = SampleRequest(prompt="a cat", width=32, height=32, batch_size=3, frames=5)
    rate, samples = 24_000, 24_000 * 5 // 24 + 7  # a track rounded up past the frames' 5/24 s, as diffusers' are
    generator = torch.Generator().manual_seed(0)
    frames = torch.rand(3 * 5, 32, 32, 3, generator=generator)
    waveforms = torch.rand(3, 2, samples, generator=generator) * 2 - 1
    info = {"sample_seconds": 1.0, "compile_seconds": 0.0, "compiled_now": None, "notes": [],
            "sample_rate": rate, "audio_seconds": samples / rate}
    gathered = [{"rank": replica, "replica": replica, "pid": 100 + replica, "steps": 3, "tokens": 8, "bytes": 1,
                 "fraction": 0.0, "info": info, "images": frames[5 * first:5 * (first + count)].numpy(),
                 "audio": waveforms[first:first + count].numpy(), "sample_rate": rate}
                for replica, (first, count) in enumerate([(0, 2), (2, 1)])]
    message, payloads = RankWorker.result(gathered, [(0, 2), (2, 1)], cp=1, tp=1)
    assert sum(len(payload) for payload in payloads) <= reply_bytes(request)
    comfyui_side, rank_0 = pair

    def answer():
        protocol.receive(rank_0, timeout=30)  # the generate command
        protocol.send(rank_0, message, payloads)

    peer = threading.Thread(target=answer, daemon=True)
    peer.start()
    group = WorkerGroup(channel.Channel(comfyui_side, "peer"), "peer", world_size=2)
    images, info, latent, mask, audio = group.generate(
        PipelineHandle.of(source="/models/video", model_class="AVideoPipeline"), {}, request)
    peer.join(timeout=30)
    assert torch.equal(images, frames) and latent is None and mask is None
    assert audio["sample_rate"] == rate and audio["waveform"].dtype == torch.float32
    assert torch.equal(audio["waveform"], waveforms)
    assert (info["sample_rate"], info["replica_images"]) == (rate, [2, 1])


def test_a_sound_track_without_sound_is_none_in_the_reply(pair):
    """A video without sound (or images) sends no audio payload: the group reads None, not an empty track."""
    import numpy as np

    from tpu_diffusers_runtime.worker_program import RankWorker

    info = {"sample_seconds": 1.0, "compile_seconds": 0.0, "compiled_now": None, "notes": []}
    entry = {"rank": 0, "replica": 0, "pid": 1, "steps": 1, "tokens": 1, "bytes": 1, "fraction": 0.0, "info": info,
             "images": np.zeros((5, 16, 16, 3), np.float32)}
    message, payloads = RankWorker.result([entry], [(0, 1)], cp=1, tp=1)
    assert (message["audio_shape"], message["sample_rate"], len(payloads)) == (None, 0, 1)
