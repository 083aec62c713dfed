"""What the reliability tests share besides the session server (conftest.py): how their servers
are set up, and the counts the suite reports.

Servers here are made safe to abuse:
- their compile caches are folders of their own (TORCHINDUCTOR_CACHE_DIR and TPU_DIFFUSERS_COMPILE_CACHE
  under the test's temporary folder), so a test may damage them;
- RLIMIT_DATA caps the memory a server (and what it starts) may take: a request for far too much
  fails inside the server instead of taking the machine's memory, guard in the pack or not;
- a test-only node (TestImageOfShape, custom_nodes/test_image_of_shape.py) makes IMAGE tensors of any
  channel count, which no ComfyUI node makes (e.g. 2 channels), for the Sampler's image checks.
"""

from __future__ import annotations

from pathlib import Path

from comfy_host import ComfyServer
from serving import comfy_server
from tpu_diffusers_runtime.distributed import channel

DATA_LIMIT_BYTES = 4 * 2**30  # ComfyUI with the tiny models needs ~1.5 GiB
WORKERS_KEY = channel.new_key()  # the key of every worker group the tests start to attach to (attach_env)

# An IMAGE of any shape, filled with 0.5: ComfyUI's own nodes make 3 channels (4 with Join Image with Alpha).
IMAGE_OF_SHAPE_NODE = """
import torch


class TestImageOfShape:
    CATEGORY = "testing"
    RETURN_TYPES = ("IMAGE",)
    FUNCTION = "make"

    @classmethod
    def INPUT_TYPES(cls):
        size = {"default": 64, "min": 1, "max": 4096}
        return {"required": {"channels": ("INT", {"default": 3, "min": 1, "max": 16}), "width": ("INT", size),
                             "height": ("INT", size), "batch_size": ("INT", {"default": 1, "min": 1, "max": 64})}}

    def make(self, channels, width, height, batch_size):
        return (torch.full((batch_size, height, width, channels), 0.5),)


NODE_CLASS_MAPPINGS = {"TestImageOfShape": TestImageOfShape}
"""

REPORT: dict[str, object] = {}  # printed at the end of the run (conftest.pytest_terminal_summary)


def count(name: str, by: int = 1) -> None:
    REPORT[name] = REPORT.get(name, 0) + by


def cache_env(base: Path) -> dict[str, str]:
    """Compile caches of a server's own, under `base` (the pack keeps a TORCHINDUCTOR_CACHE_DIR it is given)."""
    return {"TPU_DIFFUSERS_COMPILE_CACHE": str(base / "compile_cache"),
            "TORCHINDUCTOR_CACHE_DIR": str(base / "compile_cache" / "inductor")}


def inductor_cache(server: ComfyServer) -> Path:
    return Path(server.extra_env["TORCHINDUCTOR_CACHE_DIR"])


def attach_env() -> dict[str, str]:
    """What a user of attach sets for ComfyUI: the workers' key (start_staying_workers(key=WORKERS_KEY)) and
    their address, here any port of loopback, where the tests start their workers."""
    return {channel.KEY_ENV: WORKERS_KEY, channel.ATTACH_ALLOW_ENV: "127.0.0.1"}


def start_server(base: Path, tiny_dir: Path, env: dict | None = None) -> ComfyServer:
    """A started server that sees every tiny model and the broken ones, with its own compile caches
    (unless `env` names others), attach to WORKERS_KEY's workers on loopback allowed, the memory cap and
    the test-only image node."""
    (base / "custom_nodes").mkdir(parents=True, exist_ok=True)
    (base / "custom_nodes" / "test_image_of_shape.py").write_text(IMAGE_OF_SHAPE_NODE)
    server = comfy_server(base, tiny_dir, broken_models=True, env={**cache_env(base), **attach_env(), **(env or {})},
                          data_limit_bytes=DATA_LIMIT_BYTES)
    return server.start()
