"""ComfyUI's side of the runtime's progress callback: progress bar and Cancel."""

import comfy.model_management
import comfy.utils


class ComfyProgress:
    """A runtime ProgressCallback that drives the node's progress bar and honours Cancel.

    Raising `InterruptProcessingException` from here stops loading between components and
    sampling between steps; ComfyUI reports the prompt as interrupted.
    """

    def __init__(self):
        self._bar = None

    def __call__(self, done: int, total: int, what: str) -> None:
        comfy.model_management.throw_exception_if_processing_interrupted()
        if self._bar is None:
            self._bar = comfy.utils.ProgressBar(total)
        self._bar.update_absolute(done, total)
