"""ComfyUI runs this file before it imports torch (main.py calls execute_prestartup_script() before
`import comfy.utils`): the one moment to set what TorchTPU and inductor read once, at backend start.

The settings live in runtime/process_env.py, which TP workers apply too. The runtime package is
loaded from this folder under a private module name, because the pack itself is imported later
under the name ComfyUI gives it, and this folder must not go on sys.path (ComfyUI has a top-level
module called `nodes`, like our package). Only torch-free modules are loaded here.
"""

import importlib
import importlib.util
import os
import sys


def _load_process_env():
    folder = os.path.join(os.path.dirname(os.path.abspath(__file__)), "runtime")
    spec = importlib.util.spec_from_file_location("_tpu_diffusers_prestartup_runtime",
                                                  os.path.join(folder, "__init__.py"),
                                                  submodule_search_locations=[folder])
    package = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = package
    spec.loader.exec_module(package)
    return importlib.import_module(spec.name + ".process_env")


def _comfyui_user_directory():
    """ComfyUI's user folder. main.py has imported folder_paths (which imports no torch) and applied
    --base-directory and --user-directory (apply_custom_paths) before it runs prestartup scripts, so
    ask folder_paths rather than parse sys.argv again; None outside ComfyUI."""
    folder_paths = sys.modules.get("folder_paths")
    return folder_paths.get_user_directory() if folder_paths is not None else None


process_env = _load_process_env()
process_env.apply(process_env.default_root(_comfyui_user_directory()))
