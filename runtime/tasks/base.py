"""What every task shares: the request, its checks, and the calls into a diffusers pipeline.

Seeds go through one CPU `torch.Generator` per image (seed, seed+1, ...), as the guide does, so a seed
gives the same image on every device and in every batch position. A task whose inputs include images makes
one pipeline call per output image: diffusers' batched image-to-image and inpaint calls encode the image with
the first generator only (and some image-to-image classes fail with a list of them), so a batch there would not be
what batches of one with seed + i give.
"""

from __future__ import annotations

import contextlib
import dataclasses
from typing import Callable

from .. import pipeline_kinds
from ..features import offload
from ..errors import UserInputError
from ..families import FAMILIES, Family, TaskPipeline
from ..input_checks import frames_problem, prompt_problem, sigmas_problem, size_problem
from ..preview import Previewer, PreviewSpec
from ..references import Reference
from ..modes import outside_inference_mode
from ..outputs import IMAGES, KINDS, LATENT, MASK, CallResult, OutputKind, Outputs, joined
from . import images

# on_step(done, total[, preview]): called after each denoising step; it may raise to cancel the run.
# With a PreviewSpec it also gets the step's preview (an RGB uint8 array, or None).
StepCallback = Callable[..., None]

MAX_SEED = 2**64 - 1  # ComfyUI's seed widgets go up to here; torch.Generator takes all of it
SINGLE_ARRAYS = ("mask", "latent", "reference_video")  # one array or None each
WIRE_ARRAYS = ("images", *SINGLE_ARRAYS)  # what travels to workers as binary payloads


@dataclasses.dataclass(frozen=True)
class SampleRequest:
    """One Sampler run. The images are the connected image inputs in order (image, image_2, image_3; the Video
    Sampler's image, last_image), each a
    float32 [N, H, W, C] array in 0..1 (ComfyUI's IMAGE); the mask is float32 [M, H, W], 1 = repaint. Output
    image i takes item i % N of each (and of the mask): a batch of N images gives N results at batch size N.
    The latent is a connected LATENT's samples (ComfyUI's format for the family, float32) to start image to
    image from instead of an image; output image i takes its item i % N. The reference video (the Video Sampler's
    reference_video: its frames, float32 [F, H, W, C]) conditions every video in context (IC-LoRA)."""

    prompt: str
    negative_prompt: str = ""
    width: int = 1024  # 0: the first image's width, rounded to the family's multiple (resolve_size)
    height: int = 1024
    steps: int = 4
    guidance: float = 0.0
    seed: int = 0
    batch_size: int = 1
    denoise: float = 1.0  # diffusers' strength: how much of the image is replaced; about the last steps x denoise run
    first_image: int = 0  # image 0 here is image first_image of the Sampler's batch (a replica's share): pairing
    frames: int = 0  # video: frames of each video (temporal factor x k + 1); 0: images
    # a model whose blocks first rewrite the prompt with a language model (ModularBlocks.prompt_upsampler) does so, as
    # diffusers does by default; False: the prompt is encoded as written. Models without one ignore it.
    upsample_prompt: bool = True
    # a latent upscaler's absolute path (file or folder): the family's two-stage generation (Family.two_stage) at
    # half size, latent upscale x2, refine; "": one stage at the asked size
    upscaler: str = ""
    # the denoising schedule as given (a SIGMAS input without its final 0; steps = its length), for a family that
    # takes one (Family.sigmas_as_given); (): the pipeline's own schedule of `steps`
    sigmas: tuple = ()
    images: tuple = dataclasses.field(default=(), compare=False)
    mask: object = dataclasses.field(default=None, compare=False)
    latent: object = dataclasses.field(default=None, compare=False)
    reference_video: object = dataclasses.field(default=None, compare=False)
    # reference to video's references in the order the prompt names them (runtime/references.py)
    references: tuple = dataclasses.field(default=(), compare=False)
    # its IC-LoRA's reference_downscale_factor (the LoRA file's metadata, set when the run is planned): the reference
    # is encoded at 1/factor of the video's width and height
    reference_downscale: int = 1

    def __post_init__(self):
        import numpy as np

        def batch(array, dims: int):  # a numpy array, or a torch tensor on any device (ComfyUI's IMAGE, MASK)
            if hasattr(array, "detach"):
                array = array.detach().cpu()
            array = np.ascontiguousarray(np.asarray(array, dtype=np.float32))
            return array[None] if array.ndim == dims - 1 else array

        object.__setattr__(self, "images", tuple(batch(image, 4) for image in self.images))
        object.__setattr__(self, "sigmas", tuple(float(s) for s in self.sigmas))
        if self.mask is not None:
            object.__setattr__(self, "mask", batch(self.mask, 3))
        if self.latent is not None:
            object.__setattr__(self, "latent", batch(self.latent, 0))  # any rank: 4-D, or 5-D for a video VAE
        if self.reference_video is not None:  # diffusers encodes only the first `frames` of it: the rest stays here
            video = batch(self.reference_video, 4)
            object.__setattr__(self, "reference_video", video[:self.frames] if self.frames else video)
        object.__setattr__(self, "references", tuple(self.references))

    def to_wire(self) -> tuple[dict, list]:
        """Plain JSON data and the arrays' bytes, for worker processes (images travel as binary payloads)."""
        singles = {name: getattr(self, name) for name in SINGLE_ARRAYS}
        data = {f.name: getattr(self, f.name) for f in dataclasses.fields(self) if f.name not in WIRE_ARRAYS}
        data.update(image_shapes=[list(image.shape) for image in self.images],
                    **{f"{name}_shape": None if array is None else list(array.shape)
                       for name, array in singles.items()})
        given = [array for array in singles.values() if array is not None]
        references = [reference.to_wire() for reference in self.references]
        data["references"] = [described for described, _ in references]
        given += [array for _, arrays in references for array in arrays]
        return data, [memoryview(array).cast("B") for array in (*self.images, *given)]

    @classmethod
    def from_wire(cls, data: dict, payloads: list) -> "SampleRequest":
        import numpy as np

        shape_keys = ("image_shapes", "references", *(f"{name}_shape" for name in SINGLE_ARRAYS))
        fields = {k: v for k, v in data.items() if k not in shape_keys}
        singles = [name for name in SINGLE_ARRAYS if data.get(f"{name}_shape")]
        shapes = [*data.get("image_shapes", ()), *(data[f"{name}_shape"] for name in singles)]
        described = data.get("references", ())
        if len(shapes) + sum(map(Reference.payload_count, described)) != len(payloads):
            raise UserInputError(f"the request names {len(shapes)} image arrays and {len(described)} references but "
                                 f"carries {len(payloads)} arrays")
        arrays = [np.frombuffer(payload, dtype=np.float32).reshape(shape) for payload, shape in zip(payloads, shapes)]
        images = arrays[:len(data.get("image_shapes", ()))]
        rest = iter(payloads[len(shapes):])
        references = tuple(Reference.from_wire(one, [next(rest) for _ in range(Reference.payload_count(one))])
                           for one in described)
        return cls(**fields, images=tuple(images), references=references,
                   **dict(zip(singles, arrays[len(images):])))

    def output_bytes(self) -> int:
        """The size of what the request makes: ComfyUI's IMAGE batch in float32, frame after frame of a video."""
        return 4 * 3 * self.width * self.height * self.batch_size * max(self.frames, 1)

    def batch_slice(self, start: int, count: int) -> "SampleRequest":
        """Images start .. start + count - 1 of this request's batch as a request of their own (a replica's
        share): seed + start, and each output image keeps the input images it pairs with."""
        return dataclasses.replace(self, seed=(self.seed + start) % (MAX_SEED + 1), batch_size=count,
                                   first_image=self.first_image + start)


class Task:
    """One kind of generation (text to image, ...): what it checks, what it passes to the pipeline's
    __call__ (one call per output image when images go in), and the host memory its output needs."""

    name: str
    per_image = True  # one pipeline call per output image (see the module docstring)
    count_kwarg = "num_images_per_prompt"  # the __call__ argument for outputs per prompt

    def validate(self, family: Family, pipeline: TaskPipeline, request: SampleRequest) -> None:
        """Reject what the family and its pipeline cannot take, with a message that says what to change."""
        if problem := prompt_problem(request.prompt, family.name):
            raise UserInputError(problem)
        if request.steps < 1:
            raise UserInputError(f"steps is {request.steps}; at least 1 denoising step is needed "
                                 f"({family.name} models usually use {family.default_steps}).")
        if request.batch_size < 1:
            raise UserInputError(f"batch size is {request.batch_size}; it must be at least 1.")
        if not 0 <= request.seed <= MAX_SEED:
            raise UserInputError(f"seed {request.seed} is outside 0..{MAX_SEED}.")
        validate_size(family, request.width, request.height)
        validate_frames(family, request.frames)
        images.validate(pipeline, request)
        if request.latent is not None:
            validate_latent(family, pipeline, request)
        if request.upscaler:
            validate_two_stage(family, request)
        if request.sigmas:
            validate_sigmas(family, request)

    def image_kwargs(self, pipeline: TaskPipeline, request: SampleRequest, index: int) -> dict:
        """The image arguments of the call for image `index` of the Sampler's batch (none for text to image)."""
        raise NotImplementedError

    def calls(self, family: Family, pipeline: TaskPipeline, request: SampleRequest) -> list[dict]:
        """The keyword arguments of each pipeline call, in batch order."""
        kwargs = dict(prompt=request.prompt, height=request.height, width=request.width,
                      num_inference_steps=request.steps, output_type="pt")
        kwargs[family.guidance_kwarg] = request.guidance
        if family.takes_negative_prompt:
            # some pipelines run true CFG only when a negative prompt is given: the family's default_negative_prompt.
            kwargs["negative_prompt"] = request.negative_prompt or family.default_negative_prompt
        if family.fps_kwarg:
            kwargs[family.fps_kwarg] = family.fps
        if pipeline.max_area:
            kwargs["max_area"] = request.width * request.height
        if pipeline.strength:
            kwargs["strength"] = request.denoise
        if request.sigmas:
            kwargs["sigmas"] = list(request.sigmas)
        kwargs.update(self.extra_kwargs(request))
        every = generators(request)
        if not self.per_image:
            return [dict(kwargs, generator=every, **{self.count_kwarg: request.batch_size})]
        return [dict(kwargs, generator=generator, **{self.count_kwarg: 1},
                     **self.image_kwargs(pipeline, request, request.first_image + i))
                for i, generator in enumerate(every)]

    def extra_kwargs(self, request: SampleRequest) -> dict:
        """Call arguments of this task beside the shared ones and the images (a video's frame count)."""
        return {}

    def output_kinds(self, family: Family) -> tuple[OutputKind, ...]:
        """What a run returns: the decoded images, their alpha as a MASK where the family decodes one, and the LATENT
        where the family has ComfyUI's format for it."""
        return (KINDS[IMAGES], *((KINDS[MASK],) if family.decodes_alpha else ()),
                *((KINDS[LATENT],) if family.comfy_latent else ()))

    def call_batch(self, request: SampleRequest) -> int:
        """Images one pipeline call makes (what a compiled denoiser's input shape sees)."""
        return 1 if self.per_image else request.batch_size

    def call_count(self, request: SampleRequest) -> int:
        """Pipeline calls the request makes (none for a share of no images)."""
        return request.batch_size if self.per_image else min(request.batch_size, 1)

    def host_bytes(self, request: SampleRequest) -> int:
        """Host memory the output alone needs, checked before anything is allocated: the pipeline's float32
        output and the IMAGE tensor made from it, 2 x 4 bytes per value."""
        return 2 * request.output_bytes()

    def run(self, pipe, family: Family, pipeline: TaskPipeline, request: SampleRequest,
            on_step: StepCallback | None = None, preview: PreviewSpec | None = None,
            outputs: tuple[str, ...] | None = None, upsample=None, decode=None) -> Outputs:
        """Sample with `pipe` (a loaded pipeline of `pipeline`'s class): each of `outputs`' values (kind names, as
        the request's plan says; None: `output_kinds`'), the
        images a float32 CPU tensor [B, H, W, C] in 0..1 (ComfyUI's IMAGE). Without a preview spec the step
        callback never touches the latents, so previews cost nothing when off; the LATENT keeps only the last
        step's (a reference, copied once when the call ends). With the request's upscaler, each call runs the
        family's two stages, `upsample` (the upscaler's pipeline on `pipe`'s VAE) between them. With `decode` (the
        family's latent decoder's pipeline), each call returns latents that it decodes (Family.latent_decoder)."""
        self.validate(family, pipeline, request)
        calls = self.calls(family, pipeline, request)
        kinds = self.output_kinds(family) if outputs is None else tuple(KINDS[name] for name in outputs)
        parts = {kind: [] for kind in kinds}
        keep_latents = any(kind.needs_final_latents for kind in kinds)
        two_stage = family.two_stage if request.upscaler else None
        for call, kwargs in enumerate(calls):
            final = {}
            if request.latent is not None:  # ComfyUI's LATENT -> the latents the pipeline starts from
                kwargs = dict(kwargs, image=family.comfy_latent.to_pipeline(pipe, kwargs["image"]))

            def run_stage(stage_pipe, stage_kwargs, stage=0, call=call, final=final):
                # one sampling call: the only one, or a stage of two (the refine's steps count after the first's)
                previewer = (Previewer(preview, stage_pipe, family, stage_kwargs["height"], stage_kwargs["width"])
                             if preview and on_step else None)

                def step_end(step, steps, latents):
                    # `steps`: the pipeline's own count of the timesteps it runs (with denoise < 1 each pipeline skips
                    # the first ones by a rule of its own): the calls differ only in images and seeds, so each runs as
                    # many.
                    if keep_latents:
                        final["latents"] = latents
                    per_call = request.steps + two_stage.refine_steps if two_stage else steps
                    done = call * per_call + (request.steps if stage else 0) + step + 1
                    if previewer:
                        on_step(done, len(calls) * per_call, previewer(latents))
                    elif on_step:
                        on_step(done, len(calls) * per_call)

                # sigmas as given where the family says how (a SIGMAS input, a two-stage refine); a family without that
                # hook passes any sigmas of its own recipe to its scheduler as it is
                given = family.sigmas_as_given if "sigmas" in stage_kwargs else None
                with given(stage_pipe) if given else contextlib.nullcontext():
                    return pipeline_kinds.call(stage_pipe, family, stage_kwargs, step_end)

            if decode is not None:
                kwargs = dict(kwargs, output_type="latent")
            with outside_inference_mode():  # either pipeline kind, classic or modular
                output = two_stage.run(pipe, upsample, kwargs, run_stage) if two_stage else run_stage(pipe, kwargs)
                if decode is not None:
                    output = family.latent_decoder.decode(pipe, decode, output, kwargs["generator"])
            offload.end_run(pipe)  # under model CPU offload, every model back on the host (either kind)
            made = CallResult(output, final.get("latents"), pipe, family)
            for kind in kinds:
                parts[kind].append(kind.take(made))
        return joined(parts)


def generators(request: SampleRequest) -> list:
    """One CPU generator per image: image i of a batch is what a batch of one with seed + i gives."""
    import torch

    return [torch.Generator("cpu").manual_seed((request.seed + i) % (MAX_SEED + 1)) for i in range(request.batch_size)]


def resolve_size(family: Family, pipeline: TaskPipeline, request: SampleRequest) -> SampleRequest:
    """Width or height 0: the first image's, rounded to the nearest multiple of the family's size step (or,
    for a pipeline that sets its output size itself, that size; another size asked of it is refused)."""
    if request.images:
        _, height, width, _ = request.images[0].shape
        if pipeline.output_size:
            made = pipeline.output_size(width, height)
            if (request.width or made[0], request.height or made[1]) != made:
                raise UserInputError(
                    f"{pipeline.cls} makes {made[0]}x{made[1]} from this {width}x{height} image "
                    f"({pipeline.output_size_words}, whatever size is asked), not {request.width}x{request.height}: "
                    f"set width and height to 0 or to {made[0]}x{made[1]}.")
            return dataclasses.replace(request, width=made[0], height=made[1])
    if request.latent is not None and family.comfy_latent and request.latent.ndim >= 4:
        factor = family.comfy_latent.factor  # the latent's size: its last two axes
        height, width = (size * factor for size in request.latent.shape[-2:])
        return dataclasses.replace(request, width=request.width or width, height=request.height or height)
    if request.width and request.height:
        return request
    if not request.images:
        raise UserInputError("width or height is 0, which means 'the image's size', but no image is connected: "
                             "connect an image or set the size.")
    step = family.size_multiple
    size = {name: max(step, (value + step // 2) // step * step)  # nearest multiple, halves up
            for name, value in (("width", width), ("height", height))}
    return dataclasses.replace(request, width=request.width or size["width"], height=request.height or size["height"])


def validate_size(family: Family, width: int, height: int) -> None:
    for name, value in (("width", width), ("height", height)):
        if problem := size_problem(name, value, family):
            raise UserInputError(problem)
    if family.canvas_rule and (problem := family.canvas_rule.problem(width, height, family.size_multiple, family.name)):
        raise UserInputError(problem)


def validate_two_stage(family: Family, request: SampleRequest) -> None:
    """An upscaler: the family must have a two-stage generation, the size a multiple of twice its size step (the first
    stage samples at half of it), the file or folder an upscaler of its kind."""
    from .. import upscalers

    if family.two_stage is None:
        with_one = [f.name for f in FAMILIES if f.two_stage]
        raise UserInputError(f"{family.name} has no two-stage generation with a latent upscaler (models that do: "
                             f"{', '.join(with_one)}): disconnect the upscaler.")
    step = 2 * family.size_multiple
    for name, value in (("width", request.width), ("height", request.height)):
        if value % step:
            lower = max(step, value // step * step)
            raise UserInputError(f"{name} {value} cannot be used with a latent upscaler: {family.name} samples at half "
                                 f"the size first, so it must be a multiple of {step} (2 x {family.size_multiple}): "
                                 f"{lower} or {lower + step}.")
    upscalers.check(request.upscaler, family.two_stage)


def validate_sigmas(family: Family, request: SampleRequest) -> None:
    """A SIGMAS schedule: the family must take one, the values be a flow-matching schedule, one per step."""
    if family.sigmas_as_given is None:
        with_them = [f.name for f in FAMILIES if f.sigmas_as_given]
        raise UserInputError(f"{family.name} takes no sigmas schedule (models that do: {', '.join(with_them)}): "
                             "disconnect sigmas and set steps instead.")
    if problem := sigmas_problem(request.sigmas):
        raise UserInputError(problem)
    if len(request.sigmas) != request.steps:  # the Video Sampler sets steps from them; a request made otherwise
        raise UserInputError(f"{len(request.sigmas)} sigmas make {len(request.sigmas)} steps, but steps is "
                             f"{request.steps}: a schedule's steps are its sigmas but the final 0.")


def validate_latent(family: Family, pipeline: TaskPipeline, request: SampleRequest) -> None:
    """A LATENT to start image to image from: the family's pipeline must take latents, and these must be of
    its VAE's latent space (channels, layout) at the output size."""
    form = family.comfy_latent
    if form is None or form.to_pipeline is None or not pipeline.strength:
        raise UserInputError(f"{family.name} ({pipeline.cls}) cannot start from a latent: connect an image "
                             "instead (VAE Decode the latent), or disconnect the latent.")
    shape = tuple(request.latent.shape)
    wanted = form.shape(shape[0], request.width, request.height)
    if shape != wanted:
        layout = "[batch, channels, 1, height, width]" if form.frame_axis else "[batch, channels, height, width]"
        raise UserInputError(
            f"the latent has shape {list(shape)}, but {family.name} at {request.width}x{request.height} takes "
            f"{list(wanted)} ({layout}, {form.channels} channels, 1/{form.factor} of the image size): connect a "
            f"latent of this model's VAE, and set width and height to 0 (the latent's size) or to its size.")


def validate_frames(family: Family, frames: int) -> None:
    """A video family's frame count is temporal_factor x k + 1; an image family takes none."""
    if not family.makes_video:
        if frames:
            raise UserInputError(f"{family.name} makes images, not video: sample it with TPU Sampler, not the TPU "
                                 "Video Sampler.")
        return
    if not frames:
        raise UserInputError(f"{family.name} makes video: sample it with the TPU Video Sampler (it has the frames "
                             "input), not TPU Sampler.")
    if problem := frames_problem(frames, family):
        raise UserInputError(problem)
