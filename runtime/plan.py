"""One request's plan: everything a run needs to know about a request, resolved once, at its start.

`plan_request` runs the checks that need no model (the family, the task and its diffusers pipeline, the size)
and resolves the device and the mesh layout; the engine, the local run, the worker-group client and the worker
ranks read the plan instead of asking again. A worker rank gets it over the protocol (`to_wire`/`from_wire`).
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Mapping

from .device import DeviceInfo, resolve_device
from .distributed.mesh import mesh_shape, world_size
from .errors import UserInputError
from .families import Family, TaskPipeline, family_for
from .handle import PipelineHandle
from .sources import model_settings
from .specs import LoraExpert
from .tasks import TASKS, SampleRequest, Task, prepare


@dataclasses.dataclass(frozen=True)
class Plan:
    model_class: str  # the model's model_index _class_name
    family: Family  # as the model's settings make it (`Family.with_settings`)
    task: Task
    pipeline: TaskPipeline  # the diffusers pipeline that runs the task
    device: DeviceInfo  # where this process runs it
    request: SampleRequest  # checked, its size resolved
    outputs: tuple[str, ...]  # what the run gives back: output kinds' names (runtime/outputs.py), e.g. images, latent
    layout: tuple[int, int, int] | None  # (replicas, cp, tp) of the handle's mesh; None: no mesh
    # the model_index settings the family was made with; None: unreadable before loading (a hub model that is
    # not downloaded yet), so the loaded pipeline's config decides (`refined`)
    settings: Mapping | None

    def refined(self, loaded_settings: Mapping) -> "Plan":
        """The plan as the loaded model's settings make it, when they were unknown before loading (a hub model's
        model_index.json is only read once downloaded): a model whose settings change its family's facts
        (`Family.setting_changes`) is then known for what it is, with its own size step. A plan whose settings were read before loading is already right and is returned as is,
        so a request is planned at most twice."""
        if self.settings is not None:
            return self
        return _planned(self.model_class, self.request, dict(loaded_settings), self.device, self.layout)

    def for_batch_slice(self, start: int, count: int) -> "Plan":
        """This plan for the images start..start+count of its batch (a replica's share of it)."""
        return dataclasses.replace(self, request=self.request.batch_slice(start, count))

    def to_wire(self) -> dict:
        """Plain JSON data for worker ranks, beside the request (which travels with its image payloads). The
        device is not sent: each rank runs on its own, resolved where it runs (an attached group may be another
        host's)."""
        return {"model_class": self.model_class, "settings": None if self.settings is None else dict(self.settings),
                "task": self.task.name, "outputs": list(self.outputs), "layout": self.layout and list(self.layout)}

    @classmethod
    def from_wire(cls, data: dict, request: SampleRequest, device: DeviceInfo) -> "Plan":
        """The client's plan on a worker rank: `request` is the one the client planned (size resolved, checked),
        so nothing is checked again."""
        family = family_for(data["model_class"], settings=data["settings"])
        task = TASKS[data["task"]]
        return cls(model_class=data["model_class"], family=family, task=task,
                   pipeline=family.pipeline_for(data["model_class"], task.name), device=device, request=request,
                   outputs=tuple(data["outputs"]), layout=data["layout"] and tuple(data["layout"]), settings=data["settings"])


def plan_request(handle: PipelineHandle, request: SampleRequest, device: DeviceInfo | None = None) -> Plan:
    """The plan for running `request` with the model `handle` names on `device` (by default the handle's),
    checked before anything loads."""
    device = device or resolve_device(handle.device)
    refine_only = [lora for lora in handle.loras if lora.expert is LoraExpert.REFINE]
    if refine_only and not request.upscaler:
        raise UserInputError(f"LoRA '{os.path.basename(refine_only[0].path)}' is set to expert 'refine', the refine "
                             "stage of a two-stage run, but this run has no latent upscaler: connect one to the "
                             "sampler's upscaler, or set the LoRA's expert to high_noise.")
    if request.reference_video is not None:
        request = dataclasses.replace(request, reference_downscale=reference_downscale(handle.loras))
    plan = _planned(handle.model_class, request, model_settings(handle.source), device, layout=None)
    if handle.mesh is None:
        return plan
    return dataclasses.replace(plan, layout=mesh_shape(handle.mesh, world_size(handle.mesh, device)))


def loaded_handle(handle: PipelineHandle, plan: Plan) -> PipelineHandle:
    """The handle whose components `plan`'s run loads: for a model whose modular blocks load other components for
    some workflows (ModularBlocks.partitions: a reference to video workflow with a transformer of its own), the
    partition of its task (LoadSpec.workflow, part of the cache key: a switch loads that partition in place of the
    other)."""
    blocks = plan.family.modular.get(plan.model_class)
    workflow = blocks.partition_for(plan.task.name) if blocks else ""
    return handle if workflow == handle.load.workflow else handle.replace(workflow=workflow)


def reference_downscale(loras) -> int:
    """The `reference_downscale_factor` that IC-LoRAs trained on downscaled reference videos record in their
    safetensors metadata (as diffusers' in-context pipeline documents it: the reference is encoded at 1/factor
    of the video's size); 1 where none does. LoRAs that record different factors are refused."""
    from safetensors import safe_open

    factors = {}
    for lora in loras:
        with safe_open(lora.path, "pt") as f:
            value = (f.metadata() or {}).get("reference_downscale_factor")
        if value is None:
            continue
        try:
            factors[os.path.basename(lora.path)] = int(float(value))
        except ValueError:
            raise UserInputError(f"LoRA '{os.path.basename(lora.path)}' records reference_downscale_factor "
                                 f"{value!r}, which is no number: fix or re-download the file.") from None
    if len(set(factors.values())) > 1:
        raise UserInputError(f"the LoRAs record different reference_downscale_factors ({factors}): an in-context run "
                             "encodes its reference at one size; use IC-LoRAs of one factor.")
    return next(iter(factors.values()), 1)


def _planned(model_class: str, request: SampleRequest, settings: dict | None, device: DeviceInfo,
             layout: tuple[int, int, int] | None) -> Plan:
    family, task, pipeline, request = prepare(model_class, request, settings)
    return Plan(model_class=model_class, family=family, task=task, pipeline=pipeline, device=device, request=request,
                outputs=tuple(kind.name for kind in task.output_kinds(family)), layout=layout, settings=settings)


def family_of(handle: PipelineHandle) -> Family:
    """The family of the handle's model as its settings make it, where they are readable before loading (a folder,
    a configs folder, a hub model in the local cache): `Family.setting_changes` may change its size step."""
    return family_for(handle.model_class, settings=model_settings(handle.source))
