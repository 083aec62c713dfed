"""TPU Video Sampler: TPU Sampler's sibling for video models: frames in, frames out as an IMAGE batch."""

from comfy_api.latest import io

from tpu_diffusers_runtime.engine import ENGINE
from tpu_diffusers_runtime.errors import UserInputError
from tpu_diffusers_runtime.families import FAMILIES, INCONTEXT2VIDEO, listed, with_each_setting
from tpu_diffusers_runtime.input_checks import (MAX_SIZE, frames_problem, last_image_problem, references_problem,
                                                sigmas_problem, video_frame_factor)
from tpu_diffusers_runtime.tasks import MAX_SEED, SampleRequest
from .comfy_progress import ComfyProgress, preview_spec
from .latent_upscale_model import TWO_STAGE_FAMILIES
from .sampler import queue_time_problem
from .types import CATEGORY, TPUPipeline, TPUReferences, TPUUpscaler
from .video_reference import REFERENCE_FAMILIES

MAX_FRAMES = 1025
CONDITIONS = ("image", "last_image", "reference_video")  # what references take the place of
VIDEO_FAMILIES = [family for family in FAMILIES if family.makes_video]
SIGMAS_FAMILIES = [family for family in VIDEO_FAMILIES if family.sigmas_as_given]
SOUND_FAMILIES = [family for family in VIDEO_FAMILIES if family.makes_sound]
IN_CONTEXT_FAMILIES = [family for family in VIDEO_FAMILIES
                       if any(INCONTEXT2VIDEO in tasks for tasks in family.model_classes.values())]
VIDEO_MODELS = with_each_setting(VIDEO_FAMILIES)  # each with its own size step, frame rate and frame count
STEPS = " or ".join(str(step) for step in sorted({model.size_multiple for model in VIDEO_MODELS}))
FPS = " or ".join(dict.fromkeys(f"{model.fps:g}" for model in VIDEO_MODELS))
LENGTHS = "; ".join(f"{model.default_frames} = {model.default_frames / model.fps:.0f} s at {model.fps:g} fps"
                    for model in VIDEO_MODELS)
# families whose frame counts have another form than factor x k + 1 (Family.frame_rule)
FRAME_RULES = "".join(f", or for {model.name} {model.frame_rule.words()}" for model in VIDEO_MODELS if model.frame_rule)


class TPUVideoSampler(io.ComfyNode):
    @classmethod
    def define_schema(cls) -> io.Schema:
        return io.Schema(
            node_id="TPUVideoSampler",
            display_name="TPU Video Sampler",
            category=CATEGORY,
            description=f"Generates video with a video model ({listed(VIDEO_FAMILIES)}): from text, from a "
                        "start image (models with image to video), from a first and a last image (models with "
                        "first/last frame to video), or from references (TPU Video Reference: models with reference "
                        "to video). The frames come out as an IMAGE batch for ComfyUI's Create Video + Save "
                        "Video or Save Animated WEBP, with the model's frame rate. Loads on first use, shows "
                        "progress and the first frame's preview per step. Cancel stops sampling at the end of "
                        "the running step, and loading between components.",
            inputs=[
                TPUPipeline.Input("pipeline", tooltip=f"A video model's pipeline ({listed(VIDEO_FAMILIES)}) from "
                                                      "TPU Loader or TPU File Loader."),
                io.String.Input("prompt", multiline=True, default="a corgi running on a beach at sunset, cinematic",
                                tooltip="What happens in the video. Required."),
                io.String.Input("negative_prompt", multiline=True, default="",
                                tooltip="What to avoid (used when guidance is above 1)."),
                io.Int.Input("width", default=832, min=0, max=MAX_SIZE, step=16,
                             tooltip=f"Frame width: a multiple of the model's size step ({STEPS}). 0 = the start "
                                     "image's width."),
                io.Int.Input("height", default=480, min=0, max=MAX_SIZE, step=16,
                             tooltip=f"Frame height: a multiple of the model's size step ({STEPS}). 0 = the start "
                                     "image's height."),
                # a family whose counts have another form (Family.frame_rule) needs every count reachable
                io.Int.Input("frames", default=81, min=1, max=MAX_FRAMES,
                             step=1 if any(model.frame_rule for model in VIDEO_MODELS) else video_frame_factor(),
                             tooltip=f"Frames per video: {video_frame_factor()}k + 1{FRAME_RULES} ({LENGTHS})."),
                io.Int.Input("steps", default=4, min=1, max=1000,
                             tooltip="Denoising steps: 4 with 4-step LoRAs; without them "
                                     f"{', '.join(f'{f.name} {f.default_steps}' for f in VIDEO_FAMILIES)}."),
                io.Float.Input("guidance", default=1.0, min=0.0, max=100.0, step=0.1,
                               tooltip="Guidance scale ("
                                       f"{'; '.join(f'{f.name}: {f.guidance_hint}' for f in VIDEO_FAMILIES)})."),
                io.Int.Input("seed", default=0, min=0, max=MAX_SEED, control_after_generate=True,
                             tooltip="Random seed; the same seed gives the same video on TPU, GPU and CPU."),
                io.Int.Input("batch_size", default=1, min=1, max=16,
                             tooltip="Videos per run; video i uses seed + i (and item i % N of an image batch). "
                                     "The frames output holds them one after another: batch x frames images."),
                io.Image.Input("image", optional=True,
                               tooltip="Image to video: the first frame (Load Image), also with last_image. "
                                       "Image-to-video models need it, text-to-video ones take none, a model with both "
                                       "takes it or not. Resized to width x height."),
                # appended after image, so the links of workflows saved before it keep their input indices
                io.Image.Input("last_image", optional=True,
                               tooltip="First/last frame to video: the last frame (Load Image), with image as the "
                                       "first. Only models with first/last frame to video take it; it needs image. "
                                       "Resized to width x height."),
                # appended after the others, so that workflows saved before it keep their widget values
                TPUUpscaler.Input("upscaler", optional=True,
                                  tooltip="A latent upscaler (TPU Latent Upscale Model): the video is sampled at half "
                                          "width and height, its latents upscaled x2, then refined at full size (the "
                                          "model's fixed refine schedule, steps counted on the bar). Width and height "
                                          "must then be multiples of twice the size step. Models with it: "
                                          f"{listed(TWO_STAGE_FAMILIES) or 'none yet'}."),
                # appended after the others, so that workflows saved before it keep their input indices
                io.Sigmas.Input("sigmas", optional=True,
                                tooltip="A denoising schedule (ComfyUI's ManualSigmas, ending at 0), run as given: a "
                                        "distilled model's, e.g. '1.0, 0.99375, 0.9875, 0.98125, 0.975, 0.909375, "
                                        "0.725, 0.421875, 0.0' at guidance 1. Its sigmas but the final 0 are "
                                        "the steps (the steps widget is then not used). Models that take one: "
                                        f"{listed(SIGMAS_FAMILIES) or 'none yet'}."),
                # appended after the others, so that workflows saved before it keep their input indices
                io.Image.Input("reference_video", optional=True,
                               tooltip="In-context video (IC-LoRA: a depth, pose or edge video, with its LoRA on the "
                                       "TPU LoRA node): the reference video's frames (Load Video + Get Video "
                                       "Components), cropped to width x height; its first `frames` frames are used and "
                                       "must be 8k + 1. With image, that is the first frame. Models with it: "
                                       f"{listed(IN_CONTEXT_FAMILIES) or 'none yet'}."),
                # appended after the others, so that workflows saved before it keep their input indices
                TPUReferences.Input("references", optional=True,
                                    tooltip="Reference to video: pictures, videos and sound clips the prompt refers to "
                                            "(<Picture 1>, <Video 1>, <Audio 1>), in the order of a chain of TPU "
                                            "Video Reference nodes; width and height give the video's size. Models "
                                            f"with it: {listed(REFERENCE_FAMILIES) or 'none yet'}."),
            ],
            outputs=[
                io.Image.Output(display_name="frames", tooltip="batch x frames images, video after video: connect to "
                                                                "Create Video or Save Animated WEBP."),
                io.Float.Output(display_name="fps", tooltip=f"The model's frame rate ({FPS}): connect to Create "
                                                            "Video's fps."),
                io.String.Output(display_name="info", tooltip="Device, the task and diffusers class that ran, the "
                                                              "mode, frames and fps, sound, load and sampling times."),
                # appended after the others, so the links of workflows saved before it keep their output indices
                io.Audio.Output(display_name="audio",
                                tooltip="The videos' sound track, one per video, for models that make sound "
                                        f"({listed(SOUND_FAMILIES) or 'none of the supported ones yet'}): connect to "
                                        "Create Video's audio, Save Audio or Preview Audio. A model that makes no "
                                        "sound gives none: what it feeds is stopped with a message saying so."),
            ],
        )

    @classmethod
    def validate_inputs(cls, input_types: dict | None = None, prompt: str | None = None, width: int | None = None,
                        height: int | None = None, frames: int | None = None) -> bool | str:
        """Checked when the prompt is queued (see TPUSampler.validate_inputs): link types, a last image without the
        first, references beside other conditions, prompt, size and the frame count, which every supported video model
        takes as factor x k + 1."""
        input_types = input_types or {}
        problem = (queue_time_problem(cls, input_types, prompt, width, height)
                   or last_image_problem("image" in input_types, "last_image" in input_types)
                   or references_problem("references" in input_types,
                                         [name for name in CONDITIONS if name in input_types]))
        if problem or not isinstance(frames, int):
            return problem or True
        if not 1 <= frames <= MAX_FRAMES:
            return f"frames {frames} is outside 1..{MAX_FRAMES}."
        return frames_problem(frames) or True

    @classmethod
    def execute(cls, pipeline, prompt: str, negative_prompt: str, width: int, height: int, frames: int, steps: int,
                guidance: float, seed: int, batch_size: int, image=None, last_image=None,
                upscaler: str | None = None, sigmas=None, reference_video=None, references=None) -> io.NodeOutput:
        if problem := last_image_problem(image is not None, last_image is not None):
            raise UserInputError(problem)  # (again: a ComfyUI that passes no input_types to validate_inputs)
        schedule = schedule_of(sigmas)
        if sigmas is not None and not schedule:
            raise UserInputError(sigmas_problem(schedule))
        request = SampleRequest(prompt=prompt, negative_prompt=negative_prompt, width=width, height=height,
                                steps=len(schedule) if sigmas is not None else steps, guidance=guidance, seed=seed,
                                batch_size=batch_size, frames=frames,
                                images=tuple(i for i in (image, last_image) if i is not None),
                                upscaler=upscaler or "", sigmas=schedule, reference_video=reference_video,
                                references=references or ())
        generation = ENGINE.generate(pipeline, request, on_progress=ComfyProgress(), preview=preview_spec(pipeline))
        info = generation.info
        return io.NodeOutput(generation.images, info.fps, info.summary(), sound_track(generation),
                             ui={"tpu_run_info": [info.as_dict()]})


def schedule_of(sigmas) -> tuple[float, ...]:
    """A SIGMAS input (a tensor ending at 0, as ComfyUI's schedulers give it) as the pipeline's `sigmas`: its
    values but the final zeros, which diffusers' flow-matching schedulers append themselves; () when none is
    connected. `execute` refuses an empty one; values that are no schedule are refused when the run is planned
    (input_checks.sigmas_problem)."""
    if sigmas is None:
        return ()
    values = [float(s) for s in sigmas.flatten().tolist()]
    while values and values[-1] == 0:
        values.pop()
    return tuple(values)


def sound_track(generation):
    """The AUDIO output: the videos' sound track, or for a model that makes none ComfyUI's ExecutionBlocker, so a
    node it feeds (Save Audio, Create Video) fails with this message rather than getting silence passed off as the
    model's sound; the frames, fps and info outputs still feed their nodes."""
    from comfy_execution.graph import ExecutionBlocker

    if generation.audio is not None:
        return generation.audio
    sound = f"models that do: {listed(SOUND_FAMILIES)}" if SOUND_FAMILIES else "none of the supported models does yet"
    return ExecutionBlocker(f"this video model ({generation.info.pipeline}) makes no sound, so the TPU Video "
                            f"Sampler's audio output has none to give ({sound}). Use the frames without audio: "
                            "disconnect the audio input of Create Video, or Save Audio / Preview Audio.")
