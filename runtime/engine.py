"""The runtime's front door: plan a request once (runtime/plan.py), then run it in this process
(runtime/local_run.py) or on a worker group (runtime/worker_client.py), and say what to try when the device
runs out of memory or lacks an op.

One process-wide `Engine` holds the loaded pipelines, so ComfyUI nodes stay stateless. A handle with a
mesh goes to a worker group, whose ranks run an engine of their own (runtime/worker_program.py). Everything
here works without ComfyUI; the nodes only adapt inputs, progress and cancel.
"""

from __future__ import annotations

import logging
import traceback

from . import memory_plan
from .device import (DeviceInfo, available_host_memory_bytes, is_out_of_memory, missing_device_op, missing_op_advice,
                     resolve_device)
from .distributed.group import WorkerGroups
from .distributed.sharding import uneven_gather_advice, uneven_gather_on_cpu
from .errors import DeviceOutOfMemoryError, MissingDeviceOpError, UserInputError
from .preview import PreviewSpec
from .handle import PipelineHandle
from .local_run import realise, run_locally
from .pipeline_cache import LoadedPipeline, PipelineCache
from .plan import Plan, loaded_handle, plan_request
from .run_info import Generation, RunInfo  # noqa: F401  (what a generate returns, importable from here)
from .specs import Placement, ProgressCallback
from .tasks import SampleRequest, check_host_memory
from .worker_client import free_chips_for_this_process, generate_on_workers, worker_handle

log = logging.getLogger("tpu_diffusers")


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
        entry, loaded = realise(self.cache, handle, device, on_progress)
        return entry, device, loaded

    def generate(self, handle: PipelineHandle, request: SampleRequest, on_progress: ProgressCallback | None = None,
                 preview: PreviewSpec | None = None) -> Generation:
        """Sample `request` with the pipeline `handle` describes: planned here, once (`run`)."""
        device = resolve_device(handle.device)
        to_run = worker_handle(self.workers, handle, device) or handle
        plan = plan_request(to_run, request, device)
        return self.run(loaded_handle(to_run, plan), plan, on_progress, preview)

    def run(self, handle: PipelineHandle, plan: Plan, on_progress: ProgressCallback | None = None,
            preview: PreviewSpec | None = None) -> Generation:
        """Run a planned request (a worker rank runs its share of the client's plan here). While it runs, the
        pipelines stay on the device (the cache's `running`). When the device runs out of memory, what the pack
        holds is freed and a DeviceOutOfMemoryError says what to try, so the next run starts clean
        (docs/memory.md). A handle with a mesh (a single-chip run in a worker process has one of one chip) goes to
        a worker group, except inside a worker rank."""
        with self.cache.running():
            try:
                return self._run(handle, plan, on_progress, preview)
            except Exception as error:
                op = missing_device_op(error)
                if op is not None:
                    raise MissingDeviceOpError(missing_op_advice(op, handle.model_class, plan.device.type)) from error
                if uneven_gather_on_cpu(error):
                    raise UserInputError(uneven_gather_advice(handle.model_class, plan.layout[1])) from error
                if not is_out_of_memory(error):
                    raise
                log.warning("TPU Diffusers: %s", "".join(traceback.format_exception(error)).rstrip())
                error.__traceback__ = None  # its frames hold the pipeline and the run's tensors: nothing is freed
                self.cache.free_after_out_of_memory(plan.device)
                raise DeviceOutOfMemoryError(out_of_memory_advice(error, handle, plan)) from error

    def _run(self, handle: PipelineHandle, plan: Plan, on_progress: ProgressCallback | None,
             preview: PreviewSpec | None) -> Generation:
        check_host_memory(plan.task, plan.request, available_host_memory_bytes())
        plan_notes = [] if self.workers is None else memory_plan.check_fits(  # a worker's were checked before
            handle, plan.family, plan.request, holding=bool(self.cache) or self.workers.holds_local_workers())
        if handle.mesh is not None and self.workers is not None:
            return generate_on_workers(self.workers, self.cache, handle, plan, on_progress, preview, plan_notes)
        free_chips_for_this_process(self.workers, plan.device)
        return run_locally(self.cache, handle, plan, on_progress, preview, plan_notes)

    def unload(self) -> int:
        """Drop all loaded pipelines and stop the worker group (ComfyUI's "Unload Models");
        returns how many were dropped."""
        return self.cache.clear(resolve_device("auto")) + (self.workers.stop() if self.workers else 0)


def out_of_memory_advice(error: BaseException, handle: PipelineHandle, plan: Plan) -> str:
    """What ran out of device memory (placement, batch, size), and what takes less of it."""
    request = plan.request
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
    return (f"{plan.device.type} ran out of memory running {handle.model_class} with placement "
            f"'{handle.placement}', batch {request.batch_size} at {request.width}x{request.height} ({cause}). "
            f"TPU Diffusers freed its loaded pipelines: the next run loads the model again. "
            f"Try {', '.join(tries[:-1])}, or {tries[-1]}.")


ENGINE = Engine()
