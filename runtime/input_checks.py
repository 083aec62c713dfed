"""The checks of a Sampler's inputs, each written once: the nodes' `validate_inputs` call them when the prompt is
queued (with what is known then: which inputs are linked, the widget values; the model is not known yet,
so a family-dependent rule is checked as every supported family needs it) and the runtime calls them again when it
runs (with the family, and the values links gave). Each returns what to tell the user, or None.
"""

from __future__ import annotations

import math

from .families import FAMILIES, Family

MAX_SIZE = 8192  # the Samplers' width and height widgets go up to here
IMAGE_INPUTS = ("image", "image_2", "image_3")
VIDEO_IMAGE_INPUTS = ("image", "last_image")  # the Video Sampler's: the first frame, and the last frame
# What a queued width or height must be a multiple of (the model is not known then; the Samplers' widgets step by
# it): every family's size step divides it or is a multiple of it, and a coarser one is checked when the model runs.
QUEUED_SIZE_MULTIPLE = 16


def prompt_problem(prompt: str, model: str = "the model") -> str | None:
    if not prompt.strip():
        return f"prompt is empty: {model} needs a prompt. Describe what to generate."
    return None


def nearest_sizes(value: int, multiple: int) -> tuple[int, int]:
    lower = max(multiple, value // multiple * multiple)
    return lower, lower + multiple


def size_problem(name: str, value: int, family: Family | None = None) -> str | None:
    """What is wrong with a width or height of `family`'s (None: the model is not known yet: QUEUED_SIZE_MULTIPLE)."""
    multiple = family.size_multiple if family else QUEUED_SIZE_MULTIPLE
    if value >= multiple and value % multiple == 0:
        return None
    below, above = nearest_sizes(value, multiple)
    rule = (f"cannot be used with {family.name}: it must be a multiple of {multiple}" if family else
            f"cannot be used: every supported model needs a multiple of {multiple}")
    return f"{name} {value} {rule}. Nearest valid {name}s: {below} or {above}."


def queued_size_problem(name: str, value: int, has_image: bool) -> str | None:
    """A Sampler's width or height when the prompt is queued: 0 is the image's (or the latent's), so it needs one."""
    if value > MAX_SIZE:
        return f"{name} {value} is larger than {MAX_SIZE}; use at most {MAX_SIZE}."
    if value == 0:
        if not has_image:
            return f"{name} 0 means the image's {name}, but no image is connected: connect one or set {name}."
        return None
    return size_problem(name, value)


def video_frame_factor() -> int:
    """The frame step of the counts some supported video family takes (frames = factor x k + 1): the GCD of their
    factors, as every family's counts are among these (8k + 1 are 4k + 1). At queue time the Video Sampler cannot
    know the model, so it refuses only what no video model takes; the family's own factor refuses the rest when the
    run is planned, before anything loads (tasks.base.validate_frames). Families with a frame rule of another form
    (Family.frame_rule) are not counted here: their counts pass the queue-time check by their own rule."""
    return math.gcd(*(family.temporal_factor for family in FAMILIES if family.makes_video and not family.frame_rule))


def frames_problem(frames: int, family: Family | None = None) -> str | None:
    """A video's frame count: `family`'s temporal factor x k + 1, or its own frame rule (None: what some supported video
    family takes)."""
    if family is not None and family.frame_rule is not None:
        rule = family.frame_rule
        if rule.fits(frames):
            return None
        return (f"frames {frames} cannot be used with {family.name}: it must be {rule.words()}. Nearest valid frame "
                f"counts: {' or '.join(str(n) for n in rule.nearest(frames))}.")
    if family is None and any(f.frame_rule.fits(frames) for f in FAMILIES if f.makes_video and f.frame_rule):
        return None
    factor = family.temporal_factor if family else video_frame_factor()
    if frames >= 1 and (frames - 1) % factor == 0:
        return None
    below = max(1, (frames - 1) // factor * factor + 1)
    return (f"frames {frames} cannot be used with {family.name if family else 'the model'}: it must be {factor}k + 1 "
            f"(1, {factor + 1}, {2 * factor + 1}, ..., 81). Nearest valid frame counts: {below} or {below + factor}.")


def reference_frames_problem(count: int, frames: int, family: Family) -> str | None:
    """A reference video for in-context video: diffusers encodes its first `frames` frames (it trims it to the
    video's), which its VAE takes as a video's: the family's temporal factor x k + 1."""
    used, factor = min(count, frames), family.temporal_factor
    if (used - 1) % factor == 0:
        return None
    below = (used - 1) // factor * factor + 1
    return (f"reference_video has {used} frames, fewer than the video's {frames}: {family.name} encodes it as a video, "
            f"so it must have {factor}k + 1 frames. Give it {below} (the first of them) or at least {frames} frames.")


def image_inputs_problem(images: tuple[str, ...], mask: bool, latent: bool = False) -> str | None:
    """Which of the Sampler's image inputs are connected (`images`: the names of those of IMAGE_INPUTS that are):
    image to image starts from an image or a LATENT, not both; a mask needs the image it repaints, and the
    references come in order."""
    if latent and images:
        return ("both an image and a latent are connected: image to image starts from one of them; disconnect the "
                "image or the latent.")
    if latent and mask:
        return ("a mask and a latent are connected: inpainting starts from an image; connect the image to repaint to "
                "'image' instead of the latent, or disconnect the mask.")
    if mask and "image" not in images:
        return ("a mask is connected but no image: connect the image to repaint to 'image' (Load Image gives both), "
                "or disconnect the mask.")
    for name, before in zip(IMAGE_INPUTS[1:], IMAGE_INPUTS):
        if name in images and before not in images:
            return f"{name} is connected but {before} is not: connect the references in order, {before} first."
    return None


def sigmas_problem(sigmas: tuple[float, ...]) -> str | None:
    """A SIGMAS schedule (without its final 0) for a flow-matching model: decreasing noise levels in (0, 1]."""
    if not sigmas:
        return "the sigmas input holds no step: connect a schedule of at least two sigmas (the last one 0)."
    if not all(0 < s <= 1 for s in sigmas) or any(b >= a for a, b in zip(sigmas, sigmas[1:])):
        shown = ", ".join(f"{s:g}" for s in sigmas)
        return (f"sigmas {shown} cannot be used: a flow-matching model's schedule decreases from at most 1 towards 0 "
                "(e.g. ManualSigmas '1.0, 0.99375, 0.9875, 0.98125, 0.975, 0.909375, 0.725, 0.421875, 0.0', a distilled "
                "model's).")
    return None


def last_image_problem(image: bool, last_image: bool) -> str | None:
    """The Video Sampler's last_image (connected or not) is the last frame of a video that starts from its image."""
    if last_image and not image:
        return ("last_image is connected but image is not: first/last frame to video needs the first frame on "
                "'image' too. Connect it, or move the picture to 'image' for image to video.")
    return None


def references_problem(references: bool, others: list[str]) -> str | None:
    """The Video Sampler's references (reference to video) take the place of its other conditions (`others`: the
    connected ones of image, last_image, reference_video)."""
    if references and others:
        return (f"references with {', '.join(others)}: a reference to video run takes its pictures as references "
                "(TPU Video Reference); disconnect the others.")
    return None


def denoise_problem(denoise: float, has_image: bool) -> str | None:
    """`has_image`: an image (or a LATENT) to start from is connected."""
    if not 0 < denoise <= 1:
        return f"denoise {denoise:g} is outside 0..1 (0 would change nothing); use a value above 0, at most 1."
    if denoise < 1 and not has_image:
        return (f"denoise {denoise:g} needs an image to start from: connect an image (or a latent), or set denoise "
                "to 1 for text to image.")
    return None
