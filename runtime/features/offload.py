"""Placement: the whole pipeline on the accelerator, or model CPU offload (each model moves to the
accelerator only while it runs: diffusers' `enable_model_cpu_offload`, which finds TorchTPU's device
through torch.accelerator). Part of the load spec, so it is applied once, when the pipeline loads."""

from __future__ import annotations

from ..device import DeviceInfo
from ..specs import Placement


def apply(pipe, placement: Placement, device: DeviceInfo) -> None:
    if placement is Placement.MODEL_CPU_OFFLOAD:
        pipe.enable_model_cpu_offload(device=device.torch_device())
    else:
        pipe.to(device.torch_device())


def remove(pipe) -> None:
    """Drop the offload hooks (and any other diffusers hooks), e.g. before the pipeline is let go."""
    pipe.remove_all_hooks()
