"""Launch (or attach to) a tensor-parallel worker group and run prompts on it.

A local group is `python -m torch.distributed.run --standalone --nproc_per_node=N worker.py`:
torch's own launcher starts, watches and stops the ranks. We only keep the launcher process,
its log, and an authenticated connection to rank 0. The group stays up between prompts;
"Unload Models", a new model or mesh, a failure and ComfyUI's exit stop it.
"""

from __future__ import annotations

import atexit
import dataclasses
import os
import re
import signal
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
from . import channel

WORKER_SCRIPT = Path(__file__).with_name("worker.py")
POLL_SECONDS = 0.25
TERMINATE_GRACE_SECONDS = 15  # torchrun's own teardown of its ranks after SIGTERM


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


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
                        f"worker rank {fields.get('rank', '?')} failed (exit code {fields.get('exitcode', '?')}): "
                        f"{cause}"))
    if entries:
        return "; ".join(text for _, text in sorted(entries, key=lambda entry: entry[0]))
    tail = [line for line in log_text.splitlines() if line.strip()][-5:]
    return "the worker group stopped: " + (" | ".join(tail) or "no output")


def tpu_launch_env(world_size: int) -> dict:
    """What TorchTPU's launcher set-up adds for `world_size` ranks on this host (slice-builder
    addresses, topology), without leaving it in ComfyUI's own environment."""
    import torch

    device_module.note_experimental("torch.tpu.distributed.set_tpu_launch_env",
                                    "it prepares the environment of locally launched TP workers")
    before = dict(os.environ)
    torch.tpu.distributed.set_tpu_launch_env(nproc_per_node=world_size)
    added = {name: value for name, value in os.environ.items() if before.get(name) != value}
    os.environ.clear()
    os.environ.update(before)
    return added


class WorkerGroup:
    def __init__(self, conn, address: str, world_size: int, process: subprocess.Popen | None = None,
                 log_path: Path | None = None):
        self.conn, self.address, self.world_size = conn, address, world_size
        self.process, self.log_path = process, log_path

    # --- start
    @classmethod
    def launch(cls, world_size: int, device: device_module.DeviceInfo, on_progress=None) -> "WorkerGroup":
        """Start the ranks and connect to rank 0; `on_progress` is called while waiting and may raise to cancel."""
        launch_timeout = settings.get("TPU_DIFFUSERS_LAUNCH_TIMEOUT")
        key, port = channel.new_key(), _free_port()
        env = {**os.environ, **(tpu_launch_env(world_size) if device.type == "tpu" else {}),
               channel.KEY_ENV: key, "PYTHONUNBUFFERED": "1"}
        address = f"127.0.0.1:{port}"
        command = [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc_per_node={world_size}",
                   "--max_restarts=0", str(WORKER_SCRIPT), "--control", address]
        # A new file only this user can read (the log holds tracebacks and paths), never one planted in
        # the shared temp folder under a name guessed in advance.
        log_fd, log_name = tempfile.mkstemp(prefix="tpu_diffusers_workers_", suffix=".log")
        log_path = Path(log_name)
        with os.fdopen(log_fd, "w") as log:
            # Own session: a Ctrl-C meant for ComfyUI does not tear through the ranks mid-step; they
            # leave when ComfyUI's connection closes, whichever way ComfyUI ends.
            process = subprocess.Popen(command, env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
        deadline = time.monotonic() + launch_timeout
        while True:
            if process.poll() is not None:
                raise WorkerGroupError(root_cause(log_path.read_text(errors="replace")))
            try:
                if on_progress:
                    on_progress(0, 1, f"starting {world_size} workers")
                conn = channel.connect(address, key, timeout=5)
                break
            except ConnectionError:
                if time.monotonic() > deadline:
                    cls(None, address, world_size, process, log_path).stop()
                    raise WorkerGroupError(f"the {world_size} workers did not start within {launch_timeout:.0f}s "
                                           f"(log: {log_path}).") from None
                time.sleep(0.5)
            except BaseException:  # cancelled while starting: take the half-started group down
                cls(None, address, world_size, process, log_path).stop(timeout=0)
                raise
        group = cls(conn, address, world_size, process, log_path)
        group._hello()
        return group

    @classmethod
    def attach(cls, spec: MeshSpec) -> "WorkerGroup":
        key = spec.key or settings.get(channel.KEY_ENV)
        if not key:
            raise UserInputError(f"attach needs the workers' key: type it in the node, or set ${channel.KEY_ENV} "
                                 "for the ComfyUI process (keeps it out of shared workflows).")
        conn = channel.connect(spec.address, key, timeout=30)
        group = cls(conn, spec.address, 0)
        group.world_size = group._hello()
        if spec.chips and spec.chips != group.world_size:
            group.stop()
            raise UserInputError(f"the workers at {spec.address} are {group.world_size} ranks, the mesh asks for "
                                 f"{spec.chips}; set chips to {group.world_size} (or 0).")
        return group

    def _hello(self) -> int:
        channel.send(self.conn, {"op": "hello"})
        message, _ = self._next_message()
        return message["world_size"]

    # --- use
    def alive(self) -> bool:
        return self.conn is not None and (self.process is None or self.process.poll() is None)

    def pids(self) -> list[int]:
        return [self.process.pid] if self.process else []

    def generate(self, handle, request, on_progress=None, preview=None):
        """Run one prompt on every rank; returns (images [B,H,W,C] float32 tensor, rank 0's info dict). With a
        PreviewSpec, rank 0 sends each step's preview (RGB bytes) with its progress message."""
        import numpy as np
        import torch

        channel.send(self.conn, {"op": "generate", "handle": handle.to_wire(), "request": dataclasses.asdict(request),
                                 "preview": preview and preview.to_wire()})
        interrupted = None
        while True:
            message, payload = self._next_message()
            op = message["op"]
            if op == "progress" and on_progress and interrupted is None:
                try:
                    image = () if payload is None else \
                        (np.frombuffer(payload, dtype=np.uint8).reshape(message["preview_shape"]),)
                    on_progress(message["done"], message["total"], message["what"], *image)
                except BaseException as e:  # ComfyUI's interrupt: stop every rank at the next step
                    interrupted = e
                    channel.send(self.conn, {"op": "cancel"})
            elif op == "cancelled":
                raise interrupted or WorkerGroupError("the workers cancelled the run")
            elif op == "result":
                if interrupted is not None:
                    raise interrupted
                images = np.frombuffer(payload, dtype=np.float32).reshape(message["shape"])
                return torch.from_numpy(images.copy()), message["info"]

    def unload(self) -> None:
        channel.send(self.conn, {"op": "unload"})
        self._next_message(silence_timeout=60)

    def _next_message(self, silence_timeout: float | None = None):
        """The next message from rank 0 (by default waiting up to TPU_DIFFUSERS_WORKER_SILENCE_TIMEOUT). A
        request that failed on every rank raises its error; a dead or silent group becomes a
        WorkerGroupError, never a hang."""
        if silence_timeout is None:
            silence_timeout = settings.get("TPU_DIFFUSERS_WORKER_SILENCE_TIMEOUT")
        quiet_since = time.monotonic()
        while True:
            try:
                received = channel.receive(self.conn, timeout=POLL_SECONDS)
            except (EOFError, OSError):
                raise WorkerGroupError(self._failure()) from None
            if received is not None:
                if received[0]["op"] == "error":
                    raise errors.from_wire(received[0]["kind"], received[0]["message"])
                return received
            if self.process is not None and self.process.poll() is not None:
                raise WorkerGroupError(self._failure())
            if time.monotonic() - quiet_since > silence_timeout:
                self.stop()
                raise WorkerGroupError(f"the workers sent nothing for {silence_timeout:.0f}s and were stopped "
                                       f"as hung (log: {self.log_path}).")

    def _failure(self) -> str:
        """Why the group stopped: torchrun's report once it has stopped the other ranks."""
        self.conn = None
        if self.process is None:
            return "the connection to the attached workers was lost (a worker died, or the network dropped)."
        try:
            self.process.wait(30)
        except subprocess.TimeoutExpired:
            self.stop()
        return root_cause(self.log_path.read_text(errors="replace")) + f" (log: {self.log_path})"

    # --- stop
    def stop(self, timeout: float = 20) -> None:
        if self.conn is not None:
            try:
                if self.process is not None:  # ours to end; attached workers wait for the next client
                    channel.send(self.conn, {"op": "shutdown"})
                self.conn.close()
            except OSError:
                pass
            self.conn = None
        if self.process is not None and self.process.poll() is None:
            try:
                self.process.wait(timeout)
            except subprocess.TimeoutExpired:
                self._terminate()

    def _terminate(self) -> None:
        """torchrun starts each rank in a session of its own, so killing the launcher's process group
        would orphan them: SIGTERM lets torchrun stop its ranks; whatever is left is killed by pid."""
        ranks = _children(self.process.pid)
        self.process.terminate()
        try:
            self.process.wait(TERMINATE_GRACE_SECONDS)
        except subprocess.TimeoutExpired:
            os.killpg(self.process.pid, signal.SIGKILL)
            self.process.wait()
        for pid in ranks:
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass


def _children(pid: int) -> list[int]:
    """The direct children of a process (Linux /proc; the ranks of a torchrun launcher)."""
    found = []
    for task in Path(f"/proc/{pid}/task").glob("*"):
        try:
            found += map(int, (task / "children").read_text().split())
        except OSError:
            pass
    return found


class WorkerGroups:
    """The one worker group this process keeps warm; a different model or mesh replaces it."""

    def __init__(self):
        self.current: WorkerGroup | None = None
        self.key = None
        atexit.register(self.stop)

    def get(self, handle, device: device_module.DeviceInfo, world_size: int,
            on_progress=None) -> tuple[WorkerGroup, bool]:
        key = (handle.mesh, world_size, handle.load_key(device))
        if self.current is not None and self.key == key and self.current.alive():
            return self.current, False
        self.stop()
        if handle.mesh.workers is Workers.ATTACH:
            self.current = WorkerGroup.attach(handle.mesh)
        else:
            self.current = WorkerGroup.launch(world_size, device, on_progress)
        self.key = key
        return self.current, True

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
