"""Latent upscalers for a family's two-stage generation (`Family.two_stage`): what a picked file or folder is, checked
before anything loads, and loading it.

An upscaler is a diffusers folder (config.json naming the upscaler's class, with its weights; or a pipeline folder
with the upscaler in its subfolder) or one safetensors file in the original layout, which is diffusers' own (the
family reads its config off the shapes).
"""

from __future__ import annotations

import json
import os

from .errors import ModelLoadError, UserInputError
from .families import FAMILIES, TwoStage

CONFIG = "config.json"
KINDS = tuple(dict.fromkeys(family.two_stage for family in FAMILIES if family.two_stage))


def config_folder(path: str, two_stage: TwoStage) -> str | None:
    """The folder of an upscaler folder that holds its config: the folder itself or its `subfolder`; None when neither
    has a config naming the upscaler's class."""
    for folder in (path, os.path.join(path, two_stage.subfolder)):
        try:
            with open(os.path.join(folder, CONFIG)) as f:
                if json.load(f).get("_class_name") == two_stage.upsampler_class:
                    return folder
        except (OSError, ValueError, AttributeError):
            continue
    return None


def problem(path: str, two_stage: TwoStage) -> str | None:
    """Why `path` is not an upscaler of this kind (a folder without its config, a file without its key), or None."""
    from .single_file import HeaderView

    name = os.path.basename(path)
    if os.path.isdir(path):
        if config_folder(path, two_stage) is None:
            return (f"'{name}' is not a latent upscaler folder: neither it nor its {two_stage.subfolder}/ has a "
                    f"{CONFIG} of a {two_stage.upsampler_class}.")
        return None
    if two_stage.key not in HeaderView(path):  # a wrong format, missing or corrupt file is refused saying so
        return (f"'{name}' is not a latent upscaler of this kind: it has no '{two_stage.key}' (a "
                f"{two_stage.upsampler_class} has). Pick a latent upscaler file (e.g. {two_stage.comfy_file}).")
    return None


def check(path: str, two_stage: TwoStage | None = None) -> None:
    """Refuse `path` unless it is an upscaler of this kind; None: of any family's (the node checks before a model is
    known), the first kind's problem said."""
    problems = [problem(path, kind) for kind in ((two_stage,) if two_stage else KINDS)]
    if None not in problems:
        raise UserInputError(problems[0])


def list_folders(roots: list[str]) -> list[str]:
    """Names (relative to a root) of the upscaler folders inside the roots, at any depth."""
    names = set()
    for root in roots:
        for dirpath, dirnames, _ in os.walk(root, followlinks=True) if os.path.isdir(root) else ():
            if dirpath != root and any(config_folder(dirpath, two_stage) for two_stage in KINDS):
                names.add(os.path.relpath(dirpath, root).replace(os.sep, "/"))
                dirnames.clear()
            dirnames[:] = sorted(d for d in dirnames if not d.startswith("."))
    return sorted(names)


def load(path: str, two_stage: TwoStage, dtype, device):
    """The upscaler model at `path`, checked first, on `device` in `dtype`."""
    import importlib

    check(path, two_stage)
    cls = getattr(importlib.import_module(two_stage.upsampler_module), two_stage.upsampler_class)
    if os.path.isdir(path):
        model = cls.from_pretrained(config_folder(path, two_stage), torch_dtype=dtype, local_files_only=True)
    else:
        from safetensors.torch import load_file

        state = load_file(path)
        model = cls(**two_stage.file_config(state))
        missing, unexpected = model.load_state_dict(state, strict=False)
        buffers = {name for name, _ in model.named_buffers()}  # fixed kernels a file may leave out
        if unexpected or set(missing) - buffers:
            raise ModelLoadError(f"'{os.path.basename(path)}' does not fit a {two_stage.upsampler_class} read off its "
                                 f"shapes (missing {sorted(set(missing) - buffers)[:3]}, unexpected "
                                 f"{sorted(unexpected)[:3]}); pick another upscaler file.")
    return model.to(device=device, dtype=dtype).eval()
