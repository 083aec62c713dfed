"""The pipeline families we support, declared once.

A family is identified by the `_class_name` in a folder's `model_index.json`. Everything
that differs between families at sampling time is a field here, not an `if` elsewhere.
"""

from __future__ import annotations

import dataclasses

from .errors import UserInputError


@dataclasses.dataclass(frozen=True)
class Family:
    name: str  # shown to users
    pipeline_class: str  # diffusers class named in model_index.json
    takes_negative_prompt: bool
    guidance_kwarg: str  # the __call__ argument the node's "guidance" feeds
    size_multiple: int  # height and width must be multiples of this (VAE factor x patch size)
    default_steps: int  # named in the message for a bad step count


FAMILIES = {
    f.pipeline_class: f
    for f in (
        Family("FLUX.1", "FluxPipeline", takes_negative_prompt=False, guidance_kwarg="guidance_scale",
               size_multiple=16, default_steps=4),
        Family("SD3/SD3.5", "StableDiffusion3Pipeline", takes_negative_prompt=True, guidance_kwarg="guidance_scale",
               size_multiple=16, default_steps=40),
        Family("FLUX.2", "Flux2Pipeline", takes_negative_prompt=False, guidance_kwarg="guidance_scale",
               size_multiple=16, default_steps=28),
        # QwenImage's CFG is "true CFG" and only runs when a negative prompt is given.
        Family("QwenImage", "QwenImagePipeline", takes_negative_prompt=True, guidance_kwarg="true_cfg_scale",
               size_multiple=16, default_steps=50),
    )
}


def family_for(pipeline_class: str, where: str = "") -> Family:
    try:
        return FAMILIES[pipeline_class]
    except KeyError:
        supported = ", ".join(f"{f.name} ({f.pipeline_class})" for f in FAMILIES.values())
        raise UserInputError(
            f"{where or 'this model'} is a '{pipeline_class}', which TPU Diffusers does not run. "
            f"Supported pipelines: {supported}. Pick a model folder of one of these."
        ) from None
