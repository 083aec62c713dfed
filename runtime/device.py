"""Which accelerator runs the pipelines, and what that implies.

One table row per device type (compile backend, process-group backend, default dtype,
whether fused eager exists). Detection goes through `torch.accelerator`: TorchTPU's
`torch.tpu.is_available()` and friends raise when called from user code.
"""

from __future__ import annotations

import dataclasses
import functools
import glob
import importlib.util
import logging
import os
import re
import sys

log = logging.getLogger("tpu_diffusers")

GOOGLE_PCI_VENDOR = "0x1ae0"
# The PCI device id of each TPU generation, as torch_tpu 0.2.0 lists them; other Google PCI devices (a gVNIC
# network card) are not chips.
TPU_KIND_BY_PCI_DEVICE = {"0x005e": "v4", "0x0062": "v5p", "0x0063": "v5e", "0x006f": "v6e", "0x0076": "v7"}
TPU_PCI_DEVICES = frozenset(TPU_KIND_BY_PCI_DEVICE)
# The ranks one host's TorchTPU launch environment can form, per generation: torch_tpu 0.2.0's
# `set_tpu_launch_env(nproc_per_node=n)` takes a topology from its table (_internal/utils/hardware.py) and raises
# "No TPU topology found for count: n" for any other n. tests/test_torch_tpu_contract.py compares this with the
# installed wheel's table.
TPU_WORLD_SIZES = {"v4": (1, 2, 4, 8), "v5p": (1, 2, 4, 8), "v5e": (1, 4, 8), "v6e": (1, 4, 8), "v7": (2, 4, 8)}
AUTOLOAD_ENV = "TORCH_DEVICE_BACKEND_AUTOLOAD"  # torch loads TorchTPU at `import torch` unless it is 0
# Set in ComfyUI's process when it keeps TorchTPU out (the TPU chips it found); never passed to workers.
TPU_IN_WORKERS_ENV = "TPU_DIFFUSERS_TPU_IN_WORKERS"
AUTOLOAD_WAS_ENV = "TPU_DIFFUSERS_AUTOLOAD_WAS"  # the user's own autoload value, given back to the workers


def tpu_chip_count() -> int:
    """TPU chips this host exposes, counted as torch_tpu's autoload counts them (a TPU PCI device
    reachable through VFIO), without loading TorchTPU."""
    return len(tpu_pci_models())


def tpu_pci_models() -> list[str]:
    """The PCI device id (TPU_PCI_DEVICES: its generation) of each TPU chip this host exposes."""
    models = []
    for device in glob.glob("/sys/bus/pci/devices/*"):
        try:
            with open(os.path.join(device, "vendor")) as f:
                vendor = f.read().strip().lower()
            with open(os.path.join(device, "device")) as f:
                model = f.read().strip().lower()
            if vendor == GOOGLE_PCI_VENDOR and model in TPU_PCI_DEVICES:
                os.stat(os.path.join("/dev/vfio", os.path.basename(os.readlink(os.path.join(device, "iommu_group")))))
                models.append(model)
        except OSError:
            continue
    return models


def tpu_kind() -> str | None:
    """The TPU generation on this host's PCI bus (v5e, v6e, ...), read without loading TorchTPU; None without one."""
    return next((TPU_KIND_BY_PCI_DEVICE[model] for model in tpu_pci_models()), None)


def launchable_world_sizes(kind: str) -> tuple[int, ...]:
    """The ranks a local worker group can have on a host of this TPU generation: TorchTPU's topologies, and one rank
    always (where TorchTPU knows no one-rank topology, v7, the launcher starts it without its launch environment)."""
    return tuple(sorted({1, *TPU_WORLD_SIZES[kind]}))


def tpu_on_pci_bus() -> bool:
    """True when a Google TPU chip is visible on this host's PCI bus (what torch_tpu's autoload checks)."""
    return tpu_chip_count() > 0


def keep_tpu_for_workers(worker_process: str) -> None:
    """In ComfyUI's process, before torch is imported: when runs on a TPU go to worker processes
    (TPU_DIFFUSERS_WORKER_PROCESS tpu or always), keep torch from loading TorchTPU here, so ComfyUI's
    process never opens the chips and a libtpu abort can only end a worker. Workers get the user's
    own setting back (worker_environment)."""
    if worker_process == "never" or importlib.util.find_spec("torch_tpu") is None:
        return
    chips = tpu_chip_count()
    if not chips:
        return
    if "torch" in sys.modules:
        log.warning("TPU Diffusers: torch was imported before the pack's prestartup script (by another pack's), "
                    "so TorchTPU may be loaded in ComfyUI's process; runs still go to worker processes.")
        return
    os.environ[AUTOLOAD_WAS_ENV] = os.environ.get(AUTOLOAD_ENV, "")
    os.environ[AUTOLOAD_ENV] = "0"
    os.environ[TPU_IN_WORKERS_ENV] = str(chips)


def worker_environment(environ) -> dict:
    """A copy of `environ` for worker processes: TorchTPU's autoload as the user had it."""
    env = dict(environ)
    if AUTOLOAD_WAS_ENV in env:
        was = env.pop(AUTOLOAD_WAS_ENV)
        env.pop(AUTOLOAD_ENV, None)
        if was:
            env[AUTOLOAD_ENV] = was
    env.pop(TPU_IN_WORKERS_ENV, None)
    return env


def prepare_tpu_environment() -> None:
    """Keep libtpu from querying the cloud metadata server on hosts without a TPU.

    With torch_tpu installed and no chip, libtpu's first start retries the metadata server
    for minutes (measured 640 s). `TPU_SKIP_MDS_QUERY=1` makes it instant. Call this before
    torch starts libtpu; a value the user set is left alone.
    """
    if not tpu_on_pci_bus():
        os.environ.setdefault("TPU_SKIP_MDS_QUERY", "1")


@functools.cache
def note_experimental(api: str, why: str) -> None:
    """TorchTPU 0.2.0 marks some APIs the pack uses @experimental (each warns once); say once which and why."""
    log.info("TPU Diffusers: %s is experimental in torch_tpu 0.2.0 (it warns once); %s", api, why)


@dataclasses.dataclass(frozen=True)
class DeviceInfo:
    type: str  # "tpu" | "cuda" | "cpu"
    compile_backend: str
    process_group_backend: str
    has_fused_eager: bool
    default_dtype: str
    reason: str  # why this device was chosen, for the log and the node's info

    def torch_device(self):
        import torch

        return torch.device(self.type)


# cpu: gloo named "cpu:gloo", as diffusers' Ulysses Anything (context parallelism of a sequence the ranks do not
# divide) reads the backend's name to put its size exchange on the CPU rather than on torch's built-in accelerator
# (CUDA, absent on a CPU host)
_DEVICE_TABLE = {
    "tpu": dict(compile_backend="tpu", process_group_backend="tpu_dist", has_fused_eager=True, default_dtype="bfloat16"),
    "cuda": dict(compile_backend="inductor", process_group_backend="nccl", has_fused_eager=False, default_dtype="bfloat16"),
    "cpu": dict(compile_backend="inductor", process_group_backend="cpu:gloo", has_fused_eager=False, default_dtype="float32"),
}


def device_info(device_type: str, reason: str = "") -> DeviceInfo:
    return DeviceInfo(type=device_type, reason=reason, **_DEVICE_TABLE[device_type])


@functools.cache
def detect_device() -> DeviceInfo:
    """tpu if TorchTPU registered a chip, else cuda, else cpu; logs one line saying which and why."""
    kept_out = os.environ.get(TPU_IN_WORKERS_ENV)
    if kept_out:  # ComfyUI's process, TorchTPU kept for the workers: nothing here may start it
        info = device_info("tpu", f"{kept_out} TPU chip(s) on the PCI bus; TorchTPU runs in worker processes, "
                                  "never in ComfyUI's (TPU_DIFFUSERS_WORKER_PROCESS)")
        log.info("TPU Diffusers: running on tpu (%s).", info.reason)
        return info
    import torch

    accelerator = torch.accelerator.current_accelerator(check_available=True)
    kind = accelerator.type if accelerator is not None else "cpu"
    if kind == "tpu":
        info = device_info("tpu", f"TorchTPU found {torch.accelerator.device_count()} TPU chip(s)")
    elif kind == "cuda":
        info = device_info("cuda", f"CUDA found {torch.accelerator.device_count()} GPU(s)")
    else:
        info = device_info("cpu", "no TPU or CUDA device found")
    if info.type != "tpu" and importlib.util.find_spec("torch_tpu") is not None:
        log.warning("TPU Diffusers: torch_tpu is installed but no TPU chip is usable (%s); falling back to %s.",
                    _why_no_tpu(), info.type)
    else:
        log.info("TPU Diffusers: running on %s (%s).", info.type, info.reason)
    return info


def _why_no_tpu() -> str:
    if not tpu_on_pci_bus():
        return "no TPU on the PCI bus"
    if os.environ.get("TORCH_DEVICE_BACKEND_AUTOLOAD") == "0":
        return "TORCH_DEVICE_BACKEND_AUTOLOAD=0 kept torch from loading torch_tpu; unset it"
    return "a TPU is on the PCI bus but TorchTPU did not register it; check libtpu and that no other process holds the chips"


def resolve_device(requested: str = "auto") -> DeviceInfo:
    """The device for a handle: the detected one for "auto", else the one asked for, if present."""
    detected = detect_device()
    if requested in ("auto", detected.type):
        return detected
    if requested == "cpu":
        return device_info("cpu", "asked for cpu")
    from .errors import UserInputError

    raise UserInputError(f"device '{requested}' was asked for but this machine has {detected.type} "
                         f"({detected.reason}); choose 'auto' or '{detected.type}'.")


def available_host_memory_bytes() -> int | None:
    """What the kernel says can still be allocated without swapping (MemAvailable); None off Linux."""
    try:
        with open("/proc/meminfo") as f:
            fields = dict(line.split(":", 1) for line in f)
        return int(fields["MemAvailable"].split()[0]) * 1024
    except (OSError, KeyError, ValueError):
        return None


def synchronize(info: DeviceInfo) -> None:
    import torch

    if info.type != "cpu":
        torch.accelerator.synchronize()


def empty_cache(info: DeviceInfo) -> None:
    if info.type != "cpu":
        _memory_call("empty_cache")


def peak_memory_bytes(info: DeviceInfo) -> int | None:
    """Peak accelerator memory since the last reset; None on cpu (use the process RSS there) and where the device
    does not count it (0 bytes after a run means its allocator keeps no statistics)."""
    if info.type == "cpu":
        return None
    return _memory_call("max_memory_allocated") or None


def reset_peak_memory(info: DeviceInfo) -> None:
    if info.type != "cpu":
        _memory_call("reset_peak_memory_stats")


def _memory_call(name: str):
    """torch.accelerator.<name>(), or None when it fails. TorchTPU 0.2.0 documents no memory API (its allocator
    implements some of torch.accelerator's calls and raises "not implemented for TPU" for others, untried on a
    chip): memory figures and cache emptying are diagnostics, and must never fail a run or an unload."""
    import torch

    try:
        return getattr(torch.accelerator, name)()
    except Exception as error:  # noqa: BLE001  (any failure: the figure is unknown, the cache stays)
        _note_memory_call_failed(name, f"{type(error).__name__}: {error}")
        return None


@functools.cache
def _note_memory_call_failed(name: str, why: str) -> None:
    log.warning("TPU Diffusers: torch.accelerator.%s() failed on this device (%s); carrying on without it.",
                name, why)


# What TorchTPU's out-of-memory errors say: torch_tpu 0.2.0 has no exception type of its own for it (its
# libraries export no OutOfMemoryError); HBM exhaustion reaches Python as a RuntimeError carrying XLA's
# status name, or the glue's own "the TPU ran out of memory while awaiting the materialization of value".
TPU_OUT_OF_MEMORY_MARKS = ("RESOURCE_EXHAUSTED", "the TPU ran out of memory")


def is_out_of_memory(error: BaseException) -> bool:
    """Whether `error` is the accelerator running out of memory: torch's OutOfMemoryError (what CUDA raises;
    torch.cuda.OutOfMemoryError is the same class) or TorchTPU's RuntimeError. Running out of host memory
    (MemoryError) is not the device's."""
    import torch

    if isinstance(error, torch.OutOfMemoryError):
        return True
    return isinstance(error, RuntimeError) and any(mark in str(error) for mark in TPU_OUT_OF_MEMORY_MARKS)


# An ATen op TorchTPU has no TPU kernel for: TorchTPU 0.2.0's glue raises "<op>' is not implemented for TPU.
# Please file a feature request" (a string of the wheel; its CPU fallback, the execution mode's
# `enable_cpu_fallback`, is a switch the pack leaves as TorchTPU sets it). TorchTPU's own smoke test of a UNet
# model is marked "missing op `upsample_nearest2d.out`", the op every family's VAE decoder upsamples with.
MISSING_OP = re.compile(r"'?([\w:.]+)'? is not implemented for TPU")


def missing_device_op(error: BaseException) -> str | None:
    """The op TorchTPU has no kernel for, when `error` is that failure; else None."""
    if not isinstance(error, (NotImplementedError, RuntimeError)):
        return None
    match = MISSING_OP.search(str(error))
    return match[1] if match else None


def missing_op_advice(op: str, model_class: str, device: str) -> str:
    """What a run that hit an op the device lacks tells the user: which op, and what to do."""
    return (f"{device} has no kernel for the op {op}, which {model_class} runs (TorchTPU raised it; its own "
            "smoke test of a UNet model is marked missing upsample_nearest2d.out, the op every VAE decoder upsamples "
            "with). "
            "Nothing is wrong with the workflow or the model: run it with device 'cuda' or 'cpu' on the Loader, or "
            "with a TorchTPU release that implements the op. `bash scripts/verify_device.sh` probes this op on "
            "the chip (docs/device_check.md).")
