"""Single files picked by name from ComfyUI's model folders (diffusion_models, text_encoders, vae,
checkpoints, loras), resolved so that a name from a shared workflow never leaves those folders.

ComfyUI-free: the nodes pass the folder lists ComfyUI's `folder_paths` registered.
"""

from __future__ import annotations

import os

from .errors import UserInputError

NONE = "none"  # the combo value of an optional file left empty


def find_inside(name: str, roots: list[str], exists) -> str | None:
    """The absolute path of `name` (relative, as ComfyUI lists it, from a workflow) inside the first of `roots` where
    `exists` (os.path.isfile, os.path.isdir) holds, never outside them; None when none has it. Raises ValueError for
    a name that would leave them (absolute, or with '..')."""
    parts = name.replace("\\", "/").split("/")
    if not name or os.path.isabs(name) or ".." in parts:
        raise ValueError(name)
    for root in roots:
        root = os.path.abspath(root)  # lexical, not realpath: a symlink the user put in a model folder is fine
        candidate = os.path.normpath(os.path.join(root, *parts))
        if os.path.commonpath([root, candidate]) == root and exists(candidate):
            return candidate
    return None


def resolve_model_file(name: str, roots: list[str], kind: str) -> str:
    """The absolute path of file `name` (relative, as ComfyUI lists it) inside one of `roots`."""
    try:
        found = find_inside(name, roots, os.path.isfile)
    except ValueError:
        raise UserInputError(f"'{name}' is not a file name inside models/{kind}; pick a file from the list.") from None
    if found:
        return found
    raise UserInputError(f"'{name}' was not found in {', '.join(roots) or 'models/' + kind}; put the file there "
                         "(or pick another one) and press R in ComfyUI to refresh the lists.")
