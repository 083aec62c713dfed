"""The one reader of a diffusers model folder's JSON files: its model_index.json (or modular_model_index.json) and
its components' config.json. Everything that needs them (sources, downloads, the mesh checks, the memory plan, single files,
LoRA) reads through here, so an unreadable file is reported the same way wherever it is met.
"""

from __future__ import annotations

import json
import os

from .errors import ModelLoadError

INDEX = "model_index.json"
# what a model that diffusers runs only as modular blocks has instead (diffusers.modular_pipelines): each component as
# [library, class, {where it loads from}], [null, null, {...}] for one the folder does not provide
MODULAR_INDEX = "modular_model_index.json"


def index_path(folder: str) -> str | None:
    """The folder's model_index.json, else its modular_model_index.json; None when it has neither."""
    return next((path for path in (os.path.join(folder, name) for name in (INDEX, MODULAR_INDEX))
                 if os.path.isfile(path)), None)


def read_index_file(path: str, source: str) -> dict:
    """The model_index.json at `path` (of the model `source`, named in the error) as JSON; a modular_model_index.json
    in model_index.json's form (`modular_as_index`), so the rest of the pack reads both alike."""
    try:
        with open(path) as f:
            index = json.load(f)
    except (OSError, ValueError) as e:
        raise ModelLoadError(f"{os.path.basename(path)} of '{source}' cannot be read ({e}); "
                             "download the model again.") from e
    if os.path.basename(path) == MODULAR_INDEX and isinstance(index, dict):
        return modular_as_index(index, os.path.dirname(path))
    return index


def modular_as_index(index: dict, folder: str) -> dict:
    """A modular_model_index.json as model_index.json's form: each component the folder holds (it has the component's
    subfolder) as [library, class]. One it does not hold (no class, or its spec names another repository, as a prompt
    upsampler kept in a repository of its own may) is left out: the pipeline runs without it, as for an optional
    component; the third part, where diffusers would fetch it, is for diffusers' own loader."""
    held = {}
    for name, value in index.items():
        if isinstance(value, list) and len(value) == 3 and isinstance(value[2], dict):
            if isinstance(value[0], str) and isinstance(value[1], str) and os.path.isdir(os.path.join(folder, name)):
                held[name] = value[:2]
        else:
            held[name] = value
    return held


def component_config(folder: str, name: str) -> dict:
    """Component `name`'s config.json in the pipeline folder `folder`."""
    try:
        with open(os.path.join(folder, name, "config.json")) as f:
            return json.load(f)
    except (OSError, ValueError) as e:
        raise unreadable_config(folder, name, e) from e


def unreadable_config(folder: str, name: str, error: Exception) -> ModelLoadError:
    return ModelLoadError(f"cannot read {name}/config.json of '{folder}' ({error}); download the model again.")
