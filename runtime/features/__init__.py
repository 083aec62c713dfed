"""What can be done to a loaded pipeline, one module per capability, in the shape of diffusers' hooks/.

Every feature module has
- `NAME`: its key in `LoadedPipeline.states`;
- `apply(entry, ask, state, on_progress=None) -> state`: make the loaded pipeline `entry` what `ask` says
  (None: nothing asked), given `state` (what was applied to it before; None: nothing), and return the new
  state (None: nothing applied now). Applying what is applied already does nothing, so it runs on every
  realisation;
- `remove(entry, state)`: undo what `state` records, leaving the pipeline as it was before `apply`.
A state may carry `notes`, said in the info of every run on that pipeline.

FEATURES is the one order they are applied in, by `realise` (the engine's only way to a loaded pipeline):
1. context parallelism, before placement: model CPU offload's accelerate hooks are removed and added again
   after every run and on a task switch, restoring the forward they wrapped. Inside them diffusers' CP hooks
   stay; wrapped around them, the root one (TI2V-5B's per-token timestep split) would be dropped (diffusers
   issue #12533; our issue 26's "CP before offload").
2. placement: on the device, or model CPU offload (whose hooks LoRA takes off and puts back around its work).
3. LoRA, fused into the weights in place before compiling: a compiled graph stays valid when only weight
   values change, so switching LoRAs never recompiles, and the graph is traced on the models without peft
   layers.
4. compilation, last: of the denoisers as the features before it left them.
"""

from __future__ import annotations

from ..device import DeviceInfo
from ..errors import LoraUnloadError
from ..families import Family, family_for
from ..handle import PipelineHandle
from ..modes import outside_inference_mode
from ..specs import CompileSpec, ExecutionMode, ProgressCallback
from . import compilation, context_parallel, lora, offload

FEATURES = (context_parallel, offload, lora, compilation)


def asks_of(handle: PipelineHandle, family: Family, device: DeviceInfo,
            context_parallel_mesh=None) -> dict[str, object]:
    """What `handle` asks of each feature, by feature name, for a model of `family` (as its settings make it).
    `context_parallel_mesh`: the CP mesh this process splits the handle's denoisers over (a worker rank's), or
    None."""
    spec = handle.compile or CompileSpec()
    split = None if context_parallel_mesh is None else context_parallel.ContextParallelAsk(
        mesh=context_parallel_mesh, denoisers=family.denoisers, plan=family.cp_plan,
        local_attention=family.cp_local_attention, any_length=family.cp_any_length)
    compiled = None if handle.mode is not ExecutionMode.COMPILED else compilation.CompileAsk(
        request=compilation.CompileRequest.of(spec, handle.placement, device), warmup_sizes=spec.warmup_sizes,
        denoisers=family.denoisers, prepare=family.prepare_compile, untraceable_whole=family.untraceable_whole)
    return {context_parallel.NAME: split, offload.NAME: handle.placement, lora.NAME: handle.loras,
            compilation.NAME: compiled}


def apply_features(entry, asks: dict[str, object], on_progress: ProgressCallback | None = None) -> None:
    """Every feature, in FEATURES' order, made what `asks` says; their states kept in `entry.states`."""
    for feature in FEATURES:
        state = feature.apply(entry, asks[feature.NAME], entry.states.get(feature.NAME), on_progress)
        if state is None:
            entry.states.pop(feature.NAME, None)
        else:
            entry.states[feature.NAME] = state


def realise(cache, handle: PipelineHandle, device: DeviceInfo, on_progress: ProgressCallback | None = None,
            family: Family | None = None):
    """(the loaded pipeline for `handle` from `cache` with every feature as the handle asks, whether it was
    loaded just now). `family`: the model's as its settings make it; None: as the loaded model's config says.
    A LoRA whose layers could not be taken out again leaves the pipeline untrusted: the cache is cleared, and
    the next run loads it again."""
    with outside_inference_mode():  # weights loaded under inference mode would be inference tensors
        entry, loaded = cache.get(handle, device, on_progress)
        family = family or family_for(handle.model_class, settings=dict(entry.pipe.config))
        try:
            apply_features(entry, asks_of(handle, family, device, cache.context_parallel(handle)), on_progress)
        except LoraUnloadError:
            cache.clear(device)
            raise
    return entry, loaded


def notes(entry) -> tuple[str, ...]:
    """What the applied features say in every run's info (context parallelism's layout, the LoRAs)."""
    return tuple(note for feature in FEATURES for note in getattr(entry.states.get(feature.NAME), "notes", ()))
