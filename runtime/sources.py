"""Where a model comes from: a diffusers folder inside ComfyUI's model folders, or a hub id.

Names from a shared workflow are resolved so that they never leave the model folders, and a hub id is
only ever 'owner/name'. `read_model_index` reads what a pipeline folder says it holds; nothing here
loads weights. Hub files come through runtime/downloads.py.
"""

from __future__ import annotations

import os
import re

from . import downloads
from .errors import ModelLoadError, UserInputError
from .model_files import find_inside
from .model_folder import INDEX, MODULAR_INDEX, index_path, read_index_file
from .specs import ProgressCallback

HUB_ID = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]*/[A-Za-z0-9][A-Za-z0-9._-]*$")


def list_model_folders(roots: list[str]) -> list[str]:
    """Names (relative to a root) of the diffusers folders under the given model roots."""
    names = set()
    for root in roots:
        if not os.path.isdir(root):
            continue
        for dirpath, dirnames, filenames in os.walk(root, followlinks=True):
            if INDEX in filenames or MODULAR_INDEX in filenames:
                names.add(os.path.relpath(dirpath, root).replace(os.sep, "/"))
                dirnames.clear()  # a pipeline's subfolders are its components, not more models
            dirnames[:] = sorted(d for d in dirnames if not d.startswith("."))
    return sorted(names)


def resolve_model_folder(name: str, roots: list[str]) -> str:
    """The absolute folder for a model name from a workflow, never outside the model roots."""
    try:
        found = find_inside(name, roots, os.path.isdir)
    except ValueError:
        raise UserInputError(f"model name '{name}' is not a folder name inside models/diffusers; "
                             "pick a model from the list.") from None
    if found:
        return found
    raise UserInputError(f"model folder '{name}' was not found in {', '.join(roots) or 'models/diffusers'}; "
                         "put the diffusers folder there (it has a model_index.json) or pick another model.")


def read_model_index(source: str, is_folder: bool) -> dict:
    if is_folder:
        path = index_path(source)
        if path is None:
            raise UserInputError(f"'{source}' is not a diffusers pipeline folder: it has no model_index.json (nor the "
                                 "modular_model_index.json of a modular pipeline). Point the loader at the folder "
                                 "that contains it.")
    else:
        path = downloads.model_index_file(source)
    index = read_index_file(path, source)
    if not isinstance(index, dict) or "_class_name" not in index:
        raise UserInputError(f"model_index.json of '{source}' names no pipeline class (_class_name); "
                             "it is not a diffusers pipeline.")
    return index


def is_diffusers_pipeline_class(library: str, cls: str) -> bool:
    """A component class kept in one of diffusers' own pipeline packages (model_index.json names the package, e.g.
    a text connector or vocoder under diffusers.pipelines.<package>), which diffusers imports from itself."""
    import importlib
    import importlib.util

    if not library.isidentifier() or library in ("diffusers", "transformers"):
        return False
    name = component_module(library)
    try:
        return importlib.util.find_spec(name) is not None and hasattr(importlib.import_module(name), cls)
    except ImportError:
        return False


def component_module(library: str) -> str:
    """The module a model_index.json component's library names: diffusers, transformers, or one of diffusers' own
    pipeline packages (`is_diffusers_pipeline_class`)."""
    return library if library in ("diffusers", "transformers") else f"diffusers.pipelines.{library}"


def components(index: dict) -> dict[str, tuple[str, str]]:
    """{component name: (library, class)} for the components a pipeline folder provides: the [library, class] pairs of
    names (a setting may be a list too, of numbers: e.g. which text encoder layers a pipeline reads)."""
    out = {}
    for name, value in index.items():
        if (name.startswith("_") or not isinstance(value, list) or len(value) != 2
                or not all(isinstance(part, str) for part in value)):
            continue
        out[name] = (value[0], value[1])
    return out


def config_values(index: dict) -> dict:
    """{name: value} of the plain settings a model_index.json gives the pipeline's __init__ beside its components
    (e.g. is_distilled: whether CFG runs), as diffusers' from_pretrained passes them. A setting may be a list of
    numbers (which text encoder layers a pipeline reads, a distilled model's fixed `sample_sigmas`)."""
    return {name: value for name, value in index.items()
            if not name.startswith("_") and (isinstance(value, (bool, int, float, str)) or isinstance(value, list) and all(
                isinstance(part, (int, float)) for part in value))}


def model_settings(source: str) -> dict | None:
    """The model_index settings of a handle's source, read before loading where that needs no download (a folder,
    or a hub id whose model_index.json is in the local cache); None otherwise: the loaded pipeline's config
    decides once it is loaded (runtime/plan.py's `Plan.refined`)."""
    if is_hub_id(source):
        from huggingface_hub import try_to_load_from_cache

        path = try_to_load_from_cache(source, INDEX) if HUB_ID.match(source) else None
        if not isinstance(path, str):
            return None
    else:
        path = index_path(source)
        if path is None:
            return None  # the load reports the folder that is not a model
    try:
        index = read_index_file(path, source)
    except ModelLoadError:
        return None  # the load reports an unreadable model_index.json
    return config_values(index) if isinstance(index, dict) else None


def is_hub_id(source: str) -> bool:
    """Folders are always absolute paths; anything else must be an 'owner/name' hub id, so a
    workflow cannot smuggle in a relative path that diffusers would read as a local folder."""
    return not os.path.isabs(source)


def check_hub_id(text: str) -> str:
    """A hub id from a workflow, refused unless it is exactly 'owner/name' (never a path)."""
    if not HUB_ID.match(text):
        raise UserInputError(f"'{text}' is not a hub id like 'owner/name'. To use a local model, put its "
                             "folder in models/diffusers and pick it in the list.")
    return text


def check_source(source: str) -> bool:
    """Refuse a malformed hub id or a missing folder; returns whether `source` is a hub id."""
    if is_hub_id(source):
        check_hub_id(source)
        return True
    if not os.path.isdir(source):
        raise UserInputError(f"model folder '{source}' does not exist.")
    return False


WEIGHT_SUFFIXES = (".safetensors", ".bin", ".pth")


def has_weights(pipeline_folder: str, name: str) -> bool:
    """Whether component `name` of a diffusers folder holds weights (a configs-only download holds none)."""
    folder = os.path.join(pipeline_folder, name)
    return os.path.isdir(folder) and any(f.endswith(WEIGHT_SUFFIXES) for f in os.listdir(folder))


def local_folder(source: str, on_progress: ProgressCallback | None = None) -> str:
    """The folder to load from: the source itself, or the hub snapshot, downloaded with progress and Cancel
    where the cache lacks files (runtime/downloads.py)."""
    if not check_source(source):
        return source
    return downloads.pipeline_folder(source, on_progress)

