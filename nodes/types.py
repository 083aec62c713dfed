"""Edge types shared by our nodes."""

import functools

from comfy_api.latest import io
from comfy_execution.validation import validate_node_input

from tpu_diffusers_runtime.handle import PipelineHandle


@io.comfytype(io_type="TPU_PIPELINE")
class TPUPipeline(io.ComfyTypeIO):
    """A lazy description of what to run (runtime.handle.PipelineHandle), never a loaded model."""

    Type = PipelineHandle


@io.comfytype(io_type="TPU_LATENT_UPSCALER")
class TPUUpscaler(io.ComfyTypeIO):
    """A latent upscaler's absolute path (a file or a diffusers folder), checked by the TPU Latent Upscale Model:
    a plain string, so it travels in the request to worker processes."""

    Type = str


@io.comfytype(io_type="TPU_VIDEO_REFERENCES")
class TPUReferences(io.ComfyTypeIO):
    """A reference to video run's references in order (runtime.references.Reference: arrays and rates), built by a
    chain of TPU Video Reference nodes."""

    Type = tuple


CATEGORY = "TPU Diffusers"


@functools.cache
def link_types(node: type[io.ComfyNode]) -> dict[str, str]:
    """{input: the io type a link into it must carry}, from the node's schema: ComfyUI leaves link types to a node
    whose validate_inputs reads input_types, so it checks them with this."""
    return {node_input.id: node_input.get_io_type() for node_input in node.define_schema().inputs}


def link_problem(node: type[io.ComfyNode], input_types: dict) -> str | None:
    """A link of the wrong type into one of the node's inputs (ComfyUI's `input_types`: {input: the type its link
    carries}), for a node whose validate_inputs reads input_types: ComfyUI then leaves link types to it."""
    expected = link_types(node)
    for name, received in input_types.items():
        if name in expected and not validate_node_input(received, expected[name]):
            article = "an" if str(received)[:1] in tuple("AEIOU") else "a"
            return f"{name} takes {expected[name]}, but {article} {received} output is connected to it."
    return None
