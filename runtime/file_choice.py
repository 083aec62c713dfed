"""Which pipeline component comes from which single file, for a diffusion model (or all-in-one
checkpoint) and the text encoder and VAE files picked next to it.

Only headers are read, so the file loader node refuses a wrong pick when the prompt is queued:
a file of another family, a text encoder in the VAE slot, a missing encoder.
"""

from __future__ import annotations

import os

from .errors import UserInputError
from .families import Family, family_for
from .loading import has_weights
from .single_file import check_file_for_slot, components_in_checkpoint, pipeline_class_of


def choose_files(model: str, picked: dict[str, str], configs_have_weights: set[str] = frozenset()
                 ) -> tuple[str, tuple[tuple[str, str], ...]]:
    """(pipeline class, ((component, path), ...)) for diffusion model/checkpoint file `model` and the
    files `picked` per component (text_encoder, text_encoder_2, text_encoder_3, vae). A picked file
    overrides the checkpoint's own; `configs_have_weights` are components the config folder can load
    itself (a full diffusers folder picked as configs)."""
    pipeline_class = pipeline_class_of(model)
    family = family_for(pipeline_class)
    files = {name: model for name in components_in_checkpoint(model)}
    files["transformer"] = model
    slots = dict(family.file_slots)
    for name, path in picked.items():
        if name not in slots:
            raise UserInputError(f"{family.name} has no {name}; leave it at 'none'. {family.name} takes: "
                                 f"{describe_slots(family)}.")
        check_file_for_slot(path, name, pipeline_class)
        files[name] = path
    missing = [name for name in slots if name not in files and name not in configs_have_weights
               and name not in family.optional_slots]
    if missing:
        raise UserInputError(f"{family.name} from single files also needs " + ", ".join(
            f"{name} ({slots[name]})" for name in missing) + f". {family.name} takes: {describe_slots(family)}.")
    return pipeline_class, tuple(sorted(files.items()))


def describe_slots(family: Family) -> str:
    return ", ".join(f"{name} = {file}" + (" (optional)" if name in family.optional_slots else "")
                     for name, file in family.file_slots)


def components_with_weights(folder: str) -> set[str]:
    """Components of a diffusers folder that hold weights (a configs-only download holds none)."""
    return {name for name in os.listdir(folder) if has_weights(folder, name)}
