"""Execution modes and placements, and how each applies on each device.

TorchTPU switches eager mode at run time (`torch.tpu.set_eager_mode`), so the mode is
applied around a run rather than at load time: changing it reloads nothing. CUDA and CPU
have no fused eager; there the run is strict eager and the returned name says so.

Every load and run happens with inference mode off and autograd off (`outside_inference_mode`).
"""

from __future__ import annotations

import contextlib
import logging

from .device import DeviceInfo, note_experimental
from .specs import ExecutionMode

log = logging.getLogger("tpu_diffusers")


_TPU_EAGER_MODES = {ExecutionMode.EAGER: "DEFER_NEVER", ExecutionMode.FUSED_EAGER: "DEFER_AND_FUSE"}


@contextlib.contextmanager
def outside_inference_mode():
    """Inference mode off, autograd off, on every device, so the CPU suite runs what a TPU runs.

    ComfyUI runs every node inside `torch.inference_mode()`. TorchTPU's torch.compile cannot capture
    graphs there (its error glossary, 3c: use no_grad instead), and weights loaded there are
    inference tensors.
    """
    import torch

    with torch.inference_mode(False), torch.no_grad():
        yield


def grad_mode() -> str:
    """The autograd state right now, for the run info (which records it from inside the denoising loop)."""
    import torch

    return (f"inference mode {'on' if torch.is_inference_mode_enabled() else 'off'}, "
            f"grad {'on' if torch.is_grad_enabled() else 'off'}")


@contextlib.contextmanager
def execution_mode(mode: ExecutionMode, device: DeviceInfo):
    """Run the body in `mode`; yields a description of the mode that actually runs.

    Compiled mode changes no eager setting: the transformer runs its compiled graphs
    (`set_eager_mode` must not wrap torch.compile), the code around it runs eager.
    """
    if mode is ExecutionMode.COMPILED:
        yield f"{mode.value} (backend {device.compile_backend})"
        return
    if device.has_fused_eager:  # TorchTPU: both eager modes are its EagerMode settings
        import torch

        note_experimental("torch.tpu.set_eager_mode", "it switches eager and fused eager runs, never "
                          "compiled ones (it is forbidden inside torch.compile).")
        tpu_mode = getattr(torch.tpu.EagerMode, _TPU_EAGER_MODES[mode])
        with torch.tpu.set_eager_mode(tpu_mode):
            yield f"{mode.value} (EagerMode.{tpu_mode.name})"
        return
    if mode is ExecutionMode.FUSED_EAGER:
        ran = f"eager (fused eager needs TorchTPU; {device.type} has no equivalent, ran strict eager)"
        log.info("TPU Diffusers: %s", ran)
        yield ran
        return
    yield mode.value
