"""What a family is: the classes its modules fill in. A leaf module: it imports nothing of the pack."""

from __future__ import annotations

import dataclasses
import importlib.util
import math
from typing import Callable, Mapping

# Task names (runtime/tasks has what each one checks and passes; a family names the class that runs it).
TEXT2IMAGE = "text2image"
IMAGE2IMAGE = "image2image"
INPAINT = "inpaint"
EDIT = "edit"
TEXT2VIDEO = "text2video"
IMAGE2VIDEO = "image2video"  # the image is the first frame
FIRSTLAST2VIDEO = "firstlast2video"  # the image is the first frame, the last image the last one
# a reference video conditions the video in context (LTX-2's IC-LoRAs: depth, pose, edges...); an image, if any, is the
# first frame
INCONTEXT2VIDEO = "incontext2video"
REFERENCE2VIDEO = "reference2video"
# the kinds of a reference to video run's references (runtime/references.py)
IMAGE, VIDEO, AUDIO = "image", "video", "audio"
KINDS = (IMAGE, VIDEO, AUDIO)
VIDEO_TASKS = (TEXT2VIDEO, IMAGE2VIDEO, FIRSTLAST2VIDEO, INCONTEXT2VIDEO, REFERENCE2VIDEO)


@dataclasses.dataclass(frozen=True)
class TaskPipeline:
    """The diffusers class that runs one task of a model class, and how it takes the Sampler's images."""

    cls: str
    images: int = 0  # image inputs it takes (image, image_2, image_3); 0: none (text to image)
    image_list: bool = False  # its `image` is a list of references (QwenImageEditPlus, FLUX.2), else one image
    reference_kwarg: str = ""  # where image_2 goes beside the edited image (FLUX.1 Kontext inpaint: image_reference)
    strength: bool = False  # it takes the Sampler's denoise as diffusers' `strength`
    max_area: bool = False  # FLUX.1 Kontext: it returns ~1 MP whatever was asked unless max_area is width x height
    # its diffusers class encodes the image at the image's own size, not the asked one (Z-Image's image to image
    # and inpaint; a size mismatch crashes there): the image is resized to the output size first, as others do
    resize_image: bool = False
    # (image width, image height) -> the (width, height) it makes whatever is asked, for a class that sets its
    # output size itself (Qwen-Image-Edit inpaint): the Sampler's size must then be 0 or that
    output_size: Callable | None = None
    output_size_words: str = "~1 MP"  # what `output_size` makes, for messages and the task matrix
    # (first frame, last frame: PIL images) -> the call arguments that pin them, for a first/last frame to video class
    # whose diffusers call takes them as its own condition objects rather than as `image`
    first_last: Callable | None = None
    # (reference frames: PIL images, first frame: a PIL image or None, the IC-LoRA's reference downscale factor) -> the
    # call arguments for an in-context class (IC-LoRA: the reference video's tokens beside the video's)
    in_context: Callable | None = None
    # (references: runtime.references.Reference, in order) -> the call arguments of a reference to video class (what
    # it reads: Family.reference_rule)
    references: Callable | None = None
    # latent frames of tokens its conditions append after the video's, which context parallelism splits with them
    # (LTX2ConditionPipeline's last frame: a keyframe of one latent frame)
    keyframes: int = 0


@dataclasses.dataclass(frozen=True)
class ModularBlocks:
    """diffusers modular blocks (`diffusers.modular_pipelines`) that run a model class's tasks on the components the
    pack loads from the model's folder: one workflow of the blocks per task (runtime/pipeline_kinds.py)."""

    blocks: str  # the blocks class in diffusers, e.g. "FluxAutoBlocks"
    pipeline: str  # the ModularPipeline class the blocks run in, e.g. "FluxModularPipeline"
    workflows: Mapping[str, str]  # task -> the blocks' workflow for it (a name of their `_workflow_map`)
    # (the Sampler's guidance) -> the config of the blocks' `guider` component for it, for blocks that guide through
    # a guider (Z-Image, Qwen-Image, SDXL) instead of the call input `Family.guidance_kwarg` (None: FLUX.1)
    guider: Callable | None = None
    # distilled blocks that take no guidance at all (Qwen-Image 2.1 Turbo's): the Sampler's guidance and negative prompt
    # are not passed
    unguided: bool = False
    # groups of workflows that load the same components, for blocks whose workflows use different ones (MiniMax H3's
    # ref2va runs a transformer of its own, `transformer_ref`): a model loads one group's components, the first
    # group's unless its run's workflow is in another (LoadSpec.workflow); (): every component of the blocks loads
    partitions: tuple[tuple[str, ...], ...] = ()
    # {output the pack reads (`frames`, `audio`, `images`): the blocks' output of that name}, for blocks whose outputs
    # are named otherwise (MiniMax H3's `videos`); the call asks the blocks for these outputs only
    outputs: Mapping[str, str] = dataclasses.field(default_factory=dict)
    # the sub-block of each workflow that first rewrites the prompt with a language model (FLUX 3's prompt upsampler),
    # as diffusers' blocks do by default: left out when the Sampler's prompt_upsampling is off; "": the blocks have none
    prompt_upsampler: str = ""

    def partition_for(self, task: str) -> str:
        """What a model loads for `task` (LoadSpec.workflow): "" for the first partition's components (or every
        component, for blocks without partitions), else the task's workflow, whose partition loads instead."""
        workflow = self.workflows.get(task, "")
        return "" if not self.partitions or workflow in self.partitions[0] else workflow

    def partition(self, workflow: str) -> tuple[str, ...]:
        """The workflows whose components load for LoadSpec.workflow `workflow` ("": the first partition's); ()
        for blocks without partitions (every component loads)."""
        return next((group for group in self.partitions if workflow in group), self.partitions[0] if self.partitions
                    else ())


def classifier_free_guider(guidance: float) -> dict:
    """ClassifierFreeGuidance's config for classic pipelines' CFG (SDXL's guidance_scale, Qwen-Image's true_cfg_scale):
    uncond + guidance x (cond - uncond), only when guidance is above 1."""
    return {"guidance_scale": guidance, "enabled": guidance > 1}


@dataclasses.dataclass(frozen=True)
class FrameRule:
    """A video family's frame counts when they are not `temporal_factor` x k + 1 (Family.frame_rule): step x n + offset,
    from `least` to `most` frames (MiniMax H3: 17n + 5, 124 to 345)."""

    step: int
    offset: int
    least: int  # the fewest frames (a count of the rule)
    most: int  # the most frames (a count of the rule)
    why: str = ""  # why these counts, for messages ("5 to 15 s at 24 fps")

    def fits(self, frames: int) -> bool:
        return self.least <= frames <= self.most and (frames - self.offset) % self.step == 0

    def words(self) -> str:
        return f"{self.step}n + {self.offset} from {self.least} to {self.most}" + (f" ({self.why})" if self.why else "")

    def nearest(self, frames: int) -> tuple[int, ...]:
        """The valid counts next to `frames`: the one below and the one above it, or the nearest end."""
        if frames <= self.least:
            return (self.least,)
        if frames >= self.most:
            return (self.most,)
        below = self.offset + (frames - self.offset) // self.step * self.step
        return (below, below + self.step)


@dataclasses.dataclass(frozen=True)
class ReferenceRule:
    """What a reference to video model reads (diffusers' rules for its blocks): how many of each kind, whether sound
    clips need a picture or a video beside them, and the rates and sizes it resamples them to, for the checks and the
    memory plan before loading."""

    most: Mapping[str, int]  # {kind: the most references of that kind}
    total: int  # the most references in all
    sound_needs_sight: bool = True  # sound clips only with a picture or a video
    # the model's sound rate: sound at another rate is resampled by diffusers with torchaudio, which must be installed
    sound_rate: int = 0
    picture_edge: int = 0  # the short edge pictures are encoded at, whatever the video's size
    canvas_edge: int = 0  # a video reference's frames go on a canvas of their own aspect with this short edge,
    canvas_pixels: int = 0  # and at most this many pixels
    fps: float = 0.0  # the rate video references are resampled to
    least_video_frames: int = 1  # the fewest frames of a video reference, at `fps`

    def encoded_sizes(self, references, frames: int) -> list[tuple[int, int, int]]:
        """(width, height, frames) each picture and video is encoded at, at most, for the memory plan: a picture at
        `picture_edge` on its short edge, a video's frames resampled to `fps` and cut to the video's `frames`, on a
        canvas of `canvas_edge` and at most `canvas_pixels`. Sound clips are left out (40 latents a second)."""
        sizes = []
        for reference in references:
            if reference.kind == AUDIO:
                continue
            count, height, width = reference.frames.shape[:3]
            if reference.kind == IMAGE:
                scale = self.picture_edge / min(width, height)
            else:
                scale = min(self.canvas_edge / min(width, height), (self.canvas_pixels / (width * height)) ** 0.5)
                count = min(frames, self.resampled_frames(reference))
            sizes.append((round(width * scale), round(height * scale), count))
        return sizes

    def resampled_frames(self, video) -> int:
        """A video reference's frames at `fps` (each held until the next one's slot, as diffusers resamples)."""
        return math.floor(len(video.frames) * self.fps / video.fps + 0.5)

    def problem(self, references, model: str) -> str | None:
        """What makes these references unreadable for `model`, said so that it can be fixed; None when they are fine."""
        kinds = [reference.kind for reference in references]
        for kind in KINDS:
            if kinds.count(kind) > self.most.get(kind, 0):
                return (f"{model} reads at most {self.most.get(kind, 0)} {kind} references; {kinds.count(kind)} are "
                        "connected. Remove some TPU Video Reference nodes (or images of a batch).")
        if len(kinds) > self.total:
            return f"{model} reads at most {self.total} references in all; {len(kinds)} are connected."
        if self.sound_needs_sight and kinds and set(kinds) == {AUDIO}:
            return (f"{model} takes sound references only beside a picture or a video reference; add one to the TPU "
                    "Video Reference chain.")
        short = next((r for r in references
                      if r.kind == VIDEO and r.fps > 0 and self.resampled_frames(r) < self.least_video_frames), None)
        if short is not None:
            return (f"a video reference of {len(short.frames)} frames at {short.fps:g} fps is too short: {model} reads "
                    f"at least {self.least_video_frames} frames at {self.fps:g} fps "
                    f"({self.least_video_frames / self.fps:.2f} s). Use a longer clip.")
        rates = sorted({r.sample_rate for r in references if r.audio is not None and r.sample_rate != self.sound_rate})
        if rates and importlib.util.find_spec("torchaudio") is None:
            return (f"a sound reference at {', '.join(map(str, rates))} Hz: {model} resamples sound to "
                    f"{self.sound_rate} Hz with torchaudio, which is not installed. Install torchaudio (pip install "
                    f"torchaudio, matching your torch), or resample the sound to {self.sound_rate} Hz first.")
        return None


@dataclasses.dataclass(frozen=True)
class CanvasRule:
    """The canvases a family was made for, beyond its size step (MiniMax H3: a short edge of at most 768, at most
    768 x 1344 pixels, 1:4 to 4:1), refused when the run is planned with the nearest canvas of that shape."""

    short_edge: int  # the longest short edge
    most_pixels: int
    widest: float  # the most width / height (and height / width)
    words: str = ""  # where the rule comes from, for messages

    def problem(self, width: int, height: int, multiple: int, model: str) -> str | None:
        ratio = max(width / height, height / width)
        if ratio <= self.widest and min(width, height) <= self.short_edge and width * height <= self.most_pixels:
            return None
        width, height = self.nearest(width, height, multiple)
        return (f"{model} makes canvases with a short edge of at most {self.short_edge}, at most {self.most_pixels:,} "
                f"pixels and an aspect ratio from 1:{self.widest:g} to {self.widest:g}:1"
                + (f" ({self.words})" if self.words else "") + f": the nearest of this shape is {width}x{height}.")

    def nearest(self, width: int, height: int, multiple: int) -> tuple[int, int]:
        """The largest canvas of the rule with the asked shape (its aspect ratio clamped into the rule's), in
        multiples of `multiple`."""
        ratio = min(max(width / height, 1 / self.widest), self.widest)
        scale = min(self.short_edge / min(ratio, 1), (self.most_pixels / ratio) ** 0.5)  # the height
        width, height = (max(multiple, round(size / multiple) * multiple) for size in (scale * ratio, scale))
        while width * height > self.most_pixels or min(width, height) > self.short_edge:
            if width >= height:
                width -= multiple
            else:
                height -= multiple
        return width, height


@dataclasses.dataclass(frozen=True)
class ModelForm:
    """Another form of a model that files of a kind hold, which the model's class runs once a few of its modules are
    swapped for the form's (MiniMax H3's pruned "curve form"): told by a key only files of that form have."""

    key: str  # a key only this form's files carry (after any checkpoint prefix)
    # (the class, its config, the file's weights) -> the empty model (on the meta device) in this form
    empty_model: Callable
    # (the file's weights, a copy the function may pop from; the class's config) -> the state dict in that model's layout
    to_diffusers: Callable


@dataclasses.dataclass(frozen=True)
class FileKind:
    """What a single weights file is, told by one key it carries (after any checkpoint prefix): its
    original layout's key first, then the diffusers/transformers layout's. `keys` is called when needed
    (diffusers' own detection keys need diffusers imported)."""

    name: str
    words: str  # "a FLUX.1 diffusion model": how messages name it
    keys: Callable[[], tuple[str, ...]]
    # A kind whose keys another kind shares (FLUX.2 [klein] and [dev] diffusion models) is told apart by one
    # tensor's input width (its last dimension): that tensor's key in each layout, and the widths this kind has.
    width_keys: tuple[str, ...] = ()
    widths: tuple[int, ...] = ()
    # For a text encoder whose files keep another layout than transformers' (SDXL's OpenCLIP ViT-bigG):
    # (transformers class, its config, state dict in that layout) -> the state dict in transformers' layout,
    # applied when the file carries the kind's first (original-layout) key.
    to_transformers: Callable | None = None
    # For a diffusers model whose original layout diffusers' single-file converters do not read (Wan 2.2's VAE):
    # (state dict in that layout) -> the state dict in diffusers' layout, applied when the file carries the
    # kind's first (original-layout) key.
    to_diffusers: Callable | None = None
    # For a diffusers class that `from_single_file` does not take (FLUX.2's VAE): (state dict in the kind's original
    # layout, the class's config) -> the state dict in diffusers' layout (diffusers' own converter where it has one).
    converter: Callable | None = None
    # the checkpoint prefix diffusers' converter for it reads keys under (its LDM UNet converter:
    # "model.diffusion_model."): the component's keys get it back before conversion
    converter_prefix: str = ""
    # diffusers' converter for it pops every key it uses and silently drops the rest: keys left in its input were not
    # used, and are refused as unexpected (the other converters rename every key, so an unknown one shows up as a
    # converted key the model does not have)
    converter_pops_used: bool = False
    # (prefix in text-only files, prefix transformers expects): text-only files of a multimodal encoder that name the
    # language model as a plain causal LM ("model.layers...", as ComfyUI's own code does)
    text_only_prefix: tuple[str, str] = ()
    # submodules of the component a file of this kind does not carry: the model is built without them (None), so
    # nothing runs random weights (LTX-2.5's diffusion-decoder VAE: no conv decoder, its own decoder decodes)
    lacks: tuple[str, ...] = ()
    # other forms of the model that its files may hold (`ModelForm`), loaded as that form where a file carries its key
    forms: tuple[ModelForm, ...] = ()

    def form_of(self, weights) -> ModelForm | None:
        """The form a file's weights (or its header's keys) are in, where it is not the class's own."""
        return next((form for form in self.forms if form.key in weights), None)
    # its quantized layers are dequantized on load whatever the Loader's quantized weights say (MiniMax H3's int8
    # ConvRot video VAE: no VAE is kept quantized; its conversion splits and reorders most of those layers anyway)
    dequantized: bool = False


@dataclasses.dataclass(frozen=True)
class FileSlot:
    """A pipeline component that can come from a single file in ComfyUI's folders."""

    component: str  # the pipeline's component name: text_encoder, text_encoder_2, vae, ...
    kind: FileKind
    comfy_file: str  # the file ComfyUI's own templates download for it (Comfy-Org names)
    # where an all-in-one checkpoint keeps it ("" = never in one), or the file of `carried_by` that carries it
    checkpoint_prefix: str = ""
    # the component whose picked file also carries this one under checkpoint_prefix, which that file then fills when
    # nothing else does (LTX-2.5's text encoder file carries the text projection, its audio VAE file the vocoder)
    carried_by: str = ""
    # key prefixes of its other weights in such a checkpoint, which its weights keep whole beside those under
    # checkpoint_prefix (LTX-2's text connectors: the projection at the top level, the connector blocks inside the
    # diffusion model); read from the diffusion model's file where the slot's file has none (LTX-2.5's)
    checkpoint_also: tuple[str, ...] = ()
    optional: bool = False  # the pipeline runs without it (left None when no file or weights give it)
    # lower-case parts of a file name that say the file belongs elsewhere, though its kind fits (Wan 2.2's
    # high-noise expert picked for the low-noise expert's slot)
    not_named: tuple[str, ...] = ()
    # a text encoder its pipeline reads only up to the hidden states after this many decoder layers (MiniMax H3:
    # hidden_states[50]): a file holding at least these layers fills it, and the layers past the file's (and a final
    # norm it lacks) are left out of the model, never run (single_file._cut_text_model); 0 = every layer is needed
    layers_read: int = 0


@dataclasses.dataclass(frozen=True)
class FileVariant:
    """A model class of a family whose diffusion-model files are told apart from the base model's by their
    name (same keys: FLUX.1 Kontext, Qwen-Image-Edit), by diffusers' model type (FLUX.1 Fill's wider input) or
    by an input width (FLUX.2 [klein] 9B), with the hub repository its configs and tokenizers come from. A file
    is of the variant when it meets every one of these the variant names."""

    model_class: str
    config_repo: str
    name_contains: tuple[str, ...] = ()  # lower-case parts of the file name, e.g. "kontext"
    model_types: tuple[str, ...] = ()  # diffusers' single_file_utils.infer_diffusers_model_type values
    widths: tuple[int, ...] = ()  # input widths of the denoiser kind's `width_keys` tensor (FLUX.2 [klein] 9B's)
    # the model_index settings its files are (Wan 2.2 TI2V-5B: expand_timesteps), so the family's facts for them
    # are `Family.with_settings(settings)`'s (its file slots), and a config folder must have the same settings
    settings: Mapping = dataclasses.field(default_factory=dict)
    # {component: the file ComfyUI's templates pair with this variant's model} where it is not the slot's
    # `comfy_file` (Wan 2.2 I2V A14B's low-noise expert), for messages
    comfy_files: Mapping = dataclasses.field(default_factory=dict)
    # {component: the FileKind this variant's file for it is} where not the slot's kind (LTX-2.5's Gemma 4 text
    # encoder where LTX-2 and 2.3 take Gemma 3)
    slot_kinds: Mapping = dataclasses.field(default_factory=dict)


@dataclasses.dataclass(frozen=True)
class ComfyLatent:
    """How a family's latents are ComfyUI's LATENT: {"samples": tensor} in the VAE's raw latent space (what the
    VAE encodes to, before the family's scaling, which ComfyUI's model applies itself: latent_format.process_in)
    and in ComfyUI's layout for it, so ComfyUI's VAE Decode with the same VAE file decodes it."""

    channels: int  # ComfyUI's latent_format.latent_channels
    factor: int  # pixels per latent cell (FLUX.2's patchified latent: 16)
    frame_axis: bool  # 5-D [B, C, 1, h, w], as ComfyUI's video VAEs (Wan 2.1's: Qwen-Image) take one image
    # (pipe, latents, height, width) -> samples: the denoising loop's final latents (diffusers' packed,
    # normalised ones, as callback_on_step_end gets them) -> ComfyUI's LATENT samples, as the pipeline's own
    # decode step prepares them for its VAE
    to_comfy: Callable
    # (pipe, samples) -> what the family's image-to-image pipeline takes as `image` to start from latents
    # instead of encoding an image (its prepare_latents uses an `image` with the latent channel count as is):
    # the inverse of to_comfy before packing; None: it has none that does
    to_pipeline: Callable | None = None

    def shape(self, batch: int, width: int, height: int) -> tuple[int, ...]:
        """The samples' shape for a batch of width x height images."""
        grid = (height // self.factor, width // self.factor)
        return (batch, self.channels, 1, *grid) if self.frame_axis else (batch, self.channels, *grid)


@dataclasses.dataclass(frozen=True)
class ReferenceModel:
    """A model's published configs, for the docs' table of what fits each chip (runtime/memory_plan.py): each
    component's (library, class, config), and the model_index settings it has."""

    components: Mapping[str, tuple[str, str, Mapping]]
    settings: Mapping = dataclasses.field(default_factory=dict)
    # {component: bytes per weight of its linear layers}: a row for a file whose linear layers stay quantized on the
    # chip (an int8 or fp8 file: 1), as a File Loader keeps them
    quantized: Mapping[str, int] = dataclasses.field(default_factory=dict)
    # the table's (width, height) sizes and frame count for it, where not 480p and 720p x 81 frames (its own canvas)
    sizes: tuple = ()
    frames: int = 0


@dataclasses.dataclass(frozen=True)
class MemoryModel:
    """What the per-chip memory estimate (runtime/memory_plan.py, whose docstring says what each term counts) needs of
    a family: the shapes its configs give, and the bytes its runs take per token and per decoded pixel.

    The constants are upper-side approximations from CPU measurements (peak RSS), not a chip's allocator."""

    # (denoiser config) -> (hidden width, FFN width, patch (t, h, w) in latent pixels): a token is one patch
    denoiser_shape: Callable[[Mapping], tuple[int, int, tuple[int, int, int]]]
    # (VAE config) -> (spatial factor, temporal factor, channels of the decoder's full-resolution stage, the pixel
    # patch it decodes in: a VAE that decodes at 1/patch resolution and then unpatchifies)
    vae_shape: Callable[[Mapping], tuple[int, int, int, int]]
    hidden_tensors: int = 12  # activations per token as wide as the hidden size (residual, norms, q, k, v, ...)
    ffn_tensors: int = 2  # ... and as wide as the FFN (its 1/tp shard under tp)
    modulation_bytes: int = 0  # fp32 bytes per token per hidden channel of a per-token timestep modulation
    vae_chunk_frames: int = 1  # frames the VAE decodes at a time
    vae_tensors: int = 16  # full-resolution tensors of the decoder's width per decoded chunk
    # (frames) -> latent frames, where they are not (frames - 1) / temporal factor + 1 (MiniMax H3's 17-frame clips)
    latent_frames: Callable[[int], int] | None = None
    # published configs for the docs' table of what fits each chip: {model name: ReferenceModel}
    reference_models: Mapping[str, ReferenceModel] = dataclasses.field(default_factory=dict)


@dataclasses.dataclass(frozen=True)
class TwoStage:
    """A family's two-stage generation: sample at half size, upscale the latents x2 with an upscaler model, refine
    at full size (the Video Sampler's `upscaler` input). `run` holds the family's recipe; the rest lets the runtime
    check, load and count it without naming the family."""

    upsampler_module: str  # the diffusers module of the upscaler's model class, e.g. "diffusers.pipelines.x.y"
    upsampler_class: str  # that class, as an upscaler folder's config.json names it (`_class_name`)
    upsample_pipeline: str  # the diffusers pipeline made of (vae, latent_upsampler) that runs it
    subfolder: str  # where a pipeline folder keeps the upscaler (model_index.json's component name)
    key: str  # a key every weights file of such an upscaler has (its state dict's layout is diffusers')
    comfy_file: str  # the upscaler file ComfyUI's templates download (models/latent_upscale_models), for messages
    # (state dict) -> the upscaler's config, for a single file (whose header carries no config); raises
    # UserInputError for one it cannot read
    file_config: Callable
    refine_steps: int  # the refine's steps (its fixed schedule's length): progress counts them
    # (pipe, upsample pipeline, call kwargs at full size, run) -> the refine's diffusers output; run(pipe, kwargs,
    # stage) runs one sampling call (stage 0: the first, 1: the refine) with progress and previews
    run: Callable


@dataclasses.dataclass(frozen=True)
class LatentDecoder:
    """A decoder that replaces the VAE's where a model has one (LTX-2.5's diffusion decoder): a model of its own that
    the pipeline class does not take, run as its own diffusers pipeline on the latents the pipeline returns
    (output_type="latent"). It comes from a file of `file_kind` picked for the `slot` component (the VAE), which
    carries it beside that component's own weights: picking that file is asking for it."""

    component: str  # its folder in a diffusers model folder (its config there, where the configs folder has one)
    model_class: str  # its diffusers model class
    decode_pipeline: str  # the diffusers pipeline made of (the decoder, the scheduler) that runs it
    slot: str  # the component whose file may carry it
    file_kind: FileKind
    file_prefixes: tuple[str, ...]  # the keys of such a file the decoder takes (read, the rest not)
    # (those keys) -> the decoder's state dict in diffusers' layout
    from_file: Callable
    # (its config, width, height, frames) -> bytes its run needs at that size, checked before loading (LTX-2.5's
    # neighborhood attention runs densely outside a NATTEN kernel: a tokens x tokens mask)
    run_bytes: Callable
    instead: str  # the file to pick where it does not fit (the VAE's own decoder)
    # (pipe, decode pipeline, the pipeline's latent output, the call's generator) -> an output like the pipeline's
    # decoded one (frames and sound)
    decode: Callable
    words: str  # how the run info names it


@dataclasses.dataclass(frozen=True)
class Family:
    name: str  # shown to users
    # model_index.json `_class_name`s of this family -> {task: the diffusers pipeline that runs it}, built with
    # `from_pipe` on the loaded model's components. The first is the base model, what a diffusion-model file
    # of this family loads as unless its name says otherwise (`file_variants`).
    model_classes: Mapping[str, Mapping[str, TaskPipeline]]
    takes_negative_prompt: bool
    guidance_kwarg: str  # the __call__ argument the node's "guidance" feeds
    size_multiple: int  # height and width must be multiples of this (VAE factor x patch size)
    default_steps: int  # named in the message for a bad step count
    # (pipe, latents, height, width) -> (B, C, h, w): the denoising loop's latents (diffusers'
    # callback_on_step_end "latents", already in the normalised space ComfyUI's models sample in) as the
    # image-shaped latent that ComfyUI's latent_rgb_factors for `comfy_latent_format` read, for previews.
    latent_grid: Callable
    comfy_latent_format: str  # the class in ComfyUI's comfy.latent_formats
    # its latents as ComfyUI's LATENT (the Sampler's LATENT output and input); None: a family without one (video)
    comfy_latent: ComfyLatent | None
    # Single files: the denoiser's kind, the files ComfyUI's templates download for it, the other components.
    denoiser_kind: FileKind
    denoiser_files: tuple[str, ...]
    file_slots: tuple[FileSlot, ...]
    default_config_repo: str  # configs and tokenizers for single files when diffusers cannot tell the variant
    memory: MemoryModel  # its per-chip memory estimate
    diffusers_model_types: tuple[str, ...] = ()  # single_file_utils.infer_diffusers_model_type values of it
    denoiser: str = "transformer"  # the pipeline component that denoises (SDXL's is a "unet")
    file_variants: tuple[FileVariant, ...] = ()  # checked in order; a file that matches none is the base model
    # {lower-case part of a diffusion-model file's name: what to use instead}: files of the family's kind that it
    # cannot load (Wan 2.1's have Wan 2.2's keys, but other configs), refused when the prompt is queued
    unsupported_files: Mapping[str, str] = dataclasses.field(default_factory=dict)
    # (denoiser) -> None, before it is compiled: sets up what its first call would set up lazily in a way
    # torch.compile cannot trace (Z-Image's rotary table), so a fresh model compiles with fullgraph
    prepare_compile: Callable | None = None
    # why torch.compile cannot trace its denoiser whole with fullgraph, for one whose forward breaks the graph outside
    # its repeated blocks (Qwen-Image 2.1's rotary embedding reads the token mask with tolist()); "": it can. Scope
    # auto then compiles its repeated blocks, and scope whole with fullgraph is refused before anything compiles.
    untraceable_whole: str = ""
    # the __call__'s default negative prompt, used when the node's is empty (QwenImage runs true CFG only with
    # one, and " " is its own default; Wan's is "")
    default_negative_prompt: str = " "
    # Video families: frames per second of what it makes (for the run info and ComfyUI's CreateVideo), and
    # the VAE's temporal factor: frame counts are temporal_factor x k + 1 (Wan: 4k + 1, 81 by default).
    fps: float = 0.0
    fps_kwarg: str = ""  # the __call__ argument its fps feeds, for a model that conditions on the frame rate
    temporal_factor: int = 0
    default_frames: int = 0
    # frame counts of another form than temporal_factor x k + 1 (MiniMax H3's 17n + 5, 124 to 345); None: that form
    frame_rule: FrameRule | None = None
    # (model_index setting, the Family fields it changes when true): facts that follow from a setting of the
    # model rather than its class (Wan 2.2 TI2V-5B is a WanPipeline with expand_timesteps: another VAE, so
    # another size step and latent format, and image to video too). `with_settings` applies them.
    setting_changes: tuple[tuple[str, Mapping], ...] = ()
    # pipeline components that denoise besides `denoiser` (Wan 2.2 A14B's low-noise expert `transformer_2`):
    # compiled, offloaded and given LoRAs like it
    extra_denoisers: tuple[str, ...] = ()
    # denoisers another partition of its modular blocks loads in place of `denoiser` (ModularBlocks.partitions: MiniMax
    # H3's ref2va, `transformer_ref`): compiled, offloaded and sharded like it where loaded
    partition_denoisers: tuple[str, ...] = ()
    # (a denoiser's config.json as a dict) -> diffusers' `_tp_plan` for it, for a denoiser class diffusers gives
    # none (Wan's: it depends on the head count). distributed/sharding.py sets it on the class before a sharded load.
    tp_plan: Callable | None = None
    # (a denoiser's config.json as a dict) -> the `_cp_plan` context parallelism applies to it, for a denoiser class
    # whose diffusers plan is missing or wrong for it (LTX-2's leaves the audio branch out). distributed/sharding.py
    # sets it on the model before `enable_parallelism`.
    cp_plan: Callable | None = None
    # True: its denoiser's sequence has a length no check before loading knows (MiniMax H3 packs the prompt's text
    # tokens, unpadded, with the video's and the sound's), so context parallelism splits it unevenly where the ranks
    # do not divide it (diffusers' Ulysses Anything) instead of refusing sizes
    cp_any_length: bool = False
    # a reference to video model's references: how many of each kind, and the sizes it encodes them at
    reference_rule: ReferenceRule | None = None
    # the canvases it was made for beyond its size step; None: any size of the step
    canvas_rule: CanvasRule | None = None
    # the denoiser's attention modules (a part of their names: an attention's own, or a module holding them) that run
    # outside context parallelism: their keys and values are whole on every rank (text, LTX-2's audio), so each
    # rank's own queries need no exchange, and diffusers' Ulysses attention cannot take their per-head attention masks
    # (it keeps all heads of a mask, not the rank's)
    cp_local_attention: tuple[str, ...] = ()
    # model class -> the diffusers modular blocks that also run it (runtime/pipeline_kinds.py): used when its task
    # pipelines name no classic class (a modular-only model), or when TPU_DIFFUSERS_PIPELINE_KIND asks modular
    modular: Mapping[str, ModularBlocks] = dataclasses.field(default_factory=dict)
    # {a LoRA's `expert` choice (specs.LoraExpert's values): the denoisers it goes into}, for a family with more than
    # one denoiser; a family with one takes every LoRA into `denoiser`
    lora_targets: Mapping[str, tuple[str, ...]] = dataclasses.field(default_factory=dict)
    # what its denoisers besides `denoiser` are, for messages ("the low-noise expert of ...")
    extra_denoiser_words: str = ""
    # the Samplers' guidance for it, for their tooltips ("0 for schnell", "the true-CFG scale")
    guidance_hint: str = ""
    # its VAE decodes RGBA (Qwen-Image 2.1): the alpha is the Sampler's MASK (outputs.AlphaMask), the IMAGE stays RGB
    decodes_alpha: bool = False
    # (loaded pipeline) -> the sample rate (Hz) of the sound track its call returns beside the frames (`output.audio`,
    # a waveform [B, C, T]): the Video Sampler's AUDIO (outputs.SoundTrack). Read from the loaded pipeline (its
    # vocoder's config) rather than written here, as the rate is the model's, not the family's. None: it makes no
    # sound, and the AUDIO output is blocked with a message saying so, never silence.
    sound_rate: Callable | None = None
    # its generation at half size + latent upscale + refine, with an upscaler model; None: it has none
    two_stage: TwoStage | None = None
    # a decoder that replaces its VAE's where the model has one; None: the VAE decodes
    latent_decoder: LatentDecoder | None = None
    # (loaded pipeline) -> a context in which its call runs a `sigmas` argument as given (no shift of the schedule),
    # as a SIGMAS input (ComfyUI's ManualSigmas: a distilled model's schedule) means; None: it takes no sigmas
    sigmas_as_given: Callable | None = None

    @property
    def makes_video(self) -> bool:
        return self.fps > 0

    @property
    def makes_sound(self) -> bool:
        return self.sound_rate is not None

    @property
    def denoisers(self) -> tuple[str, ...]:
        return (self.denoiser, *self.extra_denoisers, *self.partition_denoisers)

    def with_settings(self, settings: Mapping) -> "Family":
        """This family as a model with these model_index settings is (the facts `setting_changes` names)."""
        family = self
        for name, changes in self.setting_changes:
            if settings.get(name):
                family = dataclasses.replace(family, **changes)
        return family

    @property
    def every_modular(self) -> tuple[ModularBlocks, ...]:
        """Its modular blocks, with those a model setting picks instead (`setting_changes`: Qwen-Image 2.1 Turbo's)."""
        picked = (changes.get("modular", {}) for _, changes in self.setting_changes)
        return tuple(blocks for by_class in (self.modular, *picked) for blocks in by_class.values())

    @property
    def base_class(self) -> str:
        return next(iter(self.model_classes))

    @property
    def optional_slots(self) -> tuple[str, ...]:
        return tuple(slot.component for slot in self.file_slots if slot.optional)

    def slot(self, component: str) -> FileSlot | None:
        return next((slot for slot in self.file_slots if slot.component == component), None)

    def variant_of_file(self, file_name: str, model_type: str | None, width: int | None = None) -> FileVariant | None:
        """The model class (and configs repo) a diffusion-model file of this family loads as, when not the base:
        the first variant whose name parts, model types and widths (those it names) the file has."""
        name = file_name.lower()

        def fits(variant: FileVariant) -> bool:
            return ((not variant.model_types or model_type in variant.model_types)
                    and (not variant.name_contains or any(part in name for part in variant.name_contains))
                    and (not variant.widths or width in variant.widths))

        return next((variant for variant in self.file_variants if fits(variant)), None)

    def pipeline_for(self, model_class: str, task: str) -> TaskPipeline | None:
        """The diffusers pipeline that runs `task` on a model of `model_class`, or None if it has none."""
        return self.model_classes[model_class].get(task)

