"""TPU Sampler: realises the pipeline (load once, reuse after) and generates images, from text alone or from
images (image to image, inpaint, edit: the task follows from the model and the connected inputs)."""

from comfy_api.latest import io

from tpu_diffusers_runtime.engine import ENGINE
from tpu_diffusers_runtime.families import EDIT, FAMILIES, listed
from tpu_diffusers_runtime.input_checks import (IMAGE_INPUTS, MAX_SIZE, denoise_problem, image_inputs_problem,
                                                prompt_problem, queued_size_problem)
from tpu_diffusers_runtime.tasks import MAX_SEED, SampleRequest
from .comfy_progress import ComfyProgress, preview_spec
from .types import CATEGORY, TPUPipeline, link_problem

IMAGE_FAMILIES = [family for family in FAMILIES if not family.makes_video]
UPSAMPLER_FAMILIES = [family for family in IMAGE_FAMILIES if any(b.prompt_upsampler for b in family.modular.values())]
ALPHA_FAMILIES = listed(family for family in IMAGE_FAMILIES if family.decodes_alpha)
EDIT_FAMILIES = [family for family in IMAGE_FAMILIES if any(EDIT in tasks for tasks in family.model_classes.values())]
# the families whose image to image starts from a LATENT (`ComfyLatent.to_pipeline`)
LATENT_IN_FAMILIES = listed(family for family in IMAGE_FAMILIES if family.comfy_latent and family.comfy_latent.to_pipeline)


def families_taking(images: int) -> str:
    """The image families with a task that takes this many images, for the image inputs' tooltips."""
    return listed(family for family in IMAGE_FAMILIES if any(
        pipeline.images >= images for tasks in family.model_classes.values() for pipeline in tasks.values()))


def queue_time_problem(node, input_types: dict, prompt, width, height) -> str | None:
    """What a sampler node refuses when the prompt is queued, whatever the model: a link of the wrong type, an empty
    prompt, a size no supported model takes (size 0 = the image's, so it needs an image). Inputs fed by a link
    arrive as None and are checked when it runs."""
    problem = link_problem(node, input_types)
    if not problem and isinstance(prompt, str):
        problem = prompt_problem(prompt)
    for name, value in (("width", width), ("height", height)):
        if not problem and isinstance(value, int):
            problem = queued_size_problem(name, value, bool({"image", "latent"} & set(input_types)))
    return problem


class TPUSampler(io.ComfyNode):
    @classmethod
    def define_schema(cls) -> io.Schema:
        return io.Schema(
            node_id="TPUSampler",
            display_name="TPU Sampler",
            category=CATEGORY,
            description="Loads the pipeline on first use (later runs reuse it) and generates images. No image: text "
                        f"to image. An image: image to image, or an edit on an edit model ({listed(EDIT_FAMILIES)}). "
                        "Image + mask: inpaint. Shows progress and a preview "
                        "per step (ComfyUI's --preview-method). Cancel stops sampling at the end of the running "
                        "step, and loading between components.",
            inputs=[
                TPUPipeline.Input("pipeline", tooltip="The pipeline from TPU Loader or Mode Selector."),
                io.String.Input("prompt", multiline=True, default="a golden retriever surfing a wave, photorealistic",
                                tooltip="What to generate, or for an edit model what to change. Required."),
                io.String.Input("negative_prompt", multiline=True, default="",
                                tooltip="What to avoid. Used by "
                                        f"{listed(f for f in IMAGE_FAMILIES if f.takes_negative_prompt)} (where "
                                        "guidance runs CFG); "
                                        f"{listed(f for f in IMAGE_FAMILIES if not f.takes_negative_prompt)} "
                                        "take none."),
                io.Int.Input("width", default=1024, min=0, max=MAX_SIZE, step=16,
                             tooltip="Image width in pixels; a multiple of 16. 0 = the image's width (rounded to "
                                     "16); otherwise the image is resized to width x height."),
                io.Int.Input("height", default=1024, min=0, max=MAX_SIZE, step=16,
                             tooltip="Image height in pixels; a multiple of 16. 0 = the image's height."),
                io.Int.Input("steps", default=4, min=1, max=1000,
                             tooltip="Denoising steps (each model's usual count: "
                                     f"{', '.join(f'{f.name} {f.default_steps}' for f in IMAGE_FAMILIES)})."),
                io.Float.Input("guidance", default=3.5, min=0.0, max=100.0, step=0.1,
                               tooltip="Guidance scale (" + "; ".join(
                                   f"{f.name}: {f.guidance_hint}" for f in IMAGE_FAMILIES if f.guidance_hint) + ")."),
                io.Int.Input("seed", default=0, min=0, max=MAX_SEED, control_after_generate=True,
                             tooltip="Random seed; the same seed gives the same image on TPU, GPU and CPU."),
                io.Int.Input("batch_size", default=1, min=1, max=64,
                             tooltip="Images per run; image i uses seed + i (and item i of an image batch)."),
                # optional: an API-format prompt saved before this input existed has no denoise and still runs
                io.Float.Input("denoise", default=1.0, min=0.0, max=1.0, step=0.01, optional=True,
                               tooltip="Image to image and inpaint: how much of the image is replaced (diffusers' "
                                       "strength). About the last steps x denoise steps run: 20 steps at 0.6 run 12 "
                                       "(each model rounds its own way; the progress bar counts what runs). "
                                       "1.0 without an image; edit models take only 1.0."),
                io.Image.Input("image", optional=True,
                               tooltip="The image to start from, repaint or edit (Load Image). Its batch pairs with "
                                       "the output batch: image i uses item i % N."),
                io.Image.Input("image_2", optional=True,
                               tooltip=f"A second reference image, or inpaint's reference, for models that take "
                                       f"one ({families_taking(2)})."),
                io.Image.Input("image_3", optional=True,
                               tooltip=f"A third reference image, for models that take one ({families_taking(3)})."),
                io.Mask.Input("mask", optional=True,
                              tooltip="Inpaint: 1 (white) = repaint, 0 = keep, as Load Image's mask. Resized to the "
                                      "image when its size differs."),
                io.Latent.Input("latent", optional=True,
                                tooltip=f"Image to image from latents instead of an image ({LATENT_IN_FAMILIES}: a "
                                        "LATENT of the same VAE, e.g. this node's or VAE Encode's), with denoise as "
                                        "for an image. Connect either image or latent."),
                # appended after the others, so workflows saved before it keep their widget values in place
                io.Boolean.Input("prompt_upsampling", default=True, optional=True,
                                 tooltip="For models that ship a prompt upsampler ("
                                         f"{listed(UPSAMPLER_FAMILIES)}"
                                         "): it first rewrites the prompt into the detailed caption the model is "
                                         "trained on, as diffusers does by default (its model's folder must hold it). "
                                         "Off: the prompt is encoded as written. Other models ignore it."),
            ],
            outputs=[
                io.Image.Output(display_name="images", tooltip="Connect to Save Image or Preview Image."),
                io.String.Output(display_name="info",
                                 tooltip="Device, the task and diffusers class that ran, the mode, load and "
                                         "sampling times."),
                io.Latent.Output(display_name="latent",
                                 tooltip="The images' latents in ComfyUI's format for the model (not for video), so "
                                         "ComfyUI's VAE Decode with the same VAE file gives these images, and latent "
                                         "nodes (Latent Upscale, a KSampler second pass) can follow."),
                # appended after the others, so the links of workflows saved before it keep their output indices
                io.Mask.Output(display_name="mask",
                               tooltip=f"The images' alpha for models that make one ({ALPHA_FAMILIES}), as ComfyUI's "
                                       "masks are: 1 - alpha, 1 = transparent (background), as Load Image gives a "
                                       "PNG's alpha; Join Image with Alpha of images and mask is the transparent "
                                       "image. Other models make opaque images: an all-0 mask."),
            ],
        )

    @classmethod
    def validate_inputs(cls, input_types: dict | None = None, prompt: str | None = None, width: int | None = None,
                        height: int | None = None, denoise: float | None = None) -> bool | str:
        """Checked when the prompt is queued, so a bad request is refused on this node before any node runs:
        what every supported family needs, and which inputs are connected (each model's own rules are checked
        when it runs, before it loads). ComfyUI skips its min/max check for the inputs named here, and its
        link type check for a node that reads input_types, so both are done here. An input fed by a link
        arrives as None; a value that is not a number has already been reported by ComfyUI's own conversion.
        (A ComfyUI that passes no input_types leaves the link checks to the run, which makes them again.)"""
        input_types = input_types or {}
        problem = (queue_time_problem(cls, input_types, prompt, width, height)
                   or image_inputs_problem(tuple(name for name in IMAGE_INPUTS if name in input_types),
                                           "mask" in input_types, "latent" in input_types))
        if not problem and isinstance(denoise, (int, float)):
            problem = denoise_problem(denoise, bool({"image", "latent"} & set(input_types)))
        return problem or True

    @classmethod
    def execute(cls, pipeline, prompt: str, negative_prompt: str, width: int, height: int, steps: int,
                guidance: float, seed: int, batch_size: int, denoise: float = 1.0, image=None, image_2=None,
                image_3=None, mask=None, latent=None, prompt_upsampling: bool = True) -> io.NodeOutput:
        images = tuple(i for i in (image, image_2, image_3) if i is not None)
        request = SampleRequest(prompt=prompt, negative_prompt=negative_prompt, width=width, height=height,
                                steps=steps, guidance=guidance, seed=seed, batch_size=batch_size, denoise=denoise,
                                images=images, mask=mask, latent=None if latent is None else latent["samples"],
                                upsample_prompt=prompt_upsampling)
        generation = ENGINE.generate(pipeline, request, on_progress=ComfyProgress(),
                                     preview=preview_spec(pipeline))
        info = generation.info
        # ComfyUI sends the ui dict to the page (`executed`, where web/tpu_diffusers.js shows it on
        # our nodes) and keeps it in the prompt's history, where API clients read it.
        return io.NodeOutput(generation.images, info.summary(), generation.latent, alpha_mask(generation),
                             ui={"tpu_run_info": [info.as_dict()]})


def alpha_mask(generation):
    """The MASK output: the decoded alpha as ComfyUI's mask (1 - alpha), or for a model that decodes none an all-0
    mask of the images' size: its images are opaque, which is what the zero mask says (Load Image gives a PNG without
    alpha a zero mask too). Chosen over ComfyUI's ExecutionBlocker, which would fail every node fed by it: a workflow
    that joins images with this mask then works the same for every model."""
    import torch

    if generation.mask is not None:
        return generation.mask
    return torch.zeros(generation.images.shape[:3], dtype=torch.float32)
