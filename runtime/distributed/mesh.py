"""The mesh's shape (replicas x context parallel x tp), and everything that can be checked before a worker is
launched."""

from __future__ import annotations

import os

from ..device import (TPU_IN_WORKERS_ENV, TPU_WORLD_SIZES, DeviceInfo, launchable_world_sizes, tpu_chip_count,
                      tpu_kind)
from ..errors import UserInputError
from ..families import FAMILIES, Family, family_for
from ..model_folder import component_config, unreadable_config
from ..sources import components, config_values, is_hub_id, read_model_index
from ..specs import MeshSpec, Workers
from .channel import attach_key, check_attach_address

CPU_MESH_DEFAULT_RANKS = 2  # a CPU "mesh" is for development; two ranks show everything TP does


def local_chips(device: DeviceInfo) -> int:
    """Chips on this host; on a CPU host, ranks are processes and the cores bound them."""
    if device.type == "cpu":
        return os.cpu_count() or 1
    if os.environ.get(TPU_IN_WORKERS_ENV):  # ComfyUI's process, which keeps TorchTPU out: count on the PCI bus
        return tpu_chip_count()
    import torch

    return torch.accelerator.device_count()


def world_size(spec: MeshSpec, device: DeviceInfo) -> int:
    if spec.chips:
        return spec.chips
    return min(CPU_MESH_DEFAULT_RANKS, local_chips(device)) if device.type == "cpu" else local_chips(device)


def mesh_shape(spec: MeshSpec, ranks: int) -> tuple[int, int, int]:
    """(replicas, cp, tp) for `ranks` ranks: replicas x cp x tp = ranks, refused otherwise.

    replicas 0 means as many replicas as fit: with context_parallel N, one replica per N ranks; else, with
    shard_transformer off, the model is taken to fit one chip, so every rank is a replica of its own (tp 1);
    with it on, one replica is sharded over all ranks. A replica is context parallel or tensor parallel,
    never both: diffusers refuses both in one ParallelConfig, and a model loaded sharded takes no more.
    """
    cp = spec.context_parallel
    if cp < 1 or ranks % cp:
        raise UserInputError(f"context_parallel {cp} does not divide the mesh's {ranks} chips; use one of "
                             f"{_divisors(ranks)}.")
    replicas = spec.replicas or (1 if spec.shard_transformer and cp == 1 else ranks // cp)
    if replicas < 1 or ranks % (replicas * cp):
        valid = _divisors(ranks // cp)
        need = "replicas x tp must equal the chips" if cp == 1 else \
            f"replicas x context_parallel {cp} x tp must equal the chips"
        raise UserInputError(f"{ranks} chips cannot be split into {replicas} replicas ({need}); use one of {valid} "
                             "replicas, or 0 for as many as fit.")
    tp = ranks // (replicas * cp)
    if cp > 1 and tp > 1:
        raise UserInputError(f"{replicas} replica(s) x context_parallel {cp} over {ranks} chips leaves {tp} chips "
                             "per replica for tensor parallelism, and diffusers runs a model context parallel or "
                             f"tensor parallel, not both. Set replicas to {ranks // cp} (or 0) for "
                             f"{ranks // cp} context-parallel replicas, or context_parallel to 1 for tensor "
                             "parallelism.")
    return replicas, cp, tp


def layout(spec: MeshSpec, ranks: int) -> tuple[int, int, int, bool, bool]:
    """What a pipeline loaded on one of `ranks` ranks depends on: (replicas, cp, tp) as `mesh_shape` resolves the
    spec, and under tp whether the transformer and the text encoders are sharded. A loaded pipeline cannot be laid
    out again (its TP slices were streamed at load; diffusers' enable_parallelism refuses a second call), so each
    layout loads its own; the same layout asked for another way (replicas 0 or 2 on 2 ranks) reuses it."""
    replicas, cp, tp = mesh_shape(spec, ranks)
    return replicas, cp, tp, tp > 1 and spec.shard_transformer, tp > 1 and spec.shard_text_encoder


def check_tpu_world_size(ranks: int, kind: str | None, chips: int) -> None:
    """Refuse a local worker group TorchTPU cannot launch on this TPU generation (`kind`, None: unknown, not
    checked): its launch environment has topologies for some rank counts only (device.TPU_WORLD_SIZES), and for
    any other it raises before a rank starts."""
    if kind is None or ranks in launchable_world_sizes(kind):
        return
    topologies = ", ".join(map(str, TPU_WORLD_SIZES[kind]))
    can = [str(n) for n in launchable_world_sizes(kind) if n <= chips]
    raise UserInputError(f"TorchTPU cannot launch {ranks} ranks on a {kind} host: torch_tpu 0.2.0 has launch "
                         f"topologies for {topologies} ranks there. This host has {chips} {kind} chips: set "
                         f"chips to {', '.join(can[:-1]) + ' or ' if len(can) > 1 else ''}{can[-1]} (replicas x tp, "
                         "or replicas x context_parallel, equal to it).")


def queued_world_size_problem(chips: int) -> str | None:
    """What is wrong with a local mesh of `chips` ranks on this host's TPU generation, for the TP Mesh node's
    queue-time check (no model needed; the PCI bus is read, TorchTPU is not loaded); None where it can launch,
    off a TPU host, or for chips 0 (every chip: a count TorchTPU knows). The run checks again (check_mesh)."""
    kind = tpu_kind()
    if not chips or kind is None:
        return None
    try:
        check_tpu_world_size(chips, kind, tpu_chip_count())
    except UserInputError as e:
        return str(e)
    return None


def _divisors(n: int) -> list[int]:
    return [d for d in range(1, n + 1) if n % d == 0]


def split_batch(batch_size: int, replicas: int) -> list[tuple[int, int]]:
    """(first image, image count) of each replica's contiguous slice of the batch: the first
    `batch_size % replicas` replicas take one image more; replicas beyond the batch take none."""
    share, extra = divmod(batch_size, replicas)
    slices, start = [], 0
    for replica in range(replicas):
        count = share + (replica < extra)
        slices.append((start, count))
        start += count
    return slices


def check_mesh(spec: MeshSpec, source: str, device: DeviceInfo, from_files: frozenset = frozenset()) -> list[str]:
    """Refuse what cannot work before launching: returns notes on the mesh's shape and what stays whole.
    `from_files`: components loaded from single files (their text encoders stay whole on every rank)."""
    if spec.workers == Workers.ATTACH:
        attach_key()
        check_attach_address(spec.address)
    size = world_size(spec, device)
    if spec.workers == Workers.LAUNCH_LOCAL and size > local_chips(device):
        unit = "CPU cores" if device.type == "cpu" else f"{device.type} chips"
        raise UserInputError(f"the mesh asks for {size} chips but this host has {local_chips(device)} {unit}; "
                             "lower 'chips', or attach to workers started on several hosts.")
    if spec.workers == Workers.LAUNCH_LOCAL and device.type == "tpu":
        check_tpu_world_size(size, tpu_kind(), local_chips(device))
    replicas, cp, tp = mesh_shape(spec, size)
    if (cp > 1 or tp > 1) and is_hub_id(source):
        # A replica's CP ranks stay in step through collectives at each progress point; a download reports
        # progress by the clock, so the ranks would make different numbers of them and deadlock.
        how = ("tensor parallelism loads each rank's slice from a local folder" if tp > 1 else
               "context parallelism loads the pipeline on a replica's ranks in step, which a download does not keep")
        raise UserInputError(f"{how}; download '{source}' into models/diffusers and pick the folder.")
    if cp > 1:  # each replica's ranks load the whole pipeline; context_parallel_notes checks the run
        return [f"mesh: {replicas} replica(s) x {cp}-way context parallel over {size} ranks"]
    if tp == 1:  # every rank loads as one process would: hub ids, offload and LoRAs work as in ComfyUI's process
        return [] if size == 1 else [f"mesh: {replicas} replicas over {size} ranks",
                                     "tp 1: nothing is sharded, each replica holds the whole pipeline"]
    index = read_model_index(source, is_folder=True)
    parts = components(index)
    notes = [f"mesh: {replicas} replica(s) x {tp}-way tensor parallel over {size} ranks"]
    if spec.shard_transformer:
        family = family_for(index["_class_name"], settings=config_values(index))
        for denoiser in family.denoisers:  # a second expert too; an absent one (optional in the model) is not in parts
            if denoiser in parts:
                notes += _check_transformer(source, denoiser, parts[denoiser][1], tp, family)
    if spec.shard_text_encoder:
        notes += [_check_text_encoder(source, name, cls, tp) if name not in from_files
                  else f"{name} ({cls}) from a single file: whole on every rank"
                  for name, (library, cls) in parts.items() if name.startswith("text_encoder")]
    return notes


def _denoiser_class(family: Family):
    """The diffusers class of a family's denoiser, from its base pipeline's __init__ annotation
    (a class, `SomeTransformer | None`, or its name as a string); for a model that has only modular blocks (its
    ModularPipeline takes no components), from the blocks' component spec."""
    import inspect
    import typing

    import diffusers

    parameters = inspect.signature(getattr(diffusers, family.base_class)).parameters
    if family.denoiser not in parameters:
        blocks = getattr(diffusers, family.modular[family.base_class].blocks)()
        return next((spec.type_hint for spec in blocks.expected_components if spec.name == family.denoiser), None)
    annotation = parameters[family.denoiser].annotation
    for option in typing.get_args(annotation) or (annotation,):
        option = getattr(diffusers, option, None) if isinstance(option, str) else option
        if isinstance(option, type) and option is not type(None):
            return option
    return None


def shardable_families() -> str:
    """The families whose denoiser can be sharded, for messages: its class has diffusers' `_tp_plan`, or the family
    declares one (`Family.tp_plan`)."""
    names = [family.name for family in FAMILIES
             if getattr(_denoiser_class(family), "_tp_plan", None) is not None or family.tp_plan is not None]
    return _joined(names)


def _joined(names: list[str]) -> str:
    return ", ".join(names[:-1]) + f" and {names[-1]}" if len(names) > 1 else "".join(names)


def has_cp_plan(family: Family) -> bool:
    """Context parallelism can split its denoiser: its class has diffusers' `_cp_plan`, or the family its own."""
    return family.cp_plan is not None or getattr(_denoiser_class(family), "_cp_plan", None) is not None


def families_with_cp_plan() -> str:
    """The families context parallelism runs, for messages."""
    return _joined([family.name for family in FAMILIES if has_cp_plan(family)])


def latent_tokens(family: Family, width: int, height: int, frames: int = 0, keyframes: int = 0) -> int:
    """The denoiser's sequence of image tokens: latent frames x (height / size_multiple) x (width / size_multiple),
    size_multiple being the VAE's factor times the patch size (temporal factor 4: 4k + 1 frames make k + 1 latent
    frames, unless the family counts them: MemoryModel.latent_frames), plus `keyframes` latent frames of condition
    tokens appended after the video's (TaskPipeline.keyframes)."""
    counted = family.memory.latent_frames
    latent_frames = (counted(frames) if counted else (frames - 1) // family.temporal_factor + 1) \
        if frames and family.temporal_factor else 1
    return (latent_frames + keyframes) * (height // family.size_multiple) * (width // family.size_multiple)


def stage_sizes(family: Family, width: int, height: int, two_stages: bool) -> list[tuple[int, int]]:
    """The sizes the denoiser runs at: the asked one, after the half size first for a two-stage run (an upscaler)."""
    return ([(width // 2, height // 2)] if two_stages and family.two_stage else []) + [(width, height)]


def context_parallel_notes(cp: int, family: Family, request, source: str, keyframes: int = 0) -> list[str]:
    """Refuse, before anything loads, context parallelism that cannot run: a denoiser without a CP plan (diffusers'
    or its family's), a token count or head count the CP degree does not divide (Ulysses attention splits the
    tokens, then the heads over the ranks), at every size the run denoises at (a two-stage run's half size too).
    `source`: the model's folder (its denoiser config gives the heads) or a hub id; `keyframes`: the task's appended
    condition frames (TaskPipeline.keyframes). A family whose sequence has a length known only once the prompt is
    encoded (`Family.cp_any_length`) is split unevenly: only its heads are checked."""
    if not has_cp_plan(family):
        cls = _denoiser_class(family)
        raise UserInputError(f"{family.name}'s {cls.__name__ if cls else family.denoiser} has no context-parallel "
                             f"plan, in diffusers or this pack ({families_with_cp_plan()} have one); set "
                             "context_parallel to 1.")

    def stage_tokens(width: int, height: int, frames: int) -> list[tuple[int, int, int]]:
        return [(w, h, latent_tokens(family, w, h, frames, keyframes))
                for w, h in stage_sizes(family, width, height, bool(request.upscaler))]

    def divides(width: int, height: int, frames: int) -> bool:
        return all(tokens % cp == 0 for _, _, tokens in stage_tokens(width, height, frames))

    width, height, frames = request.width, request.height, request.frames
    for w, h, tokens in stage_tokens(width, height, frames):
        if tokens % cp and not family.cp_any_length:
            stage = " (the first stage's half size)" if (w, h) != (width, height) else ""
            raise UserInputError(f"context_parallel {cp} does not divide the {tokens} latent tokens of "
                                 f"{_shape_text(w, h, frames)}{stage}; "
                                 f"{_divisible_shapes(family, width, height, frames, divides)}.")
    if os.path.isdir(os.path.join(source, family.denoiser)):
        config = component_config(source, family.denoiser)
        # every attention's heads (a denoiser with a second branch has its own count: `audio_num_attention_heads`)
        for heads in (config[key] for key in sorted(config) if key.endswith("num_attention_heads")):
            if heads and heads % cp:
                raise UserInputError(f"context_parallel {cp} does not divide the transformer's {heads} attention "
                                     f"heads (Ulysses attention splits them over the ranks); use one of "
                                     f"{_divisors(heads)}.")
    tokens = stage_tokens(width, height, frames)[-1][2]
    if family.cp_any_length:
        return [f"context parallel: {cp} ranks per video (Ulysses all-to-all attention), {tokens} latent tokens "
                f"of video with the text's and the sound's in one sequence, split as evenly as its length allows"]
    return [f"context parallel: {cp} ranks per video (Ulysses all-to-all attention), {tokens} latent tokens, "
            f"{tokens // cp} on each rank"]


def _shape_text(width: int, height: int, frames: int) -> str:
    return f"{width}x{height}" + (f" x {frames} frames" if frames else "")


def _divisible_shapes(family: Family, width: int, height: int, frames: int, divides) -> str:
    """The nearest frame counts (video) and widths at which `divides(width, height, frames)`, for the message."""
    def nearest(value: int, step: int, low: int, fits) -> list[int]:
        below = next((v for v in range(value - step, low - 1, -step) if fits(v)), None)
        above = next((v for v in range(value + step, value + 64 * step, step) if fits(v)), None)
        return [v for v in (below, above) if v is not None]

    options = []
    if frames and family.temporal_factor:
        counts = nearest(frames, family.temporal_factor, 1, lambda f: divides(width, height, f))
        if counts:
            options.append(f"frames {' or '.join(map(str, counts))} at {width}x{height}")
    widths = nearest(width, family.size_multiple, family.size_multiple, lambda w: divides(w, height, frames))
    if widths:
        options.append("width " + " or ".join(map(str, widths)) + f" at height {height}")
    return "use " + ", or ".join(options) if options else "choose another size"


def tp_plan_for(cls, family: Family, config: dict) -> dict | None:
    """The `_tp_plan` a sharded load of the diffusers class `cls` with this config uses: diffusers' own, else its
    family's for this config (`Family.tp_plan`), else None (it cannot be sharded)."""
    if getattr(cls, "_tp_plan", None) is not None and cls not in FAMILY_PLANNED:
        return cls._tp_plan
    return family.tp_plan(config) if family.tp_plan is not None else None


FAMILY_PLANNED: set = set()  # diffusers classes whose `_tp_plan` a family's plan filled in (sharding.py)


def _check_transformer(source: str, denoiser: str, cls: str, tp: int, family: Family) -> list[str]:
    import diffusers

    if tp_plan_for(getattr(diffusers, cls), family, component_config(source, denoiser)) is None:
        raise UserInputError(f"{cls} has no tensor-parallel plan in diffusers, so it cannot be sharded "
                             f"({shardable_families()} can). Use replicas instead: turn shard_transformer off (each "
                             "chip then holds the whole pipeline and runs its share of the batch), or drop the TP "
                             "Mesh.")
    config = component_config(source, denoiser)
    heads = config.get("num_attention_heads")
    if heads and heads % tp:
        valid = [n for n in range(1, heads + 1) if heads % n == 0]
        raise UserInputError(f"tp {tp} (chips / replicas) does not divide the transformer's {heads} attention "
                             f"heads; make chips / replicas one of {valid}.")
    if getattr(getattr(diffusers, cls), "_tp_plan", None) is None or getattr(diffusers, cls) in FAMILY_PLANNED:
        # a family's plan (Family.tp_plan) splits each head's value channels over the ranks, per head
        for key in (key for key in sorted(config) if key.endswith("attention_head_dim")):
            width = config[key]
            if width and width % tp:
                valid = [n for n in range(1, width + 1) if width % n == 0 and not (heads and heads % n)]
                raise UserInputError(f"tp {tp} (chips / replicas) does not divide the transformer's {width}-channel "
                                     f"heads ({key}): its TP plan splits each head's value channels over the ranks; "
                                     f"make chips / replicas one of {valid}.")
    return []


def _check_text_encoder(source: str, name: str, cls: str, tp: int) -> str:
    """Sharded when transformers has a TP plan for it; otherwise kept whole on every rank (said in a note)."""
    if not text_encoder_has_tp_plan(source, name):
        return f"{name} ({cls}) has no TP plan in transformers: kept whole on every rank"
    text = component_config(source, name)
    text = text.get("text_config", text)
    for field in ("num_attention_heads", "num_key_value_heads"):
        count = text.get(field)
        if count and count % tp:
            raise UserInputError(f"tp {tp} (chips / replicas) does not divide {name}'s {count} "
                                 f"{field.replace('_', ' ')}; choose a shape where it does, or turn "
                                 "shard_text_encoder off.")
    return f"{name} ({cls}) sharded with transformers' TP plan"


def text_encoder_has_tp_plan(source: str, name: str) -> bool:
    from transformers import AutoConfig

    try:
        config = AutoConfig.from_pretrained(os.path.join(source, name))
    except (OSError, ValueError) as e:
        raise unreadable_config(source, name, e) from e
    return bool(getattr(config.get_text_config(), "base_model_tp_plan", None))
