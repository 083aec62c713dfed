"""ComfyUI's side of a worker group: which runs go to one (the policy), what is refused before anything launches,
and the run itself through `WorkerGroups` (one process per chip, replicas x cp x tp of them), whose rank 0's run
info becomes a RunInfo here.
"""

from __future__ import annotations

import dataclasses
import logging
import time

from . import settings, single_file
from .device import DeviceInfo
from .distributed.group import WorkerGroups
from .distributed.mesh import check_mesh, context_parallel_notes
from .errors import UserInputError, WorkerGroupError
from .features.lora import LORA_WITH_MESH
from .preview import PreviewSpec
from .handle import PipelineHandle
from .pipeline_cache import PipelineCache
from .plan import Plan
from .run_info import Generation, RunInfo
from .specs import CompileSpec, ExecutionMode, MeshSpec, Placement, ProgressCallback, Workers

log = logging.getLogger("tpu_diffusers")

SINGLE_CHIP = MeshSpec(chips=1, replicas=1)  # a single-chip run in a worker process: a group of one rank


def worker_handle(workers: WorkerGroups | None, handle: PipelineHandle, device: DeviceInfo) -> PipelineHandle | None:
    """The handle to run on a worker group, or None to run in this process: a TP Mesh always goes to workers; a
    single-chip run does as TPU_DIFFUSERS_WORKER_PROCESS says (tpu: on a TPU only), as a group of one rank.
    Inside a worker (no groups of its own) everything runs here."""
    if workers is None:
        return None
    if handle.mesh is not None:
        return handle
    where = settings.get("TPU_DIFFUSERS_WORKER_PROCESS")
    if where == "always" or (where == "tpu" and device.type == "tpu"):
        return handle.replace(mesh=SINGLE_CHIP)
    return None


def free_chips_for_this_process(workers: WorkerGroups | None, device: DeviceInfo) -> None:
    """A single-process run needs the chip that locally launched TP workers hold: stop them first."""
    if workers is not None and workers.holds_local_workers() and device.type != "cpu":
        workers.stop()


def check_before_launch(handle: PipelineHandle, plan: Plan) -> list[str]:
    """Refuse what the mesh cannot run before anything launches; returns the mesh's notes for the run info."""
    _, cp, tp = plan.layout
    if tp > 1 and handle.placement is not Placement.DEVICE:
        raise UserInputError("tensor parallelism keeps every shard on its chip; set the Mode Selector's "
                             "placement to 'device' (model CPU offload does not combine with a TP Mesh).")
    if tp > 1 and handle.loras:
        raise UserInputError(LORA_WITH_MESH)
    if cp > 1 and plan.request.reference_video is not None:  # its tokens, appended to the video's, are not counted
        raise UserInputError("a reference_video with context parallelism is not supported yet: run in-context video "
                             "on a mesh without cp (replicas), or disconnect the reference_video.")
    if cp > 1 and handle.mode is ExecutionMode.COMPILED and (handle.compile or CompileSpec()).fullgraph:
        raise UserInputError("compiled mode with context parallelism needs fullgraph off (TPU Compile "
                             "Transformer): diffusers' Ulysses attention hooks break the graph where dynamo "
                             "cannot trace them (measured on CPU: 'Unsupported hasattr call').")
    # single files: the mesh is checked against their configs folder (local, or the hub's config files)
    source = single_file.config_folder(handle.source) if handle.files and (tp > 1 or cp > 1) else handle.source
    notes = check_mesh(handle.mesh, source, plan.device, from_files=frozenset(dict(handle.files)))
    if cp > 1:
        notes += context_parallel_notes(cp, plan.family, plan.request, source, plan.pipeline.keyframes)
    return notes


def generate_on_workers(workers: WorkerGroups, cache: PipelineCache, handle: PipelineHandle, plan: Plan,
                        on_progress: ProgressCallback | None, preview: PreviewSpec | None,
                        plan_notes: list[str]) -> Generation:
    """Run the plan on a worker group, checked here before anything launches; the group splits the batch over
    its replicas. `plan_notes`: the memory plan's, for the run info."""
    notes = plan_notes + check_before_launch(handle, plan)
    if plan.device.type != "cpu" and handle.mesh.workers is Workers.LAUNCH_LOCAL:
        cache.clear(plan.device)  # the local ranks need every chip, this process's pipelines included
    start = time.perf_counter()
    use = workers.get(handle.mesh, plan.layout, plan.device, on_progress)
    group, launched = use.group, use.started
    try:
        images, info, latent, mask, audio = group.generate(handle, plan.to_wire(), plan.request, on_progress, preview)
    except WorkerGroupError:
        workers.stop()  # the next run relaunches
        raise
    run = RunInfo.from_wire(info)
    load_seconds = time.perf_counter() - start - run.sample_seconds if launched else run.load_seconds
    run = dataclasses.replace(run, load_seconds=load_seconds, worker_pids=(*group.pids(), *info["rank_pids"]),
                              notes=(*notes, use.note, *run.notes))
    log.info("TPU Diffusers: %s", run.summary().replace("\n", "; "))
    return Generation(images=images, info=run, latent=latent, mask=mask, audio=audio)
