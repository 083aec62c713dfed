"""Context parallelism: every rank of a CP group holds the whole denoisers and runs 1/N of the tokens
(distributed.sharding.apply_context_parallel). The mesh is a worker rank's (PipelineCache.context_parallel);
in one process there is none and nothing is applied. Part of the load key, so it is applied once, on a
pipeline's first realisation."""

from __future__ import annotations

import dataclasses

from ..distributed.sharding import apply_context_parallel
from ..specs import ProgressCallback

NAME = "context_parallel"


@dataclasses.dataclass(frozen=True)
class ContextParallelAsk:
    mesh: object  # the replica's ("ring", "ulysses") DeviceMesh
    denoisers: tuple[str, ...]  # the pipeline's denoiser components (a two-expert model: both)
    plan: object  # the family's CP plan for a denoiser config (Family.cp_plan), or None: diffusers'
    local_attention: tuple[str, ...]  # the family's attentions outside CP (Family.cp_local_attention)
    any_length: bool = False  # split a sequence the ranks do not divide unevenly (Family.cp_any_length)


@dataclasses.dataclass(frozen=True)
class ContextParallelState:
    ask: ContextParallelAsk
    notes: tuple[str, ...]  # for the run info of every run on this pipeline


def apply(entry, ask: ContextParallelAsk | None, state: ContextParallelState | None,
          on_progress: ProgressCallback | None = None) -> ContextParallelState | None:
    if state is not None and state.ask == ask:
        return state
    if state is not None:
        remove(entry, state)
    if ask is None:
        return None
    note = apply_context_parallel(entry.pipe, ask.denoisers, ask.mesh, ask.plan, ask.local_attention,
                                  ask.any_length)
    return ContextParallelState(ask=ask, notes=(note,))


def remove(entry, state: ContextParallelState) -> None:
    """Each denoiser whole again: diffusers' CP hooks removed by its own `remove_context_parallel`, and the
    parallel config its `enable_parallelism` recorded on the model and its attention processors cleared."""
    from diffusers.hooks.context_parallel import remove_context_parallel

    for name in state.ask.denoisers:
        model = getattr(entry.pipe, name, None)
        if model is None or model._parallel_config is None:
            continue
        remove_context_parallel(model, model._cp_plan)
        for module in model.modules():
            if getattr(getattr(module, "processor", None), "_parallel_config", None) is not None:
                module.processor._parallel_config = None
        model._parallel_config = None
