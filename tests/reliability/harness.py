"""What the reliability tests share besides the session server (conftest.py): how their servers
are set up, and the counts the suite reports.

Servers here are made safe to abuse:
- their compile caches are folders of their own (TORCHINDUCTOR_CACHE_DIR and TPU_DIFFUSERS_COMPILE_CACHE
  under the test's temporary folder), so a test may damage them;
- RLIMIT_DATA caps the memory a server (and what it starts) may take: a request for far too much
  fails inside the server instead of taking the machine's memory, guard in the pack or not.
"""

from __future__ import annotations

from pathlib import Path

from comfy_host import ComfyServer
from serving import comfy_server

DATA_LIMIT_BYTES = 4 * 2**30  # ComfyUI with the tiny models needs ~1.5 GiB

REPORT: dict[str, object] = {}  # printed at the end of the run (conftest.pytest_terminal_summary)


def count(name: str, by: int = 1) -> None:
    REPORT[name] = REPORT.get(name, 0) + by


def cache_env(base: Path) -> dict[str, str]:
    """Compile caches of a server's own, under `base` (the pack keeps a TORCHINDUCTOR_CACHE_DIR it is given)."""
    return {"TPU_DIFFUSERS_COMPILE_CACHE": str(base / "compile_cache"),
            "TORCHINDUCTOR_CACHE_DIR": str(base / "compile_cache" / "inductor")}


def inductor_cache(server: ComfyServer) -> Path:
    return Path(server.extra_env["TORCHINDUCTOR_CACHE_DIR"])


def start_server(base: Path, tiny_dir: Path, env: dict | None = None) -> ComfyServer:
    """A started server that sees every tiny model and the broken ones, with its own compile caches
    (unless `env` names others) and the memory cap."""
    server = comfy_server(base, tiny_dir, broken_models=True, env={**cache_env(base), **(env or {})},
                          data_limit_bytes=DATA_LIMIT_BYTES)
    return server.start()
