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


def to_host(pipe, placement: Placement) -> bool:
    """Move the pipeline's weights to host memory; returns whether it must be moved back before it runs.

    Under model CPU offload the weights are on the host already between runs (diffusers' hooks move each
    model back after it ran); re-arming the hooks, as diffusers does at the end of every run, also returns a
    model a cancelled run left on the device. The pipeline then runs as it is."""
    if placement is Placement.MODEL_CPU_OFFLOAD:
        pipe.maybe_free_model_hooks()
        return False
    pipe.to("cpu")
    return True


def weight_bytes(pipe) -> int:
    """Bytes of the pipeline's weights and buffers: what placing it on the device takes, before activations."""
    import torch

    modules = [module for module in pipe.components.values() if isinstance(module, torch.nn.Module)]
    return sum(tensor.numel() * tensor.element_size()
               for module in modules for tensor in (*module.parameters(), *module.buffers()))
