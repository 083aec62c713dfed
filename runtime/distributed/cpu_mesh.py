"""The two things diffusers lacks for tensor parallelism on a CPU mesh (gloo), in one place.

Used only by CPU workers, which exist for development and tests (a TPU or GPU mesh needs
none of this):
- `ModelMixin._resolve_parallel_config` places each rank on
  `torch.device(<accelerator>, rank % torch.accelerator.device_count())`: with no accelerator
  the count is 0 (ZeroDivisionError), and a CUDA build of torch names "cuda" even without a GPU;
- `diffusers.hooks.tensor_parallel._SUPPORTED_TP_DEVICES` leaves out "cpu".
Measured: with both bridged, a 2-rank CPU forward matches one process to ~1e-7.
"""


def enable_cpu_tensor_parallel() -> None:
    """Patch, for this worker process only, what diffusers' TP consults about the device."""
    import diffusers.hooks.tensor_parallel as tensor_parallel
    import torch

    if "cpu" not in tensor_parallel._SUPPORTED_TP_DEVICES:
        tensor_parallel._SUPPORTED_TP_DEVICES = (*tensor_parallel._SUPPORTED_TP_DEVICES, "cpu")
    torch._C._get_accelerator = lambda: torch.device("cpu")
    torch.accelerator.device_count = lambda: 1
