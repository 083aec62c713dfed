"""ComfyUI's side of the runtime's progress callback: progress bar, live previews and Cancel."""

import comfy.latent_formats
import comfy.model_management
import comfy.utils
from comfy.cli_args import LatentPreviewMethod, args
from PIL import Image

from tpu_diffusers_runtime.plan import family_of
from tpu_diffusers_runtime.preview import PreviewSpec


def preview_spec(handle) -> PreviewSpec | None:
    """What the runtime needs for previews of this family, or None when ComfyUI's preview setting is off
    (`--preview-method none`; newer ComfyUI also sets it per prompt from the page's setting).

    Every method but none gets ComfyUI's own latent2rgb factors, read here at run time so they stay
    ComfyUI's; TAESD is not offered (ComfyUI itself falls back to latent2rgb without a TAESD file).
    """
    if args.preview_method == LatentPreviewMethod.NoPreviews:
        return None
    family = family_of(handle)  # settings can change it
    format_class = getattr(comfy.latent_formats, family.comfy_latent_format, None)
    latent_format = format_class() if format_class else None
    if latent_format is None or not latent_format.latent_rgb_factors:
        return None  # a ComfyUI without factors for this family
    bias = latent_format.latent_rgb_factors_bias
    return PreviewSpec(factors=tuple(tuple(row) for row in latent_format.latent_rgb_factors),
                       bias=bias and tuple(bias))


class ComfyProgress:
    """A runtime ProgressCallback that drives the node's progress bar, shows previews and honours Cancel.

    Raising `InterruptProcessingException` from here stops loading between components and
    sampling between steps; ComfyUI reports the prompt as interrupted.
    """

    def __init__(self):
        self._bar = None

    def __call__(self, done: int, total: int, what: str, preview=None) -> None:
        comfy.model_management.throw_exception_if_processing_interrupted()
        if self._bar is None:
            self._bar = comfy.utils.ProgressBar(total)
        # ("JPEG", image, max size) is what ComfyUI's own samplers hand the bar; the server scales and sends it.
        image = None if preview is None else ("JPEG", Image.fromarray(preview), args.preview_size)
        self._bar.update_absolute(done, total, image)
