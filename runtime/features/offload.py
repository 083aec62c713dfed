"""Placement: the whole pipeline on the accelerator, or model CPU offload (each model moves to the
accelerator only while it runs: diffusers' `enable_model_cpu_offload`, which finds TorchTPU's device
through torch.accelerator). Part of the load key, so it is applied once, on a pipeline's first realisation.

A modular pipeline has no `enable_model_cpu_offload` (diffusers' ComponentsManager.enable_auto_cpu_offload keeps
models on the device until memory runs short, and asks the device for its free memory, which a CPU or TPU cannot
tell): it is hooked here as that method hooks a classic pipeline, with accelerate's `cpu_offload_with_hook`
chained over its models in the order its blocks use them last (text encoders, denoisers, VAE), so that each
model is on the device only while it runs; `end_run` moves them all back to the host after a run, as a classic
pipeline's `maybe_free_model_hooks` does at the end of its call. The hooks live on the modules, so a task
pipeline made from the loaded one (the same modules) runs under them.

A TP rank's pipeline is placed by loading itself (each library puts its shards on the rank's device); its
placement state only records that."""

from __future__ import annotations

from ..device import DeviceInfo
from ..pipeline_kinds import is_modular
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
    stay where they are: moving them to host memory is `to_host`'s, when the memory is wanted back."""
    if is_modular(entry.pipe):
        _unhook(entry.pipe)
    else:
        entry.pipe.remove_all_hooks()


def place(pipe, placement: Placement, device: DeviceInfo) -> None:
    """Put `pipe` on the device, or hook it for model CPU offload (also a task pipeline made from the loaded
    one, and a pipeline moved back from host memory)."""
    if placement is Placement.MODEL_CPU_OFFLOAD:
        if is_modular(pipe):
            _hook(pipe, device.torch_device())
        else:
            pipe.enable_model_cpu_offload(device=device.torch_device())
    else:
        pipe.to(device.torch_device())


def to_host(pipe, placement: Placement) -> bool:
    """Move the pipeline's weights to host memory; returns whether it must be moved back before it runs.

    Under model CPU offload the weights are on the host already between runs (diffusers' hooks move each
    model back after it ran); re-arming the hooks, as diffusers does at the end of every run, also returns a
    model a cancelled run left on the device. The pipeline then runs as it is."""
    if placement is Placement.MODEL_CPU_OFFLOAD:
        if is_modular(pipe):
            end_run(pipe)
        else:
            pipe.maybe_free_model_hooks()
        return False
    pipe.to("cpu")
    return True


def end_run(pipe) -> None:
    """After a run of either kind: under model CPU offload, every model back on the host (a classic pipeline
    does this itself at the end of its call, `maybe_free_model_hooks`; a modular pipeline's blocks do not). Models
    without offload hooks stay where they are."""
    if not is_modular(pipe):
        return
    for module in _models(pipe):
        if hasattr(module, "_reset_stateful_cache"):  # as maybe_free_model_hooks resets diffusers' stateful hooks
            module._reset_stateful_cache()
        hook = getattr(module, "_hf_hook", None)
        if _offload_hook(hook):
            hook.init_hook(module)  # accelerate's CpuOffload: the module to the host, until it runs again


def _hook(pipe, device) -> None:
    """diffusers' `enable_model_cpu_offload` for a modular pipeline: every model on the host, each hooked to move
    to `device` when it runs and send the one before it in the chain back to the host."""
    import torch
    from accelerate import cpu_offload_with_hook

    _unhook(pipe)
    models = {name: module for name, module in pipe.components.items() if isinstance(module, torch.nn.Module)}
    for module in models.values():
        module.to("cpu")
    hook = None
    for name in _use_order(pipe.blocks):
        if name in models:
            _, hook = cpu_offload_with_hook(models.pop(name), device, prev_module_hook=hook)
    for module in models.values():  # models no block names (as diffusers hooks those outside its sequence)
        cpu_offload_with_hook(module, device)


def _unhook(pipe) -> None:
    from accelerate.hooks import remove_hook_from_module

    for module in _models(pipe):
        if hasattr(module, "_hf_hook"):
            remove_hook_from_module(module, recurse=True)


def _use_order(blocks) -> list[str]:
    """The component names the blocks' leaf blocks use, in the order of each one's last use (text encoders,
    then the denoiser(s), then the VAE that decodes, as the classic pipelines' `model_cpu_offload_seq`; a VAE
    that encodes an image first stays on the device until the run ends, as in a classic pipeline)."""
    def leaves(block):
        subs = getattr(block, "sub_blocks", None)
        return [name for sub in subs.values() for name in leaves(sub)] if subs else [
            spec.name for spec in block.expected_components]

    used = leaves(blocks)
    return [name for i, name in enumerate(used) if name not in used[i + 1:]]


def _offload_hook(hook) -> bool:
    from accelerate.hooks import CpuOffload

    return isinstance(hook, CpuOffload)


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
