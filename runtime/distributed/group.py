"""Launch (or attach to) a worker group and run prompts on it.

A local group is launcher.py running torch's own launcher (torchrun: `--nproc_per_node=N worker_program.py`, its
rendezvous a file, see local_rendezvous), which starts, watches and stops the ranks; every socket of the
group listens on loopback only. We only keep the launcher process, a private folder with its log and
rendezvous file, and an authenticated connection to rank 0. The group stays up between prompts
and across models (the ranks' pipeline cache evicts the old model); "Unload Models", another number
of ranks, a failure and ComfyUI's exit stop it. Every process of it ends when ComfyUI is gone
(lifeline.py); we signal only the launcher, our own child, never a pid read from elsewhere.
"""

from __future__ import annotations

import atexit
import dataclasses
import math
import os
import re
import shutil
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from .. import device as device_module
from .. import errors, settings
from ..errors import UserInputError, WorkerGroupError
from ..specs import MeshSpec, Workers
from . import channel, lifeline, protocol

# the worker program lives above the engine it runs (this package is below it): launched by path
WORKER_SCRIPT = Path(__file__).parent.parent / "worker_program.py"
LAUNCHER_SCRIPT = Path(__file__).with_name("launcher.py")
POLL_SECONDS = 0.1
QUIET_CHECK_SECONDS = 0.5  # while the workers send nothing, how often ComfyUI's Cancel is checked
# How long after a Cancel the workers have to answer it (they do at their next step or progress point); a group
# that has not answered by the next command is stopped then, and a new one launched.
CANCEL_ANSWER_SECONDS = 5.0
TERMINATE_GRACE_SECONDS = 15  # torchrun's own teardown of its ranks after SIGTERM
IFF_LOOPBACK = 0x8  # in /sys/class/net/<interface>/flags


def root_cause(log_text: str) -> str:
    """Which ranks failed and why, from torchrun's failure report (or the log's last lines).

    torchrun's "first observed failure" is often a rank that only saw its peer vanish (a
    connection reset inside a collective), so ranks that died of their own accord are listed
    first and torchrun's own SIGTERM teardown last.
    """
    report = log_text.rpartition("Failures:")[2]
    entries = []
    for block in re.split(r"^\[\d+\]:\s*$", report, flags=re.M)[1:]:
        block = block.split("=" * 20)[0].split("-" * 20)[0]
        fields = dict(re.findall(r"^\s*(rank|exitcode)\s*:\s*(.*?)\s*$", block, re.M))
        lines = [line.strip() for line in block.splitlines() if line.strip()]
        cause = lines[-1].removeprefix("traceback : ") if lines else ""
        entries.append((fields.get("exitcode", "").endswith("(SIGTERM)"),
                        f"worker rank {fields.get('rank', '?').split(' ')[0]} failed (exit code {fields.get('exitcode', '?')}): "
                        f"{cause}"))
    if entries:
        return "; ".join(text for _, text in sorted(entries, key=lambda entry: entry[0]))
    tail = [line for line in log_text.splitlines() if line.strip()][-5:]
    return "the worker group stopped: " + (" | ".join(tail) or "no output")


def local_rendezvous(folder: Path) -> list[str]:
    """torchrun's arguments for one host that opens no port to the network: the rendezvous is a file in the
    group's private folder (`--standalone` serves it as a TCP store on every interface), and the ranks learn
    MASTER_ADDR=127.0.0.1, so rank 0 serves the process group's store on loopback (worker.hosted_store)."""
    return ["--nnodes=1", "--rdzv-backend=c10d", f"--rdzv-endpoint={folder / 'rendezvous'}",
            "--rdzv-conf=store_type=file", "--rdzv-id=local", "--local-addr=127.0.0.1"]


def loopback_interface() -> str:
    """The name of the loopback network interface (Linux: `lo`), for GLOO_SOCKET_IFNAME."""
    for _, name in socket.if_nameindex():
        if int(Path(f"/sys/class/net/{name}/flags").read_text(), 16) & IFF_LOOPBACK:
            return name
    raise WorkerGroupError("this host has no loopback network interface, which a local worker group listens on.")


def launch_env(key: str) -> dict:
    """The environment for a local group: ComfyUI's own, plus the key, with TorchTPU's autoload as the
    user had it (ComfyUI's process keeps TorchTPU out, see device.keep_tpu_for_workers), and every listening
    socket on loopback: gloo's (and on CUDA NCCL's bootstrap) on the loopback interface, and no TCP store of
    torchrun's own (the ranks serve theirs, see local_rendezvous). A copy: ComfyUI's os.environ is never
    changed, as other threads read it."""
    loopback = loopback_interface()
    env = {**device_module.worker_environment(os.environ), channel.KEY_ENV: key, "PYTHONUNBUFFERED": "1",
           "GLOO_SOCKET_IFNAME": loopback, "NCCL_SOCKET_IFNAME": loopback, "TORCH_DISABLE_SHARE_RDZV_TCP_STORE": "1"}
    env.pop(lifeline.LAUNCHER_PID_ENV, None)
    return env


# A video's sound track at most: 2 channels of float32 at 48 kHz, at most 1/8 s per frame (every video model's frame
# rate is above 8 fps), and one second more per video for a track rounded up to whole audio latents.
AUDIO_BYTES_PER_SECOND = 2 * 4 * 48_000
AUDIO_BYTES_PER_FRAME = AUDIO_BYTES_PER_SECOND // 8


def reply_bytes(request) -> int:
    """The most a run's result brings back: its images, a LATENT of at most half a float32 per pixel (the
    widest latent, 128 channels per 16 x 16 pixels; others have fewer), 1/6 of the images' bytes, a MASK of one
    float32 per pixel, 1/3 of them, and for video a sound track (AUDIO_BYTES_PER_FRAME: a bound independent of the
    frames' size, as a small video's sound can outweigh its frames)."""
    images = request.output_bytes()
    per_video = request.frames * AUDIO_BYTES_PER_FRAME + AUDIO_BYTES_PER_SECOND if request.frames else 0
    audio = request.batch_size * per_video
    return images + images // 6 + images // 3 + audio


class WorkerGroup:
    def __init__(self, conn, address: str, world_size: int, process: subprocess.Popen | None = None,
                 folder: Path | None = None):
        self.conn, self.address, self.world_size = conn, address, world_size
        self.process, self.folder = process, folder  # folder: a launched group's private log and port file
        self.cancelled_at: float | None = None  # when a Cancel was sent that the workers have not answered yet

    @property
    def log_path(self) -> Path | None:
        return self.folder / "workers.log" if self.folder else None

    # --- start
    @classmethod
    def launch(cls, world_size: int, device: device_module.DeviceInfo, on_progress=None) -> "WorkerGroup":
        """Start the ranks and connect to rank 0; `on_progress` is called while waiting and may raise to cancel.

        Rank 0 binds a free loopback port itself and writes it to a file in a folder only this user can
        read (the log there holds tracebacks and paths), so no other process can take the port between
        choosing and binding it."""
        launch_timeout = settings.get("TPU_DIFFUSERS_LAUNCH_TIMEOUT")
        key = channel.new_key()
        folder = Path(tempfile.mkdtemp(prefix="tpu_diffusers_workers_"))
        port_file = folder / "control_port"
        command = [sys.executable, str(LAUNCHER_SCRIPT), "--parent", str(os.getpid()),
                   *(["--tpu"] if device.type == "tpu" else []), "--", *local_rendezvous(folder),
                   f"--nproc_per_node={world_size}", "--max_restarts=0", str(WORKER_SCRIPT),
                   "--control", "127.0.0.1:0", "--port-file", str(port_file)]
        with open(os.open(folder / "workers.log", os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600), "w") as log:
            # Own session: a Ctrl-C meant for ComfyUI does not tear through the ranks mid-step; they
            # leave when ComfyUI is gone (lifeline.py), whichever way ComfyUI ends.
            process = subprocess.Popen(command, env=launch_env(key), stdout=log, stderr=subprocess.STDOUT,
                                       start_new_session=True)
        group = cls(None, "", world_size, process, folder)
        deadline = time.monotonic() + launch_timeout
        try:
            while not port_file.exists():
                if process.poll() is not None:
                    raise WorkerGroupError(group._failure())
                if time.monotonic() > deadline:  # the except below takes the group down
                    raise WorkerGroupError(f"the {world_size} workers did not start within {launch_timeout:.0f}s "
                                           f"(log: {group.log_path}).")
                if on_progress:
                    on_progress(0, 1, f"starting {world_size} worker(s)")
                time.sleep(POLL_SECONDS)
            group.address = f"127.0.0.1:{int(port_file.read_text())}"
            group.conn = channel.connect(group.address, key, timeout=30)
            group._hello()
        except BaseException:  # cancelled or failed while starting: take the half-started group down
            group.stop(timeout=0)
            raise
        return group

    @classmethod
    def attach(cls, spec: MeshSpec) -> "WorkerGroup":
        """Connect to workers started elsewhere: only at an allowed address, only with this process's key."""
        key = channel.attach_key()
        channel.check_attach_address(spec.address)
        group = cls(channel.connect(spec.address, key, timeout=30), spec.address, 0)
        try:
            group.world_size = group._hello()
        except BaseException:
            group.stop()
            raise
        if spec.chips and spec.chips != group.world_size:
            group.stop()
            raise UserInputError(f"the workers at {spec.address} are {group.world_size} ranks, the mesh asks for "
                                 f"{spec.chips}; set chips to {group.world_size} (or 0).")
        return group

    def _hello(self) -> int:
        """Exchange versions; a group of another protocol is refused by name (protocol.mismatch)."""
        self._send(protocol.hello())
        message, _ = self._next_message(silence_timeout=30, errors_raise=False)
        return protocol.check_hello_reply(message, self.address)["world_size"]

    # --- use
    def alive(self) -> bool:
        return self.conn is not None and (self.process is None or self.process.poll() is None)

    def pids(self) -> list[int]:
        return [self.process.pid] if self.process else []

    def generate(self, handle, plan: dict, request, on_progress=None, preview=None):
        """Run one prompt on every rank, as `plan` (the request's plan, in its wire form) says; returns (images
        [B,H,W,C] float32 tensor, rank 0's info dict, the images' LATENT and MASK, and a video's AUDIO, each None
        for a family without one). With
        a PreviewSpec, rank 0 sends each step's preview (RGB bytes) with its progress message.

        ComfyUI's Cancel (`on_progress` raising) is checked also while the workers send nothing (a long load,
        a download, a compile: the last progress is reported again), passed on to them, and raised here at
        once; their answer is read before the next command (`answered`).

        No frame larger than the request's images (and the JSON beside them) is read: a preview, one image at
        latent size in uint8, is far smaller, so a peer cannot make this process allocate more than the
        request could bring back."""
        import numpy as np
        import torch

        request_data, arrays = request.to_wire()  # images and masks travel as binary payloads
        self._send({"op": "generate", "handle": handle.to_wire(), "plan": plan, "request": request_data,
                    "preview": preview and preview.to_wire()}, arrays)
        latest = (0, 1, "waiting for the workers")

        def report(*progress) -> None:
            if on_progress is None:
                return
            try:
                on_progress(*progress)
            except BaseException:  # ComfyUI's interrupt: every rank stops at its next step
                self._cancel()
                raise

        bound = reply_bytes(request) + protocol.MAX_JSON_BYTES + 1  # + the NUL between JSON and payloads
        while True:
            message, payloads = self._next_message(max_bytes=bound, on_quiet=lambda: report(*latest))
            op = message["op"]
            if op == "progress":
                latest = (message["done"], message["total"], message["what"])
                report(*latest, *(np.frombuffer(p, dtype=np.uint8).reshape(message["preview_shape"])
                                  for p in payloads))
            elif op == "cancelled":
                raise WorkerGroupError("the workers cancelled the run")
            elif op == "result":
                images = np.frombuffer(payloads[0], dtype=np.float32).reshape(message["shape"])  # no copy
                rest = iter(payloads[1:])  # the LATENT, the MASK, then the sound track, each where the run made one
                latent, mask, audio = (message.get(shape) and torch.from_numpy(
                    np.frombuffer(next(rest), dtype=np.float32).reshape(message[shape]))
                    for shape in ("latent_shape", "mask_shape", "audio_shape"))
                return (torch.from_numpy(images), message["info"], None if latent is None else {"samples": latent},
                        mask, None if audio is None else {"waveform": audio, "sample_rate": message["sample_rate"]})

    def _cancel(self) -> None:
        self.cancelled_at = time.monotonic()
        try:
            self.conn.send({"op": "cancel"})
        except OSError:  # the connection broke: the group is not alive(), the next run replaces it
            self.conn.close()
            self.conn = None

    def answered(self) -> bool:
        """Whether this (alive) group is free for the next command: no Cancel is owed an answer, or the answer
        (the cancelled run's last message, dropped here) came within CANCEL_ANSWER_SECONDS of the Cancel. A
        group that has not answered by then is stopped (a launched one at once), for the caller to replace."""
        while self.cancelled_at is not None:
            try:
                received = self.conn.receive(timeout=max(0.0, self.cancelled_at + CANCEL_ANSWER_SECONDS
                                                         - time.monotonic()))
            except (protocol.MessageRefused, EOFError, OSError):
                received = None
            if received is None:
                self.stop(timeout=0)
                return False
            if received[0]["op"] in ("cancelled", "result", "error"):
                self.cancelled_at = None
        return True

    def unload(self) -> None:
        if self.answered():
            self._send({"op": "unload"})
            self._next_message(silence_timeout=60)

    def _send(self, message: dict, payloads: list = ()) -> None:
        """A send that fails means the connection broke: a WorkerGroupError, so the group is dropped and the
        next run starts (or attaches) a new one."""
        try:
            self.conn.send(message, payloads)
        except OSError:
            raise WorkerGroupError(self._failure()) from None

    def _next_message(self, silence_timeout: float | None = None, errors_raise: bool = True,
                      max_bytes: int = protocol.MAX_JSON_BYTES, on_quiet=None):
        """The next message from rank 0 (by default waiting up to TPU_DIFFUSERS_WORKER_SILENCE_TIMEOUT), at
        most `max_bytes` long (by default a message without payloads). A request that failed on every rank
        raises its error (unless `errors_raise` is False); a dead or silent group, or one that sends more
        than asked for, becomes a WorkerGroupError, never a hang. `on_quiet` is called every
        QUIET_CHECK_SECONDS while nothing comes (it may raise: ComfyUI's Cancel)."""
        if silence_timeout is None:
            silence_timeout = settings.get("TPU_DIFFUSERS_WORKER_SILENCE_TIMEOUT")
        quiet_since = checked = time.monotonic()
        while True:
            try:
                received = self.conn.receive(timeout=POLL_SECONDS, max_bytes=max_bytes)
            except protocol.MessageRefused as e:
                self.stop()
                raise WorkerGroupError(f"the workers sent a message this side cannot use ({e}); the group was "
                                       "stopped.") from None
            except (EOFError, OSError):
                raise WorkerGroupError(self._failure()) from None
            if received is not None:
                if received[0]["op"] == "error" and errors_raise:
                    raise errors.from_wire(received[0]["kind"], received[0]["message"])
                return received
            if self.process is not None and self.process.poll() is not None:
                raise WorkerGroupError(self._failure())
            if on_quiet is not None and time.monotonic() - checked >= QUIET_CHECK_SECONDS:
                on_quiet()
                checked = time.monotonic()
            if time.monotonic() - quiet_since > silence_timeout:
                self.stop()
                raise WorkerGroupError(f"the workers sent nothing for {silence_timeout:.0f}s and were stopped "
                                       f"as hung (log: {self.log_path}).")

    def _failure(self) -> str:
        """Why the group stopped: torchrun's report once it has stopped the other ranks. The log is kept
        (it is named in the message); a group that stops cleanly removes its folder."""
        if self.conn is not None:
            self.conn.close()
            self.conn = None
        if self.process is None:
            return "the connection to the attached workers was lost (a worker died, or the network dropped)."
        try:
            self.process.wait(30)
        except subprocess.TimeoutExpired:
            self._terminate()
        log_path, self.folder = self.log_path, None
        return root_cause(log_path.read_text(errors="replace")) + f" (log: {log_path})"

    # --- stop
    def stop(self, timeout: float = 20) -> None:
        if self.conn is not None:
            try:
                if self.process is not None:  # ours to end; attached workers wait for the next client
                    self.conn.send({"op": "shutdown"})
            except OSError:
                pass
            self.conn.close()
            self.conn = None
        if self.process is not None and self.process.poll() is None:
            try:
                self.process.wait(timeout)
            except subprocess.TimeoutExpired:
                self._terminate()
        if self.folder is not None and (self.process is None or self.process.poll() is not None):
            shutil.rmtree(self.folder, ignore_errors=True)
            self.folder = None

    def _terminate(self) -> None:
        """SIGTERM lets torchrun stop its ranks; a launcher that does not end in time is killed. Its ranks
        then end by themselves (lifeline.py): no pid but our own child's is ever signalled."""
        self.process.terminate()
        try:
            self.process.wait(TERMINATE_GRACE_SECONDS)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()


@dataclasses.dataclass(frozen=True)
class GroupUse:
    """How a run got its worker group, for the run info."""

    group: WorkerGroup
    started: bool  # launched or attached for this run
    note: str


class WorkerGroups:
    """The one worker group this process keeps warm. Another number of ranks (a single-chip run after
    a 4-chip TP one, say) relaunches it; another mesh shape over the same ranks reuses it (the ranks
    build each shape's mesh when a command needs it), and so does another model."""

    def __init__(self):
        self.current: WorkerGroup | None = None
        self.key = None
        self.shape = None
        atexit.register(self.stop)

    def get(self, spec: MeshSpec, shape: tuple[int, ...], device: device_module.DeviceInfo,
            on_progress=None) -> GroupUse:
        world_size = math.prod(shape)
        key = (spec.workers, spec.address, world_size)
        same = self.current is not None and self.key == key and self.current.alive()
        if same and self.current.answered():
            note = (f"worker group reused: {world_size} rank(s)" if shape == self.shape else
                    f"worker group reshaped: the same {world_size} rank(s), mesh {self.shape} -> {shape} (nothing "
                    "relaunched)")
            self.shape = shape
            return GroupUse(self.current, False, note)
        before = self.current.world_size if self.current is not None and self.current.alive() else None
        started = time.perf_counter()
        self.stop()
        stopped = time.perf_counter()
        if spec.workers is Workers.ATTACH:
            self.current = WorkerGroup.attach(spec)
            note = f"worker group attached: {self.current.world_size} rank(s) at {spec.address}"
        else:
            self.current = WorkerGroup.launch(world_size, device, on_progress)
            note = f"worker group launched: {world_size} rank(s) in {time.perf_counter() - stopped:.1f}s"
            if before is not None:
                note = (f"worker group relaunched: {before} -> {world_size} rank(s) (stopping the old one took "
                        f"{stopped - started:.1f}s, starting the new one {time.perf_counter() - stopped:.1f}s)")
        if same:  # `answered` stopped it
            note += f"; the old one did not answer Cancel within {CANCEL_ANSWER_SECONDS:.0f}s"
        self.key, self.shape = key, shape
        return GroupUse(self.current, True, note)

    def holds_local_workers(self) -> bool:
        return self.current is not None and self.current.process is not None

    def stop(self) -> int:
        """Stop a launched group (attached workers stay up and only drop their pipelines)."""
        if self.current is None:
            return 0
        group, self.current = self.current, None
        if group.process is None and group.alive():
            try:
                group.unload()
            except WorkerGroupError:
                pass
        group.stop()
        return 1
