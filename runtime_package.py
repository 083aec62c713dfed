"""The runtime's one import name, `tpu_diffusers_runtime`, in every process that uses it.

ComfyUI imports this pack under a name of its own choosing (the folder's), its prestartup script runs
before that, and worker ranks, tests, tools and benchmarks run without ComfyUI. All of them load the
`runtime/` folder through `load()`, so each class exists once per process (an error raised in one
module is caught by its class everywhere). The folder is loaded from its path instead of being put on
sys.path: this folder also holds `nodes/`, and ComfyUI has a top-level module named `nodes`.
"""

import importlib.util
import os
import sys

NAME = "tpu_diffusers_runtime"
FOLDER = os.path.join(os.path.dirname(os.path.abspath(__file__)), "runtime")


def load():
    """The runtime package, loaded once per process (its __init__ imports no torch)."""
    if NAME not in sys.modules:
        spec = importlib.util.spec_from_file_location(NAME, os.path.join(FOLDER, "__init__.py"),
                                                      submodule_search_locations=[FOLDER])
        package = importlib.util.module_from_spec(spec)
        sys.modules[NAME] = package
        try:
            spec.loader.exec_module(package)
        except BaseException:
            del sys.modules[NAME]
            raise
    return sys.modules[NAME]
