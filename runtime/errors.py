"""Every error class of the runtime, and the names they travel under between processes.

ComfyUI shows an exception's text on the node that raised it, so every error a user can cause says
what is wrong and what to change. None of these derives from ValueError or RuntimeError: a broad
`except ValueError` around a library call must never relabel a user's error as a load error.
"""


class TPUDiffusersError(Exception):
    """Base of the runtime's own errors."""


class UserInputError(TPUDiffusersError):
    """Something in the workflow (a model name, a size, a setting) cannot work as given."""


class ModelLoadError(TPUDiffusersError):
    """A model folder or file exists but could not be read (corrupt, truncated, incomplete)."""


class SettingError(TPUDiffusersError):
    """One of the pack's environment variables has a value it cannot use (see runtime/settings.py)."""


class CompileError(TPUDiffusersError):
    """Compiling failed; the message names the cause and what to try. The pipeline still runs eager."""


class LoraUnloadError(TPUDiffusersError):
    """A LoRA failed and diffusers could not remove its layers either: the engine drops the pipeline."""


class DeviceOutOfMemoryError(TPUDiffusersError):
    """The accelerator ran out of memory in a run: the pack has freed its pipelines, and the message says
    what ran (placement, batch, size) and what to try. Not a torch.OutOfMemoryError: see docs/memory.md."""


class MissingDeviceOpError(TPUDiffusersError):
    """The device has no kernel for an op the model runs (TorchTPU's "is not implemented for TPU"); the message
    names the op and what to do."""


class WorkerGroupError(TPUDiffusersError):
    """A worker failed; the message names the rank and the cause when torchrun reported them."""


class WorkerRequestError(TPUDiffusersError):
    """A request failed the same way on every rank with an error of no kind of ours; the group is still up."""


# Errors a worker group's request can fail with on every rank, by the name in its error reply: the ComfyUI
# side raises the same kind again (a UserInputError stays one, so ComfyUI shows it on the node).
WIRE_ERRORS = {cls.__name__: cls for cls in (UserInputError, ModelLoadError, CompileError, DeviceOutOfMemoryError,
                                             MissingDeviceOpError)}


def from_wire(kind: str, message: str) -> Exception:
    """The exception for a worker group's error reply of `kind`."""
    cls = WIRE_ERRORS.get(kind)
    if cls is not None:
        return cls(message)
    return WorkerRequestError(f"every worker rank failed with {kind}: {message}")
