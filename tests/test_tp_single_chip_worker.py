"""Single-chip runs in a worker process (TPU_DIFFUSERS_WORKER_PROCESS=always on the CPU, what `tpu` does on a
TPU): the same images and run info as in this process, the group of one rank kept warm, reshaped into a
TP group when a TP Mesh comes, and the control channel's guards against peers and other versions."""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
import torch

from processes import alive_after, free_port, other_version_checkout, start_staying_workers, stop_workers
from test_tensor_parallel import engine, handle_for, request  # noqa: F401  (engine: the fixture)
from tpu_diffusers_runtime.distributed import channel, protocol
from tpu_diffusers_runtime.distributed.group import WORKER_SCRIPT
from tpu_diffusers_runtime.engine import Engine
from tpu_diffusers_runtime.errors import WorkerGroupError
from tpu_diffusers_runtime.specs import MeshSpec, Workers

PACK = Path(__file__).resolve().parents[1]


def test_a_single_chip_run_in_a_worker_equals_this_process_and_stays_warm(tiny, engine, monkeypatch):
    handle = handle_for(tiny, "flux1-schnell")
    here = Engine().generate(handle, request(batch_size=2))
    monkeypatch.setenv("TPU_DIFFUSERS_WORKER_PROCESS", "always")
    first = engine.generate(handle, request(batch_size=2))
    torch.testing.assert_close(first.images, here.images, atol=0, rtol=0)
    assert first.info.world_size == 1 and first.info.loaded and first.info.task == here.info.task
    assert any(note.startswith("worker group launched: 1 rank(s)") for note in first.info.notes), first.info.notes
    assert any(note.startswith("ran in a worker process (pid") for note in first.info.notes)
    assert "mesh:" not in first.info.summary()  # a group of one is not a mesh to the user
    second = engine.generate(handle, request(batch_size=2, seed=6))
    assert second.info.loaded is False and second.info.worker_pids == first.info.worker_pids
    assert "worker group reused: 1 rank(s)" in second.info.notes
    # A TP Mesh next: the chips go to a new group of two ranks, said in the run info.
    tp = engine.generate(handle.replace(mesh=MeshSpec(chips=2)), request())
    assert tp.info.world_size == 2
    assert any(note.startswith("worker group relaunched: 1 -> 2 rank(s)") for note in tp.info.notes), tp.info.notes
    assert alive_after(first.info.worker_pids[:1], timeout=30) == []


def test_a_killed_single_chip_worker_fails_the_run_clearly_and_the_next_run_relaunches(tiny, engine, monkeypatch):
    monkeypatch.setenv("TPU_DIFFUSERS_WORKER_PROCESS", "always")
    handle = handle_for(tiny, "flux1-schnell")
    pids = engine.generate(handle, request()).info.worker_pids  # launcher, rank 0

    def kill_rank(done, total, what, *preview):
        if what == "sampling" and done == 1:
            os.kill(pids[1], signal.SIGKILL)

    with pytest.raises(WorkerGroupError, match="worker rank 0 failed"):
        engine.generate(handle, request(steps=50), on_progress=kill_rank)
    assert alive_after(pids, timeout=30) == []
    again = engine.generate(handle, request())
    assert again.info.loaded and not set(again.info.worker_pids) & set(pids)


def allow_attach(monkeypatch, address: str, key: str) -> None:
    """What the user of attach sets for the ComfyUI process: the workers' key and their address."""
    monkeypatch.setenv(channel.KEY_ENV, key)
    monkeypatch.setenv(channel.ATTACH_ALLOW_ENV, address)


@contextlib.contextmanager
def held_by_another_process(path: Path):
    """A write lease on `path` (fcntl F_SETLEASE, what a file server takes for a client's oplock): another
    process's open of the file waits until the lease is let go, or for the kernel's lease-break-time (45 s by
    default). Yields a function that tells whether an open is waiting now."""
    previous = signal.signal(signal.SIGIO, signal.SIG_IGN)  # the holder is told of each waiting open by SIGIO
    fd = os.open(path, os.O_RDONLY)
    try:
        fcntl.fcntl(fd, fcntl.F_SETLEASE, fcntl.F_WRLCK)
        yield lambda: fcntl.fcntl(fd, fcntl.F_GETLEASE) != fcntl.F_WRLCK  # a break is pending
    finally:
        os.close(fd)  # lets the lease go
        signal.signal(signal.SIGIO, previous)


class Interrupted(Exception):
    """What ComfyUI's progress callback raises once Cancel was pressed."""


def test_cancel_while_the_workers_send_nothing_returns_at_once_and_the_next_prompt_runs(tiny, engine, monkeypatch,
                                                                                      tmp_path):
    """The worker's load waits on a file another process holds, so it sends nothing: Cancel returns within 2 s
    all the same. The group cannot answer the Cancel; the next prompt stops it and runs on a new one."""
    monkeypatch.setenv("TPU_DIFFUSERS_WORKER_PROCESS", "always")
    first = engine.generate(handle_for(tiny, "flux1-schnell"), request())  # a warm group: its launch is not timed
    model = shutil.copytree(tiny("flux1-schnell"), tmp_path / "tiny-flux1-schnell")
    pressed = []
    with held_by_another_process(model / "scheduler" / "scheduler_config.json") as open_waiting:
        def press_cancel_once_the_load_waits():
            deadline = time.monotonic() + 120
            while not open_waiting() and time.monotonic() < deadline:
                time.sleep(0.05)
            pressed.append(time.monotonic())

        def comfy_progress(done, total, what, *preview):
            if pressed:
                raise Interrupted

        presser = threading.Thread(target=press_cancel_once_the_load_waits, daemon=True)
        presser.start()
        with pytest.raises(Interrupted):
            engine.generate(handle_for(lambda _: str(model), "flux1-schnell"), request(), on_progress=comfy_progress)
        returned = time.monotonic()
        presser.join()
        assert returned - pressed[0] < 2
        again = engine.generate(handle_for(tiny, "flux1-schnell"), request(seed=5))  # the load still waits
    assert again.info.loaded and not set(again.info.worker_pids) & set(first.info.worker_pids)
    assert any("did not answer Cancel" in note for note in again.info.notes), again.info.notes
    assert alive_after(first.info.worker_pids, timeout=30) == []


@pytest.fixture
def staying_group(tmp_path, monkeypatch):
    """A 1-rank `--stay` group started as the README's attach section says, this process allowed to attach to
    it: (address, key, its log)."""
    process, address, key = start_staying_workers(WORKER_SCRIPT, tmp_path / "workers.log")
    allow_attach(monkeypatch, address, key)
    yield address, key, tmp_path / "workers.log"
    stop_workers(process)


def test_probes_silent_peers_garbage_and_bad_messages_do_not_stop_a_staying_group(tiny, engine, staying_group):
    address, key, log = staying_group
    host, port = channel.parse_address(address)
    socket.create_connection((host, port)).close()  # a port probe (nc -z, a health check)
    silent = socket.create_connection((host, port))  # connects and says nothing
    garbage = socket.create_connection((host, port))
    garbage.sendall(os.urandom(4096))
    started = time.monotonic()
    attached = engine.generate(handle_for(tiny, "flux1-schnell", mesh=MeshSpec(workers=Workers.ATTACH,
                                                                            address=address)), request())
    assert attached.info.world_size == 1
    assert time.monotonic() - started < 120  # the silent peer was dropped after the handshake bound
    engine.unload()  # detach
    # An authenticated client's unusable messages get error replies; the group stays up.
    client = channel.connect(address, key, timeout=30)
    client.sock.sendall(b"\x00\x00\x00\x08not json")
    reply, _ = client.receive(timeout=30)
    assert reply["op"] == "error" and "not JSON" in reply["message"]
    too_big = protocol.MAX_MESSAGE_BYTES + 1
    client.sock.sendall(b"\xff\xff\xff\xff" + too_big.to_bytes(8, "big") + b"x" * 1024)
    client.close()
    silent.close()
    garbage.close()
    again = engine.generate(handle_for(tiny, "flux1-schnell", mesh=MeshSpec(workers=Workers.ATTACH,
                                                                         address=address)), request())
    assert again.info.world_size == 1
    text = log.read_text()
    assert "refused a client that closed the connection during the handshake" in text
    assert f"did not complete the handshake within {channel.HANDSHAKE_SECONDS:.0f}s" in text


def test_a_client_of_another_protocol_is_refused_by_name_and_the_group_stays_up(tiny, engine, staying_group):
    address, key, _ = staying_group
    client = channel.connect(address, key, timeout=30)
    client.send({"op": "hello", "protocol": protocol.PROTOCOL_VERSION + 1, "pack": "9.9.9"})
    reply, _ = client.receive(timeout=30)
    assert reply["op"] == "error"
    assert f"protocol {protocol.PROTOCOL_VERSION + 1} (pack 9.9.9)" in reply["message"]
    assert f"protocol {protocol.PROTOCOL_VERSION} (pack {protocol.PACK_VERSION})" in reply["message"]
    client.close()
    mesh = MeshSpec(workers=Workers.ATTACH, address=address)
    assert engine.generate(handle_for(tiny, "flux1-schnell", mesh=mesh), request()).info.world_size == 1


def test_workers_of_another_pack_version_are_refused_with_both_versions(tiny, engine, tmp_path, monkeypatch):
    """Workers started from another checkout (here: a copy of this one with the next protocol)."""
    worker_script = other_version_checkout(PACK, tmp_path / "other_checkout", "9.0.0")
    key, port = channel.new_key(), free_port()
    allow_attach(monkeypatch, f"127.0.0.1:{port}", key)
    process = subprocess.Popen([sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=1",
                                str(worker_script), "--control", f"127.0.0.1:{port}", "--stay"],
                               env={**os.environ, channel.KEY_ENV: key}, stdout=subprocess.DEVNULL,
                               stderr=subprocess.DEVNULL, start_new_session=True)
    try:  # not start_staying_workers: it would wait for a hello these workers refuse
        mesh = MeshSpec(workers=Workers.ATTACH, address=f"127.0.0.1:{port}")
        deadline = time.monotonic() + 180
        while True:
            try:
                engine.generate(handle_for(tiny, "flux1-schnell", mesh=mesh), request())
                pytest.fail("workers of another protocol ran the prompt")
            except ConnectionError:
                assert process.poll() is None and time.monotonic() < deadline
                time.sleep(0.5)
            except WorkerGroupError as e:
                message = str(e)
                break
        assert f"the workers at 127.0.0.1:{port}: protocol {protocol.PROTOCOL_VERSION + 1} (pack 9.0.0)" in message
        assert f"ComfyUI's pack here: protocol {protocol.PROTOCOL_VERSION} (pack {protocol.PACK_VERSION})" in message
        assert "start the workers from the same version" in message.lower()
        assert process.poll() is None  # the workers stay up for a client of their own version
    finally:
        os.killpg(process.pid, signal.SIGTERM)
        process.wait(30)


def test_the_launch_leaves_comfyuis_environment_alone_and_removes_its_folder(tiny, engine, monkeypatch):
    monkeypatch.setenv("TPU_DIFFUSERS_WORKER_PROCESS", "always")
    before = dict(os.environ)
    engine.generate(handle_for(tiny, "flux1-schnell"), request())
    folder = engine.workers.current.folder
    assert folder.is_dir() and json.dumps(dict(os.environ), sort_keys=True) == json.dumps(before, sort_keys=True)
    engine.unload()
    assert not folder.exists()


def test_a_connection_that_broke_fails_the_run_as_a_dead_group_and_the_next_run_attaches_again(tiny, engine,
                                                                                              staying_group,
                                                                                              monkeypatch):
    address, key, _ = staying_group
    allow_attach(monkeypatch, address, key)
    handle = handle_for(tiny, "flux1-schnell", mesh=MeshSpec(workers=Workers.ATTACH, address=address))
    engine.generate(handle, request())
    engine.workers.current.conn.sock.shutdown(socket.SHUT_WR)  # this side's half of the connection is gone
    with pytest.raises(WorkerGroupError, match="the connection to the attached workers was lost"):
        engine.generate(handle, request())
    again = engine.generate(handle, request())
    assert any(note.startswith("worker group attached") for note in again.info.notes), again.info.notes
