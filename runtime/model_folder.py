"""The one reader of a diffusers model folder's JSON files: its model_index.json and its components'
config.json. Everything that needs them (sources, downloads, the mesh checks, the memory plan, single files,
LoRA) reads through here, so an unreadable file is reported the same way wherever it is met.
"""

from __future__ import annotations

import json
import os

from .errors import ModelLoadError

INDEX = "model_index.json"


def read_index_file(path: str, source: str) -> dict:
    """The model_index.json at `path` (of the model `source`, named in the error) as JSON."""
    try:
        with open(path) as f:
            return json.load(f)
    except (OSError, ValueError) as e:
        raise ModelLoadError(f"model_index.json of '{source}' cannot be read ({e}); download the model again.") from e


def component_config(folder: str, name: str) -> dict:
    """Component `name`'s config.json in the pipeline folder `folder`."""
    try:
        with open(os.path.join(folder, name, "config.json")) as f:
            return json.load(f)
    except (OSError, ValueError) as e:
        raise unreadable_config(folder, name, e) from e


def unreadable_config(folder: str, name: str, error: Exception) -> ModelLoadError:
    return ModelLoadError(f"cannot read {name}/config.json of '{folder}' ({error}); download the model again.")
