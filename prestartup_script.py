"""ComfyUI runs this file before it imports torch (main.py calls execute_prestartup_script() before
`import comfy.utils`): the one moment to set what TorchTPU and inductor read once, at backend start.

The settings live in runtime/process_env.py, which worker processes apply too. The runtime is loaded
under its one import name (runtime_package.py); only torch-free modules are imported here.
"""

import importlib.util
import os
import sys


def _load_runtime():
    path = os.path.join(os.path.dirname(os.path.abspath(__file__)), "runtime_package.py")
    spec = importlib.util.spec_from_file_location("_tpu_diffusers_runtime_package", path)
    loader = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(loader)
    return loader.load()


def _comfyui_user_directory():
    """ComfyUI's user folder. main.py has imported folder_paths (which imports no torch) and applied
    --base-directory and --user-directory (apply_custom_paths) before it runs prestartup scripts, so
    ask folder_paths rather than parse sys.argv again; None outside ComfyUI."""
    folder_paths = sys.modules.get("folder_paths")
    return folder_paths.get_user_directory() if folder_paths is not None else None


process_env = importlib.import_module(_load_runtime().__name__ + ".process_env")
process_env.apply(process_env.default_root(_comfyui_user_directory()))
process_env.keep_tpu_out_of_comfyui()
