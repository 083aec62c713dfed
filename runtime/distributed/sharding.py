"""How each pipeline component loads on one rank of a replica's TP mesh.

The transformer streams only this rank's slice of every planned weight
(`from_pretrained(parallel_config=TensorParallelConfig(mesh=...))`); a text encoder with a
TP plan in transformers is sharded by transformers (`DistributedConfig(tp_plan="auto")`);
everything else (VAE, encoders without a plan) loads whole on every rank. `mesh` is the
replica's "tp" sub-mesh; at tp 1 nothing is sharded and each replica holds a whole pipeline.
"""

from __future__ import annotations

from ..families import Family
from ..model_folder import component_config
from ..specs import MeshSpec
from .mesh import FAMILY_PLANNED, text_encoder_has_tp_plan, tp_plan_for


class Sharding:
    def __init__(self, spec: MeshSpec, mesh, family: Family):
        # family.denoisers: the pipeline's transformer/unet, and a second expert where the family has one
        self.spec, self.mesh, self.family = spec, mesh, family
        self.sharded: set[str] = set()  # components loaded sharded (and placed) by their library

    def load_kwargs(self, folder: str, name: str) -> dict:
        if self.mesh.size() == 1:
            return {}
        if name in self.family.denoisers and self.spec.shard_transformer:
            from diffusers import TensorParallelConfig

            use_family_tp_plan(self.family, component_config(folder, name))
            self.sharded.add(name)
            return {"parallel_config": TensorParallelConfig(mesh=self.mesh)}
        if name.startswith("text_encoder") and self.spec.shard_text_encoder and text_encoder_has_tp_plan(folder, name):
            from transformers import DistributedConfig

            self.sharded.add(name)
            return {"distributed_config": DistributedConfig(tp_plan="auto"), "device_mesh": self.mesh}
        return {}


def use_family_tp_plan(family: Family, config: dict) -> None:
    """diffusers' sharded `from_pretrained` and `enable_parallelism` read the class's `_tp_plan`: for a class
    diffusers plans none for (`Family.tp_plan`), the family's plan for this config is set there, before each sharded load
    (it depends on the config's head count). A class with a plan of its own keeps it."""
    import diffusers

    cls = getattr(diffusers, config["_class_name"])
    if family.tp_plan is not None and (cls._tp_plan is None or cls in FAMILY_PLANNED):
        cls._tp_plan = tp_plan_for(cls, family, config)
        FAMILY_PLANNED.add(cls)


def local_bytes(module) -> int:
    """Bytes of parameters this rank holds: the local shard of a DTensor, all of a plain tensor."""
    from torch.distributed.tensor import DTensor

    total = 0
    for param in module.parameters():
        local = param.to_local() if isinstance(param, DTensor) else param
        total += local.numel() * local.element_size()
    return total


def sharded_fraction(*modules) -> float:
    """Share of the sharded parameters' full size that this rank holds (1/N on an even N-way split)."""
    from torch.distributed.tensor import DTensor, Shard

    held = full = 0
    for param in (param for module in modules for param in module.parameters()):
        if isinstance(param, DTensor) and any(isinstance(p, Shard) for p in param.placements):
            held += param.to_local().numel()
            full += param.numel()
    return held / full if full else 1.0


def apply_context_parallel(pipe, denoisers: tuple[str, ...], cp_mesh, plan=None, local_attention=(),
                           any_length=False) -> str:
    """Context parallelism on every denoiser the pipeline has (both experts of a two-expert model), after loading:
    each rank holds the whole model and runs 1/N of the tokens; the CP plan splits them at the first block and
    gathers them after the last: diffusers', or `plan`'s for the model's config (the family's `Family.cp_plan`), set
    on the model, where diffusers' `enable_parallelism` and `remove_context_parallel` read it. The `local_attention`
    modules (`Family.cp_local_attention`: a part of their names) are then taken out of CP: their keys are whole on
    every rank. `any_length` (`Family.cp_any_length`): diffusers' Ulysses Anything, which splits a sequence (and heads)
    the ranks do not divide unevenly, for a sequence whose length depends on the prompt. Ulysses
    (all-to-all of heads): ring attention needs the attention op's log-sum-exp, which diffusers' "native" backend
    (SDPA, the one every device here uses) does not give. `cp_mesh`: the replica's ("ring", "ulysses") sub-mesh,
    ring 1. Returns a note of what the models now are."""
    from diffusers import ContextParallelConfig

    present = [name for name in denoisers if getattr(pipe, name, None) is not None]  # TI2V-5B has no transformer_2
    for name in present:
        model = getattr(pipe, name)
        if plan is not None:
            model._cp_plan = plan(dict(model.config))
        model.enable_parallelism(config=ContextParallelConfig(ulysses_degree=cp_mesh.size(), mesh=cp_mesh,
                                                              ulysses_anything=any_length))
        for module_name, module in model.named_modules():
            if hasattr(module, "processor") and set(module_name.split(".")) & set(local_attention):
                module.processor._parallel_config = None
    return "context parallel (Ulysses): " + ", ".join(
        f"{name} over {context_parallel_degree(getattr(pipe, name))} ranks" for name in present)


# gloo (CPU ranks) takes an all_gather only of parts the input's size: ProcessGroupGloo::allgather checks each one
# ("invalid tensor size at index i"). Ulysses Anything (Family.cp_any_length) gathers a sequence the ranks do not divide
# in parts of unequal length (NCCL takes those), after the last block: the sequence's length is known only then.
GLOO_UNEVEN_GATHER = "ProcessGroupGloo::allgather: invalid tensor size"


def uneven_gather_on_cpu(error: BaseException) -> bool:
    """Whether `error` is gloo refusing the unequal parts of a sequence that CPU context-parallel ranks split."""
    return isinstance(error, RuntimeError) and GLOO_UNEVEN_GATHER in str(error)


def uneven_gather_advice(model_class: str, degree: int) -> str:
    """What a user does when CPU ranks cannot gather a sequence their count does not divide."""
    return (f"Context parallelism over {degree} CPU ranks cannot run this request of {model_class}: its sequence (the "
            f"prompt's tokens with the video's and the sound's) does not split into {degree} equal parts, and CPU "
            f"ranks (torch.distributed's gloo) gather equal parts only. Change the prompt by a word or the width, "
            f"height or frames, or run it without context parallelism on CPU (CUDA's NCCL gathers unequal parts; "
            f"not tested here, nor on TPU).")


def context_parallel_degree(module) -> int:
    """Ranks the module's tokens are split over, as its diffusers parallel config says (1 without CP)."""
    config = getattr(module, "_parallel_config", None)
    cp = config.context_parallel_config if config is not None else None
    return cp.ring_degree * cp.ulysses_degree if cp is not None else 1
