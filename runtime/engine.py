"""The runtime's front door: realise a handle's load spec, apply the features its run options ask for,
run the task.

One process-wide `Engine` holds the loaded pipelines, so ComfyUI nodes stay stateless. A handle with a
mesh goes to a worker group, whose ranks run this same engine. Everything here works without ComfyUI;
the nodes only adapt inputs, progress and cancel.
"""

from __future__ import annotations

import dataclasses
import logging
import time
import traceback

from . import memory_plan, settings, single_file
from .device import (DeviceInfo, available_host_memory_bytes, is_out_of_memory, missing_device_op, missing_op_advice,
                     peak_memory_bytes, reset_peak_memory, resolve_device)
from .distributed.group import WorkerGroups
from .distributed.mesh import check_mesh, context_parallel_notes, mesh_shape, world_size
from .errors import (CompileError, DeviceOutOfMemoryError, LoraUnloadError, MissingDeviceOpError, UserInputError,
                     WorkerGroupError)
from .families import Family, TaskPipeline, family_for
from .features import compilation
from .features.lora import LORA_WITH_MESH, apply_loras
from .features.preview import PreviewSpec
from .handle import PipelineHandle
from .modes import execution_mode, grad_mode, outside_inference_mode
from .pipeline_cache import LoadedPipeline, PipelineCache
from .sources import model_settings
from .specs import CompileSpec, ExecutionMode, MeshSpec, Placement, ProgressCallback, Workers
from .tasks import SampleRequest, Task, check_host_memory, prepare
from .tasks import images as image_inputs

log = logging.getLogger("tpu_diffusers")

SINGLE_CHIP = MeshSpec(chips=1, replicas=1)  # a single-chip run in a worker process: a group of one rank


@dataclasses.dataclass(frozen=True)
class RunInfo:
    """What actually happened in one run, for the node's info output and the log."""

    device: str
    mode: str  # the mode that ran, which may differ from the one asked for
    task: str  # e.g. text2image
    pipeline: str  # the diffusers class that ran
    placement: str
    loaded: bool  # False when the pipeline came from the cache
    load_seconds: float
    sample_seconds: float
    peak_device_memory_mb: float | None = None  # None on cpu, where the process RSS is the measure
    compiled_now: bool | None = None  # None when not in compiled mode
    compile_seconds: float = 0.0  # dynamo's compile time in this run (warm-up included)
    world_size: int = 1  # ranks that ran it (tensor parallelism)
    transformer_bytes_per_rank: tuple[int, ...] = ()  # weight bytes each rank holds (tensor parallelism)
    sharded_fraction_per_rank: tuple[float, ...] = ()  # share of the sharded weights each rank holds
    worker_pids: tuple[int, ...] = ()  # the worker group's launcher process (tensor parallelism, local launch)
    mesh_shape: tuple[int, ...] = ()  # (replicas, cp, tp) of a worker group, as its ranks resolved the mesh
    context_parallel: int = 1  # ranks per replica that split each video's tokens (the mesh's cp)
    tokens_per_rank: tuple[int, ...] = ()  # latent tokens each rank's transformer runs (1/cp of them under CP)
    image_bytes_per_rank: tuple[int, ...] = ()  # image bytes each rank gave rank 0 (a replica's first rank only)
    replica_images: tuple[int, ...] = ()  # images each replica made, in batch order
    replica_sample_seconds: tuple[float, ...] = ()
    replica_step_seconds: tuple[float, ...] = ()  # each replica's sampling seconds per step
    replica_compile_seconds: tuple[float, ...] = ()  # each replica's compile time (the compile cache may share it)
    replica_ranks: tuple[tuple[int, ...], ...] = ()  # the ranks of each replica (its TP group)
    grad_mode: str = ""  # seen inside the denoising loop: TorchTPU cannot compile under inference mode
    compile_cache: dict = dataclasses.field(default_factory=dict)  # compilation.cache_folders()
    compile_cache_lookups: dict = dataclasses.field(default_factory=dict)  # this run's; compilation.cache_lookups()
    frames: int = 0  # video: frames per video (the images output holds batch x frames of them)
    fps: float = 0.0  # video: the model's frame rate
    notes: tuple[str, ...] = ()

    def as_dict(self) -> dict:
        return dataclasses.asdict(self)

    def summary(self) -> str:
        load = f"loaded in {self.load_seconds:.1f}s" if self.loaded else "reused loaded pipeline"
        lines = [f"device: {self.device}", f"task: {self.task} ({self.pipeline})", f"mode: {self.mode}",
                 f"placement: {self.placement}",
                 f"pipeline: {load}", f"sampling: {self.sample_seconds:.2f}s ({self.grad_mode})", *self.notes]
        if self.frames:
            lines.insert(2, f"video: {self.frames} frames at {self.fps:g} fps")
        if self.mesh_shape and self.world_size > 1:
            replicas, cp, tp = self.mesh_shape
            parallel = f"{cp} CP" if cp > 1 else f"{tp} TP"
            lines.append(f"mesh: {replicas} replica(s) x {parallel}; " + ", ".join(
                f"replica {i} ranks {list(ranks)}: {images} image(s), {step:.3f}s/step" for i, (ranks, images, step)
                in enumerate(zip(self.replica_ranks, self.replica_images, self.replica_step_seconds))))
        if self.compile_cache and (self.compiled_now is not None or self.device == "tpu"):
            cache = self.compile_cache
            tpu = f", TorchTPU tier 3 {cache['tpu_tier3']}" if self.device == "tpu" else ""
            lines.append(f"compile cache: inductor {cache['inductor']}{tpu} (settings applied: {cache['applied']})")
        if any(self.compile_cache_lookups.values()):
            lines.append("compile cache lookups: " + ", ".join(f"{name} {count}" for name, count
                                                                in self.compile_cache_lookups.items()))
        return "\n".join(lines)


@dataclasses.dataclass(frozen=True)
class Generation:
    images: object  # torch.Tensor [B, H, W, C] float32 in 0..1
    info: RunInfo


class Engine:
    def __init__(self, cache: PipelineCache | None = None, distribute: bool = True):
        self.cache = cache if cache is not None else PipelineCache()  # an empty cache is falsy
        # Handles with a TP mesh go to a worker group, except inside a worker, which runs them itself.
        self.workers = WorkerGroups() if distribute else None

    def realise(self, handle: PipelineHandle,
                on_progress: ProgressCallback | None = None) -> tuple[LoadedPipeline, DeviceInfo, bool]:
        """The loaded, placed pipeline for a handle, compiled or not as the handle says; and whether
        it was loaded just now."""
        device = resolve_device(handle.device)
        with outside_inference_mode():  # weights loaded under inference mode would be inference tensors
            entry, loaded = self.cache.get(handle, device, on_progress)
            # fused in place, before compiling: a compiled transformer keeps its graphs (only weight values change)
            try:
                apply_loras(entry.pipe, handle.loras, entry.lora, on_progress)  # its notes stay in entry.lora.notes
            except LoraUnloadError:
                self.cache.clear(device)
                raise
        entry.compiled = compilation.apply(entry.compiled, self.denoisers(entry, handle), handle.compile or CompileSpec(),
                                           handle.placement, device, wanted=handle.mode is ExecutionMode.COMPILED,
                                           prepare=family_for(handle.model_class).prepare_compile)
        return entry, device, loaded

    @staticmethod
    def denoiser(entry: LoadedPipeline, handle: PipelineHandle):
        """The loaded pipeline's denoising model (transformer or unet)."""
        return getattr(entry.pipe, family_for(handle.model_class).denoiser)

    @staticmethod
    def denoisers(entry: LoadedPipeline, handle: PipelineHandle) -> tuple:
        """Every denoising model the loaded pipeline has (Wan 2.2 A14B: both experts; TI2V-5B has no second)."""
        loaded = (getattr(entry.pipe, name, None) for name in family_for(handle.model_class).denoisers)
        return tuple(model for model in loaded if model is not None)

    def generate(self, handle: PipelineHandle, request: SampleRequest, on_progress: ProgressCallback | None = None,
                 preview: PreviewSpec | None = None) -> Generation:
        """Sample `request` (see _generate). While it runs, the pipelines stay on the device (the cache's
        `running`). When the device runs out of memory, what the pack holds is freed and a
        DeviceOutOfMemoryError says what to try, so the next run starts clean (docs/memory.md)."""
        with self.cache.running():
            try:
                return self._generate(handle, request, on_progress, preview)
            except Exception as error:
                op = missing_device_op(error)
                if op is not None:
                    device = resolve_device(handle.device).type
                    raise MissingDeviceOpError(missing_op_advice(op, handle.model_class, device)) from error
                if not is_out_of_memory(error):
                    raise
                log.warning("TPU Diffusers: %s", "".join(traceback.format_exception(error)).rstrip())
                error.__traceback__ = None  # its frames hold the pipeline and the run's tensors: nothing is freed
                self.cache.free_after_out_of_memory(resolve_device(handle.device))
                raise DeviceOutOfMemoryError(out_of_memory_advice(error, handle, request)) from error

    def _generate(self, handle: PipelineHandle, request: SampleRequest, on_progress: ProgressCallback | None,
                  preview: PreviewSpec | None) -> Generation:
        """Sample `request` with the pipeline `handle` describes. With a preview spec, each sampling step's
        on_progress call also gets that step's preview image: on_progress(done, total, "sampling", image)."""
        # fails before loading anything
        family, task, pipeline, request = prepare(handle.model_class, request, model_settings(handle.source))
        check_host_memory(task, request, available_host_memory_bytes())
        plan_notes = [] if self.workers is None else memory_plan.check_fits(  # a worker's were checked before
            handle, family, request, holding=bool(self.cache) or self.workers.holds_local_workers())
        on_workers = self._worker_handle(handle)
        if on_workers is not None:
            return self._generate_on_workers(on_workers, family, request, on_progress, preview, plan_notes)
        notes = [*plan_notes, *image_inputs.notes(request)]
        if request.negative_prompt.strip() and not family.takes_negative_prompt:
            notes.append(f"negative prompt ignored: {family.name} takes none")
        self._free_chips_for_this_process(handle)
        start = time.perf_counter()
        entry, device, loaded = self.realise(handle, on_progress)
        # the loaded model's own settings decide (a hub model's were not readable before it was downloaded)
        family, task, pipeline, request = prepare(handle.model_class, request, dict(entry.pipe.config))
        pipe = entry.pipeline(pipeline.cls, task.name)  # pipeline kind: a modular pipeline runs the task's workflow
        load_seconds = time.perf_counter() - start
        notes += entry.notes + entry.lora.notes

        grad_modes = set()

        def on_step(done: int, total: int, *preview_image) -> None:
            grad_modes.add(grad_mode())
            if on_progress:
                on_progress(done, total, "sampling", *preview_image)

        denoisers = self.denoisers(entry, handle)

        def run_at(width: int, height: int, image_size, on_warm_step) -> compilation.CompileActivity:
            # the request's own inputs at that size (diffusers resizes them, or image_size says), all steps
            warm_request = dataclasses.replace(
                request, width=width, height=height, steps=compilation.WARMUP_STEPS, denoise=1.0,
                batch_size=task.call_batch(request),
                images=tuple(image_inputs.resized(image, image_size) for image in request.images))
            task.validate(family, pipeline, warm_request)
            return self._run(entry, pipe, denoisers, task, family, pipeline, warm_request, on_warm_step)[1]

        lookups_before = compilation.cache_lookups(device)
        with execution_mode(handle.mode, device) as mode_ran:
            warmup = compilation.warm_up(entry.compiled, task.call_batch(request), run_at, on_progress)
            reset_peak_memory(device)
            start = time.perf_counter()
            output, activity = self._run(entry, pipe, denoisers, task, family, pipeline, request, on_step, preview)
            sample_seconds = time.perf_counter() - start
        peak = peak_memory_bytes(device)
        lookups = compilation.lookups_since(lookups_before, compilation.cache_lookups(device))
        if entry.compiled:
            notes += warmup.notes
            notes.append("compile: " + compilation.describe(entry.compiled, shape_of(task, request), activity))
        info = RunInfo(device=device.type, mode=mode_ran, task=task.name, pipeline=type(pipe).__name__,  # either kind
                       placement=handle.placement.value, loaded=loaded,
                       load_seconds=load_seconds, sample_seconds=sample_seconds,
                       peak_device_memory_mb=None if peak is None else peak / 2**20,
                       compiled_now=bool(activity.graphs) if entry.compiled else None,
                       compile_seconds=activity.seconds + warmup.seconds, grad_mode="; ".join(sorted(grad_modes)),
                       compile_cache=compilation.cache_folders(), compile_cache_lookups=lookups,
                       frames=request.frames, fps=family.fps if request.frames else 0.0, notes=tuple(notes))
        log.info("TPU Diffusers: %s", info.summary().replace("\n", "; "))
        return Generation(images=output, info=info)

    def unload(self) -> int:
        """Drop all loaded pipelines and stop the worker group (ComfyUI's "Unload Models");
        returns how many were dropped."""
        return self.cache.clear(resolve_device("auto")) + (self.workers.stop() if self.workers else 0)

    # --- worker processes
    def _worker_handle(self, handle: PipelineHandle) -> PipelineHandle | None:
        """The handle to run on a worker group, or None to run in this process: a TP Mesh always goes
        to workers; a single-chip run does as TPU_DIFFUSERS_WORKER_PROCESS says (tpu: on a TPU only),
        as a group of one rank. Inside a worker (no groups of its own) everything runs here."""
        if self.workers is None:
            return None
        if handle.mesh is not None:
            return handle
        where = settings.get("TPU_DIFFUSERS_WORKER_PROCESS")
        if where == "always" or (where == "tpu" and resolve_device(handle.device).type == "tpu"):
            return handle.replace(mesh=SINGLE_CHIP)
        return None

    def _generate_on_workers(self, handle: PipelineHandle, family: Family, request: SampleRequest,
                             on_progress: ProgressCallback | None, preview: PreviewSpec | None,
                             plan_notes: list[str]) -> Generation:
        """One process per chip, replicas x tp of them: checked here, before anything launches; run by
        the worker group, which splits the batch over the replicas. `plan_notes`: the memory plan's, for the
        run info."""
        device = resolve_device(handle.device)
        shape = mesh_shape(handle.mesh, world_size(handle.mesh, device))
        _, cp, tp = shape
        if tp > 1 and handle.placement is not Placement.DEVICE:
            raise UserInputError("tensor parallelism keeps every shard on its chip; set the Mode Selector's "
                                 "placement to 'device' (model CPU offload does not combine with a TP Mesh).")
        if tp > 1 and handle.loras:
            raise UserInputError(LORA_WITH_MESH)
        if cp > 1 and handle.mode is ExecutionMode.COMPILED and (handle.compile or CompileSpec()).fullgraph:
            raise UserInputError("compiled mode with context parallelism needs fullgraph off (TPU Compile "
                                 "Transformer): diffusers' Ulysses attention hooks break the graph where dynamo "
                                 "cannot trace them (measured on CPU: 'Unsupported hasattr call').")
        # single files: the mesh is checked against their configs folder (local, or the hub's config files)
        source = single_file.config_folder(handle.source) if handle.files and (tp > 1 or cp > 1) else handle.source
        notes = plan_notes + check_mesh(handle.mesh, source, device, from_files=frozenset(dict(handle.files)))
        if cp > 1:
            notes += context_parallel_notes(cp, family, request.width, request.height, request.frames, source)
        if device.type != "cpu" and handle.mesh.workers is Workers.LAUNCH_LOCAL:
            self.cache.clear(device)  # the local ranks need every chip, this process's pipelines included
        start = time.perf_counter()
        use = self.workers.get(handle.mesh, shape, device, on_progress)
        group, launched = use.group, use.started
        try:
            images, info = group.generate(handle, request, on_progress, preview)
        except WorkerGroupError:
            self.workers.stop()  # the next run relaunches
            raise
        rank_pids = info.pop("rank_pids")
        fields = {f.name for f in dataclasses.fields(RunInfo)}
        info = {k: v for k, v in info.items() if k in fields}
        info.update({name: tuple(info[name]) for name in (
            "transformer_bytes_per_rank", "sharded_fraction_per_rank", "mesh_shape", "replica_images",
            "tokens_per_rank", "image_bytes_per_rank",
            "replica_sample_seconds", "replica_step_seconds", "replica_compile_seconds")})
        info.update(load_seconds=time.perf_counter() - start - info["sample_seconds"] if launched
                    else info["load_seconds"],
                    replica_ranks=tuple(map(tuple, info["replica_ranks"])),
                    worker_pids=(*group.pids(), *rank_pids),
                    notes=(*notes, use.note, *info["notes"]))
        run = RunInfo(**info)
        log.info("TPU Diffusers: %s", run.summary().replace("\n", "; "))
        return Generation(images=images, info=run)

    def _free_chips_for_this_process(self, handle: PipelineHandle) -> None:
        """A single-process run needs the chip that locally launched TP workers hold: stop them first."""
        if self.workers is not None and self.workers.holds_local_workers() \
                and resolve_device(handle.device).type != "cpu":
            self.workers.stop()

    @staticmethod
    def _run(entry: LoadedPipeline, pipe, denoisers: tuple, task: Task, family: Family, pipeline: TaskPipeline,
             request: SampleRequest, on_step, preview: PreviewSpec | None = None):
        """One task run on `pipe` (entry's pipeline of the task's class); with a compiled denoiser, its
        compiles are counted and explained."""
        try:
            return compilation.counted_run(entry.compiled, denoisers, shape_of(task, request),
                                           lambda: task.run(pipe, family, pipeline, request, on_step, preview))
        except CompileError:
            entry.compiled = None  # the denoiser is eager again; the next compiled run starts afresh
            raise


def out_of_memory_advice(error: BaseException, handle: PipelineHandle, request: SampleRequest) -> str:
    """What ran out of device memory (placement, batch, size), and what takes less of it."""
    tries = []
    if handle.placement is Placement.DEVICE:
        tries.append("model CPU offload (the Mode Selector's placement 'model_cpu_offload': each model is on the "
                     "device only while it runs)")
    tries.append(f"a smaller batch_size (it was {request.batch_size}) or image size" if request.batch_size > 1
                 else "a smaller image size")
    if handle.mesh is not None and handle.mesh.chips != 1:
        tries.append("a TP Mesh with more chips")
    else:
        tries.append("a TP Mesh (placement 'device'), which shards the model over several chips")
    cause = str(error).strip().splitlines()[0] if str(error).strip() else type(error).__name__
    return (f"{resolve_device(handle.device).type} ran out of memory running {handle.model_class} with placement "
            f"'{handle.placement}', batch {request.batch_size} at {request.width}x{request.height} ({cause}). "
            f"TPU Diffusers freed its loaded pipelines: the next run loads the model again. "
            f"Try {', '.join(tries[:-1])}, or {tries[-1]}.")


def shape_of(task: Task, request: SampleRequest) -> tuple[int, int, int, int]:
    """(width, height, batch, frames) as one pipeline call's denoiser input sees it (frames 0: images)."""
    return request.width, request.height, task.call_batch(request), request.frames


ENGINE = Engine()
