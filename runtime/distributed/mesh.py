"""The mesh's shape (replicas x tp), and everything that can be checked before a worker is launched."""

from __future__ import annotations

import json
import os

from .. import settings
from ..device import TPU_IN_WORKERS_ENV, DeviceInfo, tpu_chip_count
from ..errors import ModelLoadError, UserInputError
from ..families import FAMILIES, Family, family_for
from ..settings import KEY_ENV, decode_key
from ..sources import components, is_hub_id, read_model_index
from ..specs import MeshSpec, Workers
from .channel import parse_address

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


def mesh_shape(spec: MeshSpec, ranks: int) -> tuple[int, int]:
    """(replicas, tp) for `ranks` ranks: replicas x tp = ranks, refused otherwise.

    replicas 0 means as many replicas as fit: with shard_transformer off the model is taken to fit one
    chip, so every rank is a replica of its own (tp 1); with it on, one replica is sharded over all ranks.
    """
    replicas = spec.replicas or (1 if spec.shard_transformer else ranks)
    if replicas < 1 or ranks % replicas:
        valid = [n for n in range(1, ranks + 1) if ranks % n == 0]
        raise UserInputError(f"{ranks} chips cannot be split into {replicas} replicas (replicas x tp must equal "
                             f"the chips); use one of {valid} replicas, or 0 for as many as fit.")
    return replicas, ranks // replicas


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


def _subfolder_config(folder: str, name: str) -> dict:
    path = os.path.join(folder, name, "config.json")
    try:
        with open(path) as f:
            return json.load(f)
    except (OSError, ValueError) as e:
        raise _unreadable_config(folder, name, e) from e


def _unreadable_config(folder: str, name: str, error: Exception) -> ModelLoadError:
    return ModelLoadError(f"cannot read {name}/config.json of '{folder}' ({error}); download the model again.")


def check_mesh(spec: MeshSpec, source: str, device: DeviceInfo, from_files: frozenset = frozenset()) -> list[str]:
    """Refuse what cannot work before launching: returns notes on the mesh's shape and what stays whole.
    `from_files`: components loaded from single files (their text encoders stay whole on every rank)."""
    if spec.workers == Workers.ATTACH:
        key = spec.key or settings.get(KEY_ENV)
        if not spec.address or not key:
            raise UserInputError(f"attach needs the address (host:port) of the workers' rank 0 and their key (in "
                                 f"the node, or ${KEY_ENV} for the ComfyUI process).")
        parse_address(spec.address)
        decode_key(key)
    size = world_size(spec, device)
    if spec.workers == Workers.LAUNCH_LOCAL and size > local_chips(device):
        unit = "CPU cores" if device.type == "cpu" else f"{device.type} chips"
        raise UserInputError(f"the mesh asks for {size} chips but this host has {local_chips(device)} {unit}; "
                             "lower 'chips', or attach to workers started on several hosts.")
    replicas, tp = mesh_shape(spec, size)
    if tp == 1:  # every rank loads as one process would: hub ids, offload and LoRAs work as in ComfyUI's process
        return [] if size == 1 else [f"mesh: {replicas} replicas over {size} ranks",
                                     "tp 1: nothing is sharded, each replica holds the whole pipeline"]
    if is_hub_id(source):
        raise UserInputError("tensor parallelism loads each rank's slice from a local folder; download "
                             f"'{source}' into models/diffusers and pick the folder.")
    index = read_model_index(source, is_folder=True)
    parts = components(index)
    notes = [f"mesh: {replicas} replica(s) x {tp}-way tensor parallel over {size} ranks"]
    if spec.shard_transformer:
        family = family_for(index["_class_name"])
        for denoiser in family.denoisers:  # Wan 2.2 A14B's two experts; an absent one (TI2V-5B's) is not in parts
            if denoiser in parts:
                notes += _check_transformer(source, denoiser, parts[denoiser][1], tp, family)
    if spec.shard_text_encoder:
        notes += [_check_text_encoder(source, name, cls, tp) if name not in from_files
                  else f"{name} ({cls}) from a single file: whole on every rank"
                  for name, (library, cls) in parts.items() if name.startswith("text_encoder")]
    return notes


def _denoiser_class(family: Family):
    """The diffusers class of a family's denoiser, from its base pipeline's __init__ annotation
    (`FluxTransformer2DModel`, `WanTransformer3DModel | None`, or its name as a string)."""
    import inspect
    import typing

    import diffusers

    annotation = inspect.signature(getattr(diffusers, family.base_class)).parameters[family.denoiser].annotation
    for option in typing.get_args(annotation) or (annotation,):
        option = getattr(diffusers, option, None) if isinstance(option, str) else option
        if isinstance(option, type) and option is not type(None):
            return option
    return None


def shardable_families() -> str:
    """The families whose denoiser diffusers can shard (its class has a `_tp_plan`), for messages:
    'FLUX.1, FLUX.2, QwenImage and FLUX.2 [klein]'."""
    names = [family.name for family in FAMILIES
             if getattr(_denoiser_class(family), "_tp_plan", None) is not None or family.tp_plan is not None]
    return ", ".join(names[:-1]) + f" and {names[-1]}" if len(names) > 1 else "".join(names)


def tp_plan_for(cls, family: Family, config: dict) -> dict | None:
    """The `_tp_plan` a sharded load of the diffusers class `cls` with this config uses: diffusers' own, else its
    family's for this config (Wan's), else None (it cannot be sharded)."""
    if getattr(cls, "_tp_plan", None) is not None and cls not in FAMILY_PLANNED:
        return cls._tp_plan
    return family.tp_plan(config) if family.tp_plan is not None else None


FAMILY_PLANNED: set = set()  # diffusers classes whose `_tp_plan` a family's plan filled in (sharding.py)


def _check_transformer(source: str, denoiser: str, cls: str, tp: int, family: Family) -> list[str]:
    import diffusers

    if tp_plan_for(getattr(diffusers, cls), family, _subfolder_config(source, denoiser)) is None:
        raise UserInputError(f"{cls} has no tensor-parallel plan in diffusers, so it cannot be sharded "
                             f"({shardable_families()} can). Use replicas instead: turn shard_transformer off (each "
                             "chip then holds the whole pipeline and runs its share of the batch), or drop the TP "
                             "Mesh.")
    heads = _subfolder_config(source, denoiser).get("num_attention_heads")
    if heads and heads % tp:
        valid = [n for n in range(1, heads + 1) if heads % n == 0]
        raise UserInputError(f"tp {tp} (chips / replicas) does not divide the transformer's {heads} attention "
                             f"heads; make chips / replicas one of {valid}.")
    return []


def _check_text_encoder(source: str, name: str, cls: str, tp: int) -> str:
    """Sharded when transformers has a TP plan for it; otherwise kept whole on every rank (said in a note)."""
    if not text_encoder_has_tp_plan(source, name):
        return f"{name} ({cls}) has no TP plan in transformers: kept whole on every rank"
    text = _subfolder_config(source, name)
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
        raise _unreadable_config(source, name, e) from e
    return bool(getattr(config.get_text_config(), "base_model_tp_plan", None))
