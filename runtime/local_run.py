"""A request run in this process, as its plan says: realise the handle's pipeline (load or reuse it, LoRAs,
compilation), warm up, sample, and say what happened (RunInfo). ComfyUI's process runs it for a handle without a
worker group; every worker rank runs it for its replica's share of the batch.
"""

from __future__ import annotations

import dataclasses
import logging
import os
import time

from .device import DeviceInfo, peak_memory_bytes, reset_peak_memory
from . import features, pipeline_kinds
from .errors import CompileError
from .families import Family
from .features import compilation, lora
from .preview import PreviewSpec
from .handle import PipelineHandle
from .loading import load_latent_decoder
from .modes import execution_mode, grad_mode
from .pipeline_cache import LoadedPipeline, PipelineCache
from .plan import Plan
from .run_info import Generation, RunInfo
from .specs import CompileSpec, ExecutionMode, ProgressCallback
from .tasks import SampleRequest, Task
from .tasks import images as image_inputs

log = logging.getLogger("tpu_diffusers")


def realise(cache: PipelineCache, handle: PipelineHandle, device: DeviceInfo,
            on_progress: ProgressCallback | None = None, family: Family | None = None) -> tuple[LoadedPipeline, bool]:
    """The loaded pipeline for a handle with every feature as the handle asks (runtime/features, in their one
    order); and whether it was loaded just now. `family`: the model's, as its settings make it; None: as the
    loaded model's config says (a caller without a plan, or a plan made before the model's settings could be
    read)."""
    return features.realise(cache, handle, device, on_progress, family)


def denoisers(pipe, family: Family) -> tuple:
    """Every denoising model the loaded pipeline has (`Family.denoisers`; an optional second expert may be absent)."""
    loaded = (getattr(pipe, name, None) for name in family.denoisers)
    return tuple(model for model in loaded if model is not None)


def run_locally(cache: PipelineCache, handle: PipelineHandle, plan: Plan, on_progress: ProgressCallback | None,
                preview: PreviewSpec | None, plan_notes: list[str]) -> Generation:
    """Sample the plan's request with the pipeline `handle` describes. With a preview spec, each sampling step's
    on_progress call also gets that step's preview image: on_progress(done, total, "sampling", image).
    `plan_notes`: the memory plan's, for the run info."""
    notes = [*plan_notes, *image_inputs.notes(plan.request)]
    start = time.perf_counter()
    device = plan.device
    # a plan made before the model's settings were readable leaves its family to the loaded model's config
    known_family = plan.family if plan.settings is not None else None
    entry, loaded = realise(cache, handle, device, on_progress, known_family)
    plan = plan.refined(entry.pipe.config)
    task, family, request = plan.task, plan.family, plan.request
    # a modular pipeline runs the task's workflow
    pipe = entry.pipeline(plan.pipeline.cls, plan.task.name, request.upsample_prompt)
    if request.negative_prompt.strip() and not pipeline_kinds.takes_negative_prompt(pipe, family):
        notes.append(f"negative prompt ignored: {family.name} ({type(pipe).__name__}) takes none")
    if not pipeline_kinds.takes_guidance(pipe):
        notes.append(f"guidance unused: {family.name} ({type(pipe).__name__}) takes none (guidance-distilled)")
    if pipeline_kinds.upsamples_prompt(pipe):
        notes.append("prompt rewritten first by the model's prompt upsampler (prompt_upsampling on)")
    if request.upscaler and family.two_stage:
        notes.append(f"two stages: {request.width // 2}x{request.height // 2}, latents upscaled x2 "
                     f"({os.path.basename(request.upscaler)}), {family.two_stage.refine_steps} refine steps at "
                     f"{request.width}x{request.height}")
    decode = entry.decode_pipeline(family.latent_decoder,
                                   lambda dtype: load_latent_decoder(family, handle, dtype))
    if decode is not None:
        notes.append(f"video decoded by {family.latent_decoder.words} (in "
                     f"'{os.path.basename(dict(handle.files)[family.latent_decoder.slot])}')")
    load_seconds = time.perf_counter() - start
    notes += entry.notes + features.notes(entry)

    grad_modes = set()

    def on_step(done: int, total: int, *preview_image) -> None:
        grad_modes.add(grad_mode())
        if on_progress:
            on_progress(done, total, "sampling", *preview_image)

    run_denoisers = denoisers(entry.pipe, family)

    def run_at(width: int, height: int, image_size, on_warm_step) -> compilation.CompileActivity:
        # the request's own inputs at that size (diffusers resizes them, or image_size says), all steps
        warm_request = dataclasses.replace(
            request, width=width, height=height, steps=compilation.WARMUP_STEPS, denoise=1.0,
            batch_size=task.call_batch(request),
            images=tuple(image_inputs.resized(image, image_size) for image in request.images))
        task.validate(family, plan.pipeline, warm_request)  # a warm-up size the model does not take
        return _run(entry, pipe, run_denoisers, dataclasses.replace(plan, request=warm_request), on_warm_step,
                    decode=decode)[1]

    compiled = entry.states.get(compilation.NAME)
    lookups_before = compilation.cache_lookups(device)
    with execution_mode(handle.mode, device) as mode_ran:
        warmup = compilation.warm_up(compiled, task.call_batch(request), run_at, on_progress)
        reset_peak_memory(device)
        start = time.perf_counter()
        output, activity = _run(entry, pipe, run_denoisers, plan, on_step, preview, decode)
        sample_seconds = time.perf_counter() - start
    peak = peak_memory_bytes(device)
    lookups = compilation.lookups_since(lookups_before, compilation.cache_lookups(device))
    if compiled:
        notes += warmup.notes
        notes.append("compile: " + compilation.describe(compiled, shape_of(task, request), activity))
    info = RunInfo(device=device.type, mode=mode_ran, task=task.name, pipeline=type(pipe).__name__,  # either kind
                   placement=handle.placement.value, loaded=loaded,
                   load_seconds=load_seconds, sample_seconds=sample_seconds,
                   peak_device_memory_mb=None if peak is None else peak / 2**20,
                   compiled_now=bool(activity.graphs) if compiled else None,
                   compile_seconds=activity.seconds + warmup.seconds, grad_mode="; ".join(sorted(grad_modes)),
                   compile_cache=compilation.cache_folders(), compile_cache_lookups=lookups,
                   frames=request.frames, fps=family.fps if request.frames else 0.0, **sound_info(output.audio),
                   notes=tuple(notes))
    log.info("TPU Diffusers: %s", info.summary().replace("\n", "; "))
    return Generation(images=output.images, info=info, latent=output.latent, mask=output.mask, audio=output.audio)


def sound_info(audio: dict | None) -> dict:
    """RunInfo's fields of a sound track (ComfyUI's AUDIO): its sample rate and each video's seconds of it."""
    if audio is None:
        return {}
    rate = audio["sample_rate"]
    return {"sample_rate": rate, "audio_seconds": audio["waveform"].shape[-1] / rate}


def _run(entry: LoadedPipeline, pipe, run_denoisers: tuple, plan: Plan, on_step,
         preview: PreviewSpec | None = None, decode=None):
    """One task run on `pipe` (entry's pipeline of the task's class), with the request's latent upscaler if it has
    one, decoded by `decode` (the family's latent decoder's pipeline) where the model has one; with a compiled
    denoiser, its compiles are counted and explained."""
    upscaler, two_stage = plan.request.upscaler, plan.family.two_stage
    upsample = entry.upsample_pipeline(two_stage, upscaler) if upscaler and two_stage else None
    if upsample is not None:  # between the stages: the refine stage's LoRAs
        upsample = lora.refine_after(entry, upsample)
    try:
        return compilation.counted_run(
            entry.states.get(compilation.NAME), run_denoisers, shape_of(plan.task, plan.request),
            lambda: plan.task.run(pipe, plan.family, plan.pipeline, plan.request, on_step, preview, plan.outputs,
                                  upsample, decode))
    except CompileError:
        entry.states.pop(compilation.NAME, None)  # the denoiser is eager again; the next compiled run starts afresh
        raise


def shape_of(task: Task, request: SampleRequest) -> tuple[int, int, int, int]:
    """(width, height, batch, frames) as one pipeline call's denoiser input sees it (frames 0: images)."""
    return request.width, request.height, task.call_batch(request), request.frames
