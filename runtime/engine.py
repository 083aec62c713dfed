"""The runtime's front door: realise a handle and generate images with it.

One process-wide `Engine` holds the loaded pipelines, so ComfyUI nodes stay stateless.
Everything here works without ComfyUI; the nodes only adapt inputs, progress and cancel.
"""

from __future__ import annotations

import dataclasses
import logging
import time

from . import compile_cache, single_file
from .compile_cache import CompileRequest, CompileState
from .device import DeviceInfo, available_host_memory_bytes, peak_memory_bytes, reset_peak_memory, resolve_device
from .distributed.group import WorkerGroupError, WorkerGroups
from .distributed.mesh import check_mesh, world_size
from .errors import UserInputError
from .families import Family, family_for
from .handle import PipelineHandle
from .loading import LoadedPipeline, PipelineCache, ProgressCallback
from .lora import LORA_WITH_MESH, LoraUnloadError, apply_loras
from .modes import execution_mode, grad_mode, outside_inference_mode
from .preview import PreviewSpec
from .sampling import SampleRequest, check_host_memory, run_pipeline, validate_request
from .specs import CompileSpec, ExecutionMode, Placement, Workers

log = logging.getLogger("tpu_diffusers")

WARMUP_STEPS = 2  # the step count does not change the compiled graph; two steps exercise the whole loop


@dataclasses.dataclass(frozen=True)
class RunInfo:
    """What actually happened in one run, for the node's info output and the log."""

    device: str
    mode: str  # the mode that ran, which may differ from the one asked for
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
    mesh_shape: tuple[int, ...] = ()  # (replicas, tp) of a worker group
    replica_images: tuple[int, ...] = ()  # images each replica made, in batch order
    replica_sample_seconds: tuple[float, ...] = ()
    replica_step_seconds: tuple[float, ...] = ()  # each replica's sampling seconds per step
    replica_compile_seconds: tuple[float, ...] = ()  # each replica's compile time (the compile cache may share it)
    replica_ranks: tuple[tuple[int, ...], ...] = ()  # the ranks of each replica (its TP group)
    grad_mode: str = ""  # seen inside the denoising loop: TorchTPU cannot compile under inference mode
    compile_cache: dict = dataclasses.field(default_factory=dict)  # compile_cache.cache_folders()
    compile_cache_lookups: dict = dataclasses.field(default_factory=dict)  # this run's; compile_cache.cache_lookups()
    notes: tuple[str, ...] = ()

    def as_dict(self) -> dict:
        return dataclasses.asdict(self)

    def summary(self) -> str:
        load = f"loaded in {self.load_seconds:.1f}s" if self.loaded else "reused loaded pipeline"
        lines = [f"device: {self.device}", f"mode: {self.mode}", f"placement: {self.placement}",
                 f"pipeline: {load}", f"sampling: {self.sample_seconds:.2f}s ({self.grad_mode})", *self.notes]
        if self.mesh_shape:
            lines.append(f"mesh: {self.mesh_shape[0]} replica(s) x {self.mesh_shape[1]} TP; " + ", ".join(
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
        self._apply_compile(entry, handle, device)
        return entry, device, loaded

    def generate(self, handle: PipelineHandle, request: SampleRequest, on_progress: ProgressCallback | None = None,
                 preview: PreviewSpec | None = None) -> Generation:
        """Sample `request` with the pipeline `handle` describes. With a preview spec, each sampling step's
        on_progress call also gets that step's preview image: on_progress(done, total, "sampling", image)."""
        family = family_for(handle.pipeline_class)
        validate_request(family, request)  # fail before loading anything
        check_host_memory(request, available_host_memory_bytes())
        notes = []
        if request.negative_prompt.strip() and not family.takes_negative_prompt:
            notes.append(f"negative prompt ignored: {family.name} takes none")
        if handle.mesh is not None and handle.loras:
            raise UserInputError(LORA_WITH_MESH)
        if handle.mesh is not None and self.workers is not None:
            return self._generate_on_workers(handle, request, notes, on_progress, preview)
        self._free_chips_for_this_process(handle)
        start = time.perf_counter()
        entry, device, loaded = self.realise(handle, on_progress)
        load_seconds = time.perf_counter() - start
        notes += entry.lora.notes

        grad_modes = set()

        def on_step(done: int, total: int, *preview_image) -> None:
            grad_modes.add(grad_mode())
            if on_progress:
                on_progress(done, total, "sampling", *preview_image)

        lookups_before = compile_cache.cache_lookups(device)
        with execution_mode(handle.mode, device) as mode_ran:
            warmup = self._warm_up(entry, family, request, device, on_progress)
            reset_peak_memory(device)
            start = time.perf_counter()
            images, activity = self._run(entry, family, request, on_step, preview)
            sample_seconds = time.perf_counter() - start
        peak = peak_memory_bytes(device)
        lookups = compile_cache.lookups_since(lookups_before, compile_cache.cache_lookups(device))
        if entry.compiled:
            notes += warmup.notes
            notes.append("compile: " + compile_cache.describe(entry.compiled, shape_of(request), activity))
        info = RunInfo(device=device.type, mode=mode_ran, placement=handle.placement.value, loaded=loaded,
                       load_seconds=load_seconds, sample_seconds=sample_seconds,
                       peak_device_memory_mb=None if peak is None else peak / 2**20,
                       compiled_now=bool(activity.graphs) if entry.compiled else None,
                       compile_seconds=activity.seconds + warmup.seconds, grad_mode="; ".join(sorted(grad_modes)),
                       compile_cache=compile_cache.cache_folders(), compile_cache_lookups=lookups, notes=tuple(notes))
        log.info("TPU Diffusers: %s", info.summary().replace("\n", "; "))
        return Generation(images=images, info=info)

    def unload(self) -> int:
        """Drop all loaded pipelines and stop the worker group (ComfyUI's "Unload Models");
        returns how many were dropped."""
        return self.cache.clear(resolve_device("auto")) + (self.workers.stop() if self.workers else 0)

    # --- tensor parallelism
    def _generate_on_workers(self, handle: PipelineHandle, request: SampleRequest, notes: list[str],
                             on_progress: ProgressCallback | None, preview: PreviewSpec | None) -> Generation:
        """One process per chip, replicas x tp of them: checked here, before anything launches; run by
        the worker group, which splits the batch over the replicas."""
        device = resolve_device(handle.device)
        if handle.placement is not Placement.DEVICE:
            raise UserInputError("tensor parallelism keeps every shard on its chip; set the Mode Selector's "
                                 "placement to 'device' (model CPU offload does not combine with a TP Mesh).")
        # single files: the mesh is checked against their configs folder (local, or the hub's config files)
        source = single_file.config_folder(handle.source) if handle.files else handle.source
        notes += check_mesh(handle.mesh, source, device, from_files=frozenset(dict(handle.files)))
        size = world_size(handle.mesh, device)
        if device.type != "cpu" and handle.mesh.workers is Workers.LAUNCH_LOCAL:
            self.cache.clear(device)  # the local ranks need every chip, this process's pipelines included
        start = time.perf_counter()
        group, launched = self.workers.get(handle, device, size, on_progress)
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
            "replica_sample_seconds", "replica_step_seconds", "replica_compile_seconds")})
        info.update(load_seconds=time.perf_counter() - start - info["sample_seconds"] if launched
                    else info["load_seconds"],
                    replica_ranks=tuple(map(tuple, info["replica_ranks"])),
                    worker_pids=(*group.pids(), *rank_pids),
                    notes=(*notes, f"worker group of {group.world_size} ranks "
                                   f"({'attached' if group.process is None else 'launched here'})", *info["notes"]))
        run = RunInfo(**info)
        log.info("TPU Diffusers: %s", run.summary().replace("\n", "; "))
        return Generation(images=images, info=run)

    def _free_chips_for_this_process(self, handle: PipelineHandle) -> None:
        """A single-process run needs the chip that locally launched TP workers hold: stop them first."""
        if self.workers is not None and self.workers.holds_local_workers() \
                and resolve_device(handle.device).type != "cpu":
            self.workers.stop()

    # --- compiled mode
    @staticmethod
    def _apply_compile(entry: LoadedPipeline, handle: PipelineHandle, device: DeviceInfo) -> None:
        """Compile, recompile with other options, or go back to eager, as the handle asks."""
        spec = handle.compile or CompileSpec()
        request = CompileRequest.of(spec, handle.placement, device)
        wanted = handle.mode is ExecutionMode.COMPILED
        if entry.compiled and (not wanted or not entry.compiled.matches(request)):
            compile_cache.remove_compile(entry.pipe)
            entry.compiled = None
        if wanted and entry.compiled is None:
            entry.compiled = compile_cache.compile_transformer(entry.pipe, request)
        if wanted:
            entry.compiled.warmup_sizes = spec.warmup_sizes  # may change without a recompile

    def _run(self, entry: LoadedPipeline, family: Family, request: SampleRequest, on_step,
             preview: PreviewSpec | None = None):
        """One pipeline call; with a compiled transformer, its compiles are counted and explained."""
        state: CompileState | None = entry.compiled
        if state is None:
            return run_pipeline(entry.pipe, family, request, on_step, preview), compile_cache.CompileActivity()
        try:
            with compile_cache.explained_compile_failures(state, entry.pipe), compile_cache.dynamo_limits(), \
                    compile_cache.watch_compiles() as activity:
                images = run_pipeline(entry.pipe, family, request, on_step, preview)
        except compile_cache.CompileError:
            entry.compiled = None  # the transformer is eager again; the next compiled run starts afresh
            raise
        compile_cache.record_run(state, shape_of(request), activity)
        return images, activity

    def _warm_up(self, entry: LoadedPipeline, family: Family, request: SampleRequest, device: DeviceInfo,
                 on_progress: ProgressCallback | None) -> "Warmup":
        """Compile the spec's warm-up sizes ahead, once per loaded pipeline, with progress and cancel."""
        state = entry.compiled
        result = Warmup()
        if state is None:
            return result
        pending = [(w, h) for w, h in state.warmup_sizes if (w, h, request.batch_size) not in state.warmed]
        for index, (width, height) in enumerate(pending):
            warm_request = dataclasses.replace(request, width=width, height=height, steps=WARMUP_STEPS)
            validate_request(family, warm_request)

            def on_step(_done, _total, index=index, label=f"warm-up {width}x{height}"):
                if on_progress:
                    on_progress(index, len(pending), label)

            _, activity = self._run(entry, family, warm_request, on_step)
            state.warmed.add(shape_of(warm_request))
            result.seconds += activity.seconds
            result.notes.append(f"warm-up: {compile_cache.describe(state, shape_of(warm_request), activity)}")
        return result


@dataclasses.dataclass
class Warmup:
    seconds: float = 0.0
    notes: list[str] = dataclasses.field(default_factory=list)


def shape_of(request: SampleRequest) -> tuple[int, int, int]:
    return request.width, request.height, request.batch_size


ENGINE = Engine()
