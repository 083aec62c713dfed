"""Process-wide settings that must be in the environment before torch starts.

TorchTPU reads its compile caches and XLA options once, when its backend initialises (during
`import torch` or the first `torch.device("tpu")`), so no node can change them later. ComfyUI
runs the pack's prestartup_script.py before it imports torch, which applies them there; a TP
worker applies them before its own `import torch` (a locally launched one inherits ComfyUI's).
Torch-free on purpose. A value already in the environment (the user's own) is never overwritten.
"""

from __future__ import annotations

import logging
import os
import sys

from . import settings
from .device import keep_tpu_for_workers, prepare_tpu_environment
from .errors import SettingError

log = logging.getLogger("tpu_diffusers")

# The pack's own variables.
# The cache root: a folder, or gs://bucket/path for TorchTPU's tier 3 (read and checked by settings.py).
COMPILE_CACHE_ENV = "TPU_DIFFUSERS_COMPILE_CACHE"
XLA_LEVEL_ENV = "TPU_DIFFUSERS_XLA_OPTIMIZATION_LEVEL"  # O0 (compiles fastest) .. O3; unset: TorchTPU's default
APPLIED_ENV = "TPU_DIFFUSERS_SETTINGS_APPLIED"  # "before torch" / "after torch": when apply() ran (workers inherit it)

# What torch and TorchTPU read.
INDUCTOR_CACHE = "TORCHINDUCTOR_CACHE_DIR"
TPU_TIER2_CACHE = "TORCH_TPU_TIER2_COMPILATION_CACHE"  # a name: TorchTPU keeps it in /dev/shm/torch_tpu_cache/<name>
TPU_TIER3_CACHE = "TORCH_TPU_TIER3_COMPILATION_CACHE_ROOT"  # a folder or gs://, shared by the hosts that can reach it
TPU_TIER3_LOCAL_BACKUP = "TORCH_TPU_INTERNAL_TIER3_COMPILATION_CACHE_LOCAL_BACKUP_TASK"  # the docs set it with a folder
TPU_XLA_OPTIONS = "TORCH_TPU_INTERNAL_XLA_OPTIONS"

TIER2_NAME = "tpu_diffusers"


def default_root(user_directory: str | None = None) -> str:
    """The cache root: inside ComfyUI's user folder; without ComfyUI (a TP worker started by hand) under ~/.cache."""
    if user_directory:
        return os.path.join(user_directory, "tpu_diffusers", "compile_cache")
    return os.path.join(os.path.expanduser("~"), ".cache", "tpu_diffusers", "compile_cache")


def is_remote(path: str) -> bool:
    return path.startswith("gs://")


def wanted_settings(root: str) -> dict[str, str]:
    """The variables the pack sets, for the cache root `root` unless TPU_DIFFUSERS_COMPILE_CACHE names another.

    A gs:// root is TorchTPU's fleet-wide tier-3 cache, passed through untouched: one host compiles,
    every host of a slice reuses. Inductor needs a local folder, so it stays under `root` then.
    """
    chosen = _setting_or(COMPILE_CACHE_ENV, root, f"The compile cache stays in {root}.")
    local = os.path.abspath(root if is_remote(chosen) else chosen)
    wanted = {INDUCTOR_CACHE: os.path.join(local, "inductor"),
              TPU_TIER2_CACHE: TIER2_NAME,
              TPU_TIER3_CACHE: chosen if is_remote(chosen) else os.path.join(local, "tpu")}
    if not is_remote(os.environ.get(TPU_TIER3_CACHE) or wanted[TPU_TIER3_CACHE]):
        wanted[TPU_TIER3_LOCAL_BACKUP] = "1"
    level = _setting_or(XLA_LEVEL_ENV, None, "TorchTPU's default optimisation level is used.")
    if level:
        wanted[TPU_XLA_OPTIONS] = f"xla_optimization_level={level}"
    return wanted


def _setting_or(name: str, fallback, consequence: str):
    """A pack setting, or `fallback` with the reason in the log: the prestartup script must never fail."""
    try:
        return settings.get(name) or fallback
    except SettingError as e:
        log.error("TPU Diffusers: %s %s", e, consequence)
        return fallback


def apply(root: str) -> dict[str, str]:
    """Put the pack's settings into this process's environment, keeping any the user set, and say so
    in the log. Returns the effective values. Call before `import torch`."""
    prepare_tpu_environment()
    effective = {}
    for name, value in wanted_settings(root).items():
        effective[name] = os.environ.setdefault(name, value)
    for name in (INDUCTOR_CACHE, TPU_TIER3_CACHE):
        if not is_remote(effective[name]):
            try:
                os.makedirs(effective[name], exist_ok=True)
            except OSError as e:
                log.warning("TPU Diffusers: the compile cache folder %s cannot be created (%s); compiled "
                            "graphs will not persist. Set %s to a writable folder.", effective[name], e,
                            COMPILE_CACHE_ENV)
    when = "after torch" if "torch" in sys.modules else "before torch"
    os.environ[APPLIED_ENV] = when
    facts = ", ".join(f"{name}={value}" for name, value in effective.items())
    if when == "before torch":
        log.info("TPU Diffusers: process settings applied before torch was imported: %s", facts)
    else:
        log.warning("TPU Diffusers: process settings applied after torch was imported, so TorchTPU may not "
                    "use them (it reads them once, at start): %s", facts)
    return effective


def compile_cache_settings() -> dict[str, str]:
    """Where this process's compiled artifacts persist and whether the pack's settings were applied in time."""
    return {"inductor": os.environ.get(INDUCTOR_CACHE, ""), "tpu_tier3": os.environ.get(TPU_TIER3_CACHE, ""),
            "tpu_tier2": os.environ.get(TPU_TIER2_CACHE, ""), "xla_options": os.environ.get(TPU_XLA_OPTIONS, ""),
            "applied": os.environ.get(APPLIED_ENV, "no")}


def keep_tpu_out_of_comfyui() -> None:
    """ComfyUI's process only (its prestartup script): with runs on a TPU in worker processes, torch
    here must not load TorchTPU (device.keep_tpu_for_workers)."""
    keep_tpu_for_workers(_setting_or("TPU_DIFFUSERS_WORKER_PROCESS", "tpu", "Runs on a TPU go to worker processes."))
