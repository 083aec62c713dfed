"""Single files picked by name from ComfyUI's model folders (diffusion_models, text_encoders, vae,
checkpoints, loras), resolved so that a name from a shared workflow never leaves those folders.

ComfyUI-free: the nodes pass the folder lists ComfyUI's `folder_paths` registered.
"""

from __future__ import annotations

import os

from .errors import UserInputError

NONE = "none"  # the combo value of an optional file left empty


def resolve_model_file(name: str, roots: list[str], kind: str) -> str:
    """The absolute path of file `name` (relative, as ComfyUI lists it) inside one of `roots`."""
    parts = name.replace("\\", "/").split("/")
    if not name or os.path.isabs(name) or ".." in parts:
        raise UserInputError(f"'{name}' is not a file name inside models/{kind}; pick a file from the list.")
    for root in roots:
        root = os.path.abspath(root)  # lexical, not realpath: a symlink the user put in a model folder is fine
        candidate = os.path.normpath(os.path.join(root, *parts))
        if os.path.commonpath([root, candidate]) == root and os.path.isfile(candidate):
            return candidate
    raise UserInputError(f"'{name}' was not found in {', '.join(roots) or 'models/' + kind}; put the file there "
                         "(or pick another one) and press R in ComfyUI to refresh the lists.")
