"""The Sampler's image inputs as the diffusers pipelines take them, and their checks.

ComfyUI's IMAGE is float32 [N, H, W, C] in 0..1 and its MASK float32 [M, H, W] with 1 = repaint (LoadImage's
mask is 1 - alpha, as diffusers' inpaint masks: white repaints). Each goes to diffusers as the PIL image a user
of plain diffusers passes: 8-bit RGB (a 4th channel, alpha, is dropped; one channel is grey) and the mask 8-bit
grey ("L"). diffusers' own image processors then resize, normalise and binarise them as always. A mask of
another size than its image is resized to the image (bilinear) first; the run info says so.
"""

from __future__ import annotations

from ..errors import UserInputError
from ..families import TaskPipeline
from ..input_checks import IMAGE_INPUTS, VIDEO_IMAGE_INPUTS, denoise_problem, image_inputs_problem


def input_names(request) -> tuple[str, ...]:
    """The names of the request's images on the Sampler that made it (the Video Sampler's second is last_image)."""
    return VIDEO_IMAGE_INPUTS if request.frames else IMAGE_INPUTS


def validate(pipeline: TaskPipeline, request) -> None:
    """What no pipeline can take, and what this one cannot: each says what to change."""
    names = input_names(request)
    problem = (image_inputs_problem(names[:len(request.images)], request.mask is not None, request.latent is not None)
               or denoise_problem(request.denoise, bool(request.images) or request.latent is not None))
    if problem:
        raise UserInputError(problem)
    if request.denoise < 1 and not pipeline.strength:
        raise UserInputError(f"denoise {request.denoise:g}: {pipeline.cls} always denoises fully (diffusers gives "
                             "it no strength); set denoise to 1.")
    if len(request.images) > pipeline.images:
        extra = ", ".join(names[pipeline.images:len(request.images)])
        raise UserInputError(f"{pipeline.cls} takes at most {pipeline.images} image(s) "
                             f"({', '.join(names[:pipeline.images]) or 'none'}); disconnect {extra}.")
    for name, image in zip(names, request.images):
        if image.ndim != 4 or image.shape[0] < 1 or min(image.shape[1:3]) < 1 or image.shape[3] not in (1, 3, 4):
            raise UserInputError(f"{name} has shape {list(image.shape)}; an IMAGE is [batch, height, width, "
                                 "channels] with 3 channels (RGB; 4 = RGBA and 1 = grey are converted).")
    mask = request.mask
    if mask is not None and (mask.ndim != 3 or mask.shape[0] < 1 or min(mask.shape[1:]) < 1):
        raise UserInputError(f"mask has shape {list(mask.shape)}; a MASK is [batch, height, width].")


def pil_image(batch, index: int):
    """Item index % N of an IMAGE batch as an 8-bit RGB PIL image."""
    import numpy as np
    from PIL import Image

    frame = batch[index % len(batch)]
    pixels = (np.clip(frame, 0.0, 1.0) * 255.0).round().astype(np.uint8)
    if pixels.shape[2] == 1:
        pixels = np.repeat(pixels, 3, axis=2)
    return Image.fromarray(np.ascontiguousarray(pixels[:, :, :3]), "RGB")


def at_output_size(pipeline: TaskPipeline, image, request):
    """A PIL image resized to the output size for a pipeline whose diffusers class takes it at its own size
    (`TaskPipeline.resize_image`), with Lanczos as diffusers' image processors resize for the others; else as is."""
    from PIL import Image

    size = (request.width, request.height)
    return image.resize(size, Image.LANCZOS) if pipeline.resize_image and image.size != size else image


def pil_mask(mask, index: int, size: tuple[int, int]):
    """Item index % M of a MASK batch as an 8-bit grey PIL image of `size` (width, height), its image's."""
    import numpy as np
    from PIL import Image

    pixels = (np.clip(mask[index % len(mask)], 0.0, 1.0) * 255.0).round().astype(np.uint8)
    image = Image.fromarray(pixels, "L")
    return image if image.size == size else image.resize(size, Image.BILINEAR)


def resized(batch, size: tuple[int, int] | None):
    """An IMAGE batch resized to size (width, height) as diffusers resizes PIL images (Lanczos); None: as is."""
    import numpy as np
    from PIL import Image

    if size is None or tuple(size) == (batch.shape[2], batch.shape[1]):
        return batch
    frames = [np.asarray(pil_image(batch, i).resize(tuple(size), Image.LANCZOS), dtype=np.float32) / 255.0
              for i in range(len(batch))]
    return np.stack(frames)


def notes(request) -> list[str]:
    """What the run info should say about how the inputs were taken."""
    said = []
    for name, image in zip(input_names(request), request.images):
        if image.shape[3] == 4:
            said.append(f"{name}: alpha channel dropped (RGBA -> RGB); for inpainting connect Load Image's MASK")
        if len(image) > 1:
            said.append(f"{name}: a batch of {len(image)}; output image i uses its image i % {len(image)}")
    if request.mask is not None and request.images:
        image, mask = request.images[0], request.mask
        if mask.shape[1:] != image.shape[1:3]:
            said.append(f"mask resized from {mask.shape[2]}x{mask.shape[1]} to the image's "
                        f"{image.shape[2]}x{image.shape[1]}")
        if len(mask) > 1:
            said.append(f"mask: a batch of {len(mask)}; output image i uses mask i % {len(mask)}")
    return said
