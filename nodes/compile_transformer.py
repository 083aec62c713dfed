"""TPU Compile Transformer: compiled mode and its options (scope, fullgraph, warm-up).

Where compiled graphs persist is a process setting (prestartup_script.py), not a node input.
"""

from comfy_api.latest import io

from tpu_diffusers_runtime.features.compilation import parse_sizes
from tpu_diffusers_runtime.plan import family_of
from tpu_diffusers_runtime.specs import CompileScope, CompileSpec, ExecutionMode
from tpu_diffusers_runtime.errors import UserInputError
from tpu_diffusers_runtime.input_checks import size_problem
from tpu_diffusers_runtime.tasks import validate_size
from .types import CATEGORY, TPUPipeline


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
                        "restarted ComfyUI starts warm: in ComfyUI/user/tpu_diffusers/compile_cache, or where "
                        "TPU_DIFFUSERS_COMPILE_CACHE says when ComfyUI starts; the Sampler's info names it.",
            inputs=[
                TPUPipeline.Input("pipeline", tooltip="The pipeline from TPU Loader or Mode Selector."),
                io.Combo.Input("scope", options=CompileScope, default=CompileScope.AUTO,
                               tooltip="whole: compile the whole transformer (pipeline on the chip). "
                                       "repeated_blocks: compile only the repeated blocks, compiling one block "
                                       "serves all; needed under model CPU offload, whose hooks cannot be "
                                       "traced. auto: repeated_blocks with offload, else whole."),
                io.Boolean.Input("fullgraph", default=True,
                                 tooltip="Require one graph with no breaks (fastest; fails loudly when something "
                                         "cannot be traced). Turn off to let torch fall back around such code."),
                io.String.Input("warmup_sizes", default="",
                                tooltip="Sizes to compile ahead the first time the pipeline is used, e.g. "
                                        "'1024x1024, 768x1344' (WIDTHxHEIGHT, comma separated). Edit models: "
                                        "'1024x1024@1024x768' also resizes the Sampler's images to 1024x768 for "
                                        "that warm-up (reference sizes change the compiled shape). Empty: none."),
            ],
            outputs=[TPUPipeline.Output(display_name="pipeline", tooltip="The pipeline, in compiled mode.")],
        )

    @classmethod
    def validate_inputs(cls, warmup_sizes: str | None = None) -> bool | str:
        """Checked when the prompt is queued, so bad warm-up sizes are refused on this node before any
        node runs; execute checks them again with the model's own rule. Fed by a link: None, checked
        when the node runs."""
        if warmup_sizes is None:
            return True
        try:
            sizes = parse_sizes(warmup_sizes)
        except UserInputError as e:
            return f"warmup_sizes: {e}"
        for width, height, *_ in sizes:
            if problem := size_problem("width", width) or size_problem("height", height):
                return f"warmup_sizes: {width}x{height}: {problem}"
        return True

    @classmethod
    def execute(cls, pipeline, scope: str, fullgraph: bool, warmup_sizes: str) -> io.NodeOutput:
        sizes = parse_sizes(warmup_sizes)
        family = family_of(pipeline)  # with the model's settings, which may change its size step
        for width, height, *_ in sizes:
            validate_size(family, width, height)
        spec = CompileSpec(scope=scope, fullgraph=fullgraph, warmup_sizes=sizes)
        return io.NodeOutput(pipeline.replace(mode=ExecutionMode.COMPILED, compile=spec))
