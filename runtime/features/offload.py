"""Placement: the whole pipeline on the accelerator, or model CPU offload (each model moves to the
accelerator only while it runs: diffusers' `enable_model_cpu_offload`, which finds TorchTPU's device
through torch.accelerator). Part of the load key, so it is applied once, on a pipeline's first realisation.

A TP rank's pipeline is placed by loading itself (each library puts its shards on the rank's device); its
placement state only records that."""

from __future__ import annotations

from ..device import DeviceInfo
from ..errors import UserInputError
from ..pipeline_kinds import MODULAR_OFFLOAD, is_modular
from ..specs import Placement, ProgressCallback

NAME = "placement"


def apply(entry, placement: Placement, state: Placement | None,
          on_progress: ProgressCallback | None = None) -> Placement:
    """Place the loaded pipeline as asked; the state is the placement applied."""
    if state is placement:
        return state
    if state is not None:
        remove(entry, state)
    if not _sharded(entry.pipe):
        place(entry.pipe, placement, entry.device)
    if on_progress:
        on_progress(1, 1, "placed on " + entry.device.type)
    return placement


def remove(entry, state: Placement | None) -> None:
    """Drop the offload hooks (and any other diffusers hooks), e.g. before the pipeline is let go. The weights
    stay where they are: moving them to host memory is `to_host`'s, when the memory is wanted back. A modular
    pipeline is only ever placed whole on its device: it has no hooks to drop."""
    if not is_modular(entry.pipe):
        entry.pipe.remove_all_hooks()


def place(pipe, placement: Placement, device: DeviceInfo) -> None:
    """Put `pipe` on the device, or hook it for model CPU offload (also a task pipeline made from the loaded
    one, and a pipeline moved back from host memory)."""
    if placement is Placement.MODEL_CPU_OFFLOAD:
        if is_modular(pipe):
            raise UserInputError(MODULAR_OFFLOAD)
        pipe.enable_model_cpu_offload(device=device.torch_device())
    else:
        pipe.to(device.torch_device())


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
    return sum(tensor.numel() * tensor.element_size()
               for module in _models(pipe) for tensor in (*module.parameters(), *module.buffers()))


def _sharded(pipe) -> bool:
    """Whether tensor parallel loading sharded some model (DTensor weights, on their ranks' devices already)."""
    from torch.distributed.tensor import DTensor

    return any(isinstance(param, DTensor) for module in _models(pipe) for param in module.parameters())


def _models(pipe) -> list:
    import torch

    return [module for module in pipe.components.values() if isinstance(module, torch.nn.Module)]
