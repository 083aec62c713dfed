"""TPU Compile Transformer: compiled mode and its options (scope, fullgraph, warm-up, cache)."""

import dataclasses
import os

from comfy_api.latest import io

import folder_paths

from ..runtime.compile_cache import SCOPES, CompileSpec, cache_dir_inside, parse_sizes
from ..runtime.families import family_for
from ..runtime.modes import ExecutionMode
from ..runtime.sampling import validate_size
from .types import CATEGORY, TPUPipeline


CACHE_ROOT_NAME = "tpu_diffusers"


def default_cache_dir() -> str:
    return os.path.join(folder_paths.get_user_directory(), CACHE_ROOT_NAME, "compile_cache")


class TPUCompileTransformer(io.ComfyNode):
    @classmethod
    def define_schema(cls) -> io.Schema:
        return io.Schema(
            node_id="TPUCompileTransformer",
            display_name="TPU Compile Transformer",
            category=CATEGORY,
            description="Runs the transformer compiled (torch.compile, backend tpu on TPU, inductor on CUDA/CPU) "
                        "with static shapes. Each new image size compiles once (minutes on TPU); sizes already "
                        "seen, other step counts and prompts reuse it. Compiled graphs persist on disk, so a "
                        "restarted ComfyUI starts warm.",
            inputs=[
                TPUPipeline.Input("pipeline", tooltip="The pipeline from TPU Loader or Mode Selector."),
                io.Combo.Input("scope", options=list(SCOPES), default="auto",
                               tooltip="whole: compile the whole transformer (pipeline on the chip). "
                                       "repeated_blocks: compile only the repeated blocks, compiling one block "
                                       "serves all; needed under model CPU offload, whose hooks cannot be "
                                       "traced. auto: repeated_blocks with offload, else whole."),
                io.Boolean.Input("fullgraph", default=True,
                                 tooltip="Require one graph with no breaks (fastest; fails loudly when something "
                                         "cannot be traced). Turn off to let torch fall back around such code."),
                io.String.Input("warmup_sizes", default="",
                                tooltip="Sizes to compile ahead the first time the pipeline is used, e.g. "
                                        "'1024x1024, 768x1344' (WIDTHxHEIGHT, comma separated). Empty: none."),
                io.String.Input("cache_dir", default="",
                                tooltip="Where compiled graphs persist across restarts: a folder inside "
                                        "ComfyUI/user/tpu_diffusers. Empty: ComfyUI/user/tpu_diffusers/compile_cache. "
                                        "Delete the folder to clear it."),
            ],
            outputs=[TPUPipeline.Output(display_name="pipeline", tooltip="The pipeline, in compiled mode.")],
        )

    @classmethod
    def execute(cls, pipeline, scope: str, fullgraph: bool, warmup_sizes: str, cache_dir: str) -> io.NodeOutput:
        sizes = parse_sizes(warmup_sizes)
        family = family_for(pipeline.pipeline_class)
        for width, height in sizes:
            validate_size(family, width, height)
        cache_root = os.path.join(folder_paths.get_user_directory(), CACHE_ROOT_NAME)
        spec = CompileSpec(scope=scope, fullgraph=fullgraph, warmup_sizes=sizes,
                           cache_dir=cache_dir_inside(cache_root, cache_dir.strip()) if cache_dir.strip()
                           else default_cache_dir())
        return io.NodeOutput(dataclasses.replace(pipeline, mode=ExecutionMode.COMPILED, compile=spec))
