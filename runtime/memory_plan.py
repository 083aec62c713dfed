"""Will a run fit on each chip? A per-chip estimate from the model's configs, checked before anything loads.

A 14B video expert is ~28.6 GB in bf16 and a v6e chip has 32 GiB: whether a request fits depends on the placement,
the mesh and the request's size, and finding out by running out of memory costs a load and a compile. Each family's
memory model (`Family.memory`) says what its configs give and what its runs take; the estimate (bytes per chip; every
term is an upper-side approximation, not a measurement of a chip):

- weights resident at once, from parameter counts of each component instantiated on the meta device from its
  config (nothing is read but config.json): with placement `device` every component (text encoder, every denoiser,
  VAE) during every phase; with model CPU offload only the model of the phase (one model is on the chip at a time:
  an inactive second denoiser is on the host), so the peak is the largest of denoiser + denoising, VAE + its decode,
  and the text encoder. Under tp, each denoiser's planned weights (its `_tp_plan`, diffusers' own or the family's) are
  1/tp on a chip and the rest whole; text encoders and the VAE are counted whole (conservative: transformers
  shards some). Context parallelism splits no weight.
- the denoiser's activations at its peak (one block at a time: inference keeps no layer's activations), for
  ceil(tokens / cp) tokens of each of the replica's outputs (CFG runs cond and uncond one after the other):
  `hidden_tensors` tensors as wide as the hidden size (the fp32 residual and its norm/modulation copies, q, k, v,
  the attention output, rotary tables) and `ffn_tensors` as wide as the FFN (its 1/tp shard under tp), in the
  working dtype; with a per-token timestep also its fp32 modulation (`modulation_bytes` per hidden channel). The
  attention is taken to be a fused kernel (flash/splash) that never holds the tokens x tokens scores.
  tokens = latent frames x (height / (VAE factor x patch)) x (width / (VAE factor x patch)); an image is one frame;
  an in-context run's reference video adds its own tokens (at 1/reference_downscale of the size).
- the VAE's decode (a video VAE decodes `vae_chunk_frames` frames at a time, with a cache of the previous frames):
  `vae_tensors` tensors of the decoder's full-resolution width for a chunk, plus the decoded output in float32. The
  VAE phase and the denoising phase do not overlap: the larger of the two counts. An image-to-video encode of the
  first frame is of the same order as the decode and is covered by it.
- a picked file's latent decoder (Family.latent_decoder: a decoder replacing the VAE's) is checked on its own, by what
  its run needs at the size (`LatentDecoder.run_bytes`), and refused naming the file to pick instead.
- of a chip's memory, `USABLE_SHARE` is taken as usable (the runtime, compiled programs and fragmentation take
  the rest).

The families' constants come from CPU measurements at real widths (peak RSS of a CPU process, not a chip's allocator:
a chip's compiled programs can hold more or less). docs/parallelism.md has the table `markdown_table` makes.
"""

from __future__ import annotations

import dataclasses
import glob
import json
import logging
import math
import os

from . import settings
from .errors import UserInputError
from .families import FAMILIES, Family, MemoryModel, family_for
from .specs import Placement

log = logging.getLogger("tpu_diffusers")

HBM_PER_DEVICE_GIB = {"v4": 32, "v5e": 16, "v5p": 95, "v6e": 32, "v7": 96}  # TorchTPU 0.2.0's table, per device
USABLE_SHARE = 0.9
DEGREES = (1, 2, 4, 8)  # tp and cp degrees the suggestions consider, up to a host's chips (v7: 8 devices on 4 chips)
GIB = 2**30


@dataclasses.dataclass(frozen=True)
class Layout:
    """Where a pipeline's copies live: placement, and the mesh (replicas x tp x cp chips)."""

    placement: Placement = Placement.DEVICE
    replicas: int = 1
    tp: int = 1
    cp: int = 1

    @property
    def chips(self) -> int:
        return self.replicas * self.tp * self.cp

    def words(self) -> str:
        mesh = [f"tp {self.tp}"] * (self.tp > 1) + [f"cp {self.cp}"] * (self.cp > 1) + \
            [f"{self.replicas} replicas"] * (self.replicas > 1)
        chips = f"{self.chips} chip{'s' * (self.chips > 1)}"
        return f"placement '{self.placement.value}', {' x '.join(mesh) + ' over ' if mesh else ''}{chips}"


@dataclasses.dataclass(frozen=True)
class ModelSizes:
    """What the estimate needs of a model, from its configs (read by its family's memory model): parameters per
    component, the denoiser's and the VAE's shapes, and the family's per-token and per-pixel constants."""

    params: dict  # {component: parameter count}
    planned: dict  # {denoiser: parameters its TP plan shards} (0: no plan)
    hidden: int
    ffn: int
    patch: tuple  # (t, h, w)
    vae_spatial: int
    vae_temporal: int
    vae_width: int  # channels of the decoder's full-resolution stage
    vae_patch: int  # a VAE that decodes at 1/patch resolution, then unpatchifies
    memory: MemoryModel
    # {component: (parameters in layers kept quantized, their bytes as stored)}: a File Loader's int8/fp8 file with
    # its layers kept quantized on the chip (runtime/resident_weights.py); other components are in the dtype
    quantized: dict = dataclasses.field(default_factory=dict)


@dataclasses.dataclass(frozen=True)
class Estimate:
    weights: int  # on the chip at once: all of them (device), the largest component (model CPU offload)
    denoising: int
    vae: int
    total: int  # the peak: device: all weights + the larger phase; offload: the larger of each phase's model + it

    def words(self) -> str:
        return (f"~{self.total / GIB:.1f} GiB per chip (weights resident at once {self.weights / GIB:.1f} GiB, "
                f"denoising {self.denoising / GIB:.1f} GiB, VAE decode {self.vae / GIB:.1f} GiB)")


def meta_module(cls, config: dict):
    """A component of this class built from its config on the meta device (no memory, ~1 s for a 14B model)."""
    import torch

    with torch.device("meta"):
        if hasattr(cls, "from_config") and hasattr(cls, "load_config"):  # diffusers
            return cls.from_config(config)
        config_cls = cls.config_class
        return cls(config_cls.from_dict(config))


def sizes_from_configs(family: Family, configs: dict) -> ModelSizes:
    """{component: (class, config dict)} of the pipeline's torch modules -> ModelSizes (family: what it denoises
    with, and its memory model, as a model of these settings is: `Family.with_settings`)."""
    from diffusers.hooks.tensor_parallel import resolve_tp_shard_specs

    from .distributed.mesh import tp_plan_for

    params, planned = {}, {}
    for name, (cls, config) in configs.items():
        module = meta_module(cls, config)
        params[name] = sum(param.numel() for param in module.parameters())
        if name in family.denoisers:
            plan = tp_plan_for(cls, family, config)
            named = dict(module.named_parameters())
            planned[name] = sum(named[key].numel() for key, spec in resolve_tp_shard_specs(module, plan, 1).items()
                                if spec.dim is not None) if plan else 0
    hidden, ffn, patch = family.memory.denoiser_shape(configs[family.denoiser][1])
    vae_spatial, vae_temporal, vae_width, vae_patch = family.memory.vae_shape(configs["vae"][1])
    return ModelSizes(params=params, planned=planned, hidden=hidden, ffn=ffn, patch=tuple(patch),
                      vae_spatial=vae_spatial, vae_temporal=vae_temporal, vae_width=vae_width, vae_patch=vae_patch,
                      memory=family.memory)


def sizes_of_folder(folder: str, family: Family) -> ModelSizes:
    """ModelSizes of a diffusers folder (a model, or the configs folder of single files): every component with a
    config.json whose class is a torch module. Kept per folder and config times (~2 s for a 2 x 14B model)."""
    key = (folder, family.name, tuple(os.path.getmtime(path)
                                      for path in sorted(glob.glob(os.path.join(folder, "*", "config.json")))))
    if key not in _FOLDER_SIZES:
        _FOLDER_SIZES[key] = _sizes_of_folder(folder, family)
    return _FOLDER_SIZES[key]


_FOLDER_SIZES: dict = {}


def _sizes_of_folder(folder: str, family: Family) -> ModelSizes:
    import importlib

    import torch

    from .model_folder import component_config
    from .pipeline_kinds import kind_for
    from .sources import component_module, components, read_model_index

    index = read_model_index(folder, is_folder=True)
    # what loads: a modular model's partition only (ModularBlocks.partitions: the first one's)
    loads = kind_for(family, index["_class_name"]).takes(index["_class_name"])
    configs = {}
    for name, (library, cls_name) in components(index).items():
        cls = getattr(importlib.import_module(component_module(library)), cls_name, None)
        if name in loads and isinstance(cls, type) and issubclass(cls, torch.nn.Module) and os.path.isfile(
                os.path.join(folder, name, "config.json")):
            configs[name] = (cls, component_config(folder, name))
    return sizes_from_configs(family, configs)


def component_bytes(sizes: ModelSizes, layout: Layout, dtype_bytes: int = 2) -> dict[str, int]:
    """{component: bytes of its weights on one chip}: a TP plan's weights 1/tp, layers kept quantized as stored
    (not under tp: the sharded denoisers are loaded dequantized), the rest in the dtype."""
    def on_chip(name: str) -> int:
        planned = sizes.planned.get(name, 0)
        quantized, stored = sizes.quantized.get(name, (0, 0)) if layout.tp == 1 or not planned else (0, 0)
        return (sizes.params[name] - quantized - planned + planned // layout.tp) * dtype_bytes + stored

    return {name: on_chip(name) for name in sizes.params}


def latent_tokens(sizes: ModelSizes, width: int, height: int, frames: int) -> int:
    """The denoiser's tokens for a video (or an image: frames 1) of this size."""
    counted = sizes.memory.latent_frames
    latent_frames = counted(frames) if counted and frames > 1 else (max(frames, 1) - 1) // sizes.vae_temporal + 1
    step = sizes.vae_spatial
    return ((latent_frames // sizes.patch[0]) * (height // (step * sizes.patch[1]))
            * (width // (step * sizes.patch[2])))


def reference_tokens(sizes: ModelSizes, request, family: Family) -> int:
    """The tokens references add beside the video's: an in-context run's reference video (its first `frames` frames,
    at 1/reference_downscale of the video's size), a reference to video run's pictures and videos at the sizes its
    model encodes them (Family.reference_rule); 0 without any."""
    tokens = 0
    if getattr(request, "reference_video", None) is not None:
        factor = request.reference_downscale
        tokens += latent_tokens(sizes, request.width // factor, request.height // factor,
                                min(len(request.reference_video), request.frames))
    if getattr(request, "references", ()) and family.reference_rule:
        tokens += sum(latent_tokens(sizes, *size)
                      for size in family.reference_rule.encoded_sizes(request.references, request.frames))
    return tokens


def estimate(sizes: ModelSizes, layout: Layout, width: int, height: int, frames: int, batch: int,
             dtype_bytes: int = 2, extra_tokens: int = 0) -> Estimate:
    """Bytes per chip for one run (the module docstring says what each term counts); frames 0: an image.
    `extra_tokens`: condition tokens beside the video's (an in-context run's reference)."""
    memory = sizes.memory
    frames = max(frames, 1)
    resident = component_bytes(sizes, layout, dtype_bytes)
    tokens = latent_tokens(sizes, width, height, frames) + extra_tokens
    per_token = (memory.hidden_tensors * sizes.hidden + memory.ffn_tensors * sizes.ffn // layout.tp) * dtype_bytes
    per_token += memory.modulation_bytes * sizes.hidden
    outputs = math.ceil(batch / layout.replicas)
    denoising = outputs * math.ceil(tokens / layout.cp) * per_token
    decoder_pixels = memory.vae_chunk_frames * (width // sizes.vae_patch) * (height // sizes.vae_patch)
    vae = (memory.vae_tensors * decoder_pixels * sizes.vae_width * dtype_bytes
           + outputs * frames * 3 * width * height * 4)
    if layout.placement is Placement.DEVICE:
        return Estimate(sum(resident.values()), denoising, vae, sum(resident.values()) + max(denoising, vae))
    denoiser = max(resident[name] for name in sizes.planned)
    others = max((size for name, size in resident.items() if name not in sizes.planned and name != "vae"), default=0)
    return Estimate(max(resident.values()), denoising, vae,
                    max(denoiser + denoising, resident.get("vae", 0) + vae, others))


def layouts(world_sizes: tuple[int, ...] = DEGREES, tp: bool = True, cp: bool = True) -> list[Layout]:
    """The layouts the suggestions and the docs table consider, fewest chips first, `device` (no host copies) before
    model CPU offload (tp 1 only: TP keeps its shards on the chips), with tp or cp in 1, 2, 4, 8 (a replica is one or
    the other: diffusers does not combine them) over a number of chips the host can launch (`world_sizes`: a TPU
    generation's, device.launchable_world_sizes); `tp`/`cp` False: none with it (the model has no such plan)."""
    found = [Layout(placement, tp=tp_degree, cp=cp_degree) for tp_degree in DEGREES[:len(DEGREES) if tp else 1]
             for cp_degree in DEGREES[:len(DEGREES) if cp else 1]
             for placement in (Placement.MODEL_CPU_OFFLOAD, Placement.DEVICE)
             if tp_degree * cp_degree in world_sizes and min(tp_degree, cp_degree) == 1
             and (tp_degree == 1 or placement is Placement.DEVICE)]
    return sorted(found, key=lambda layout: (layout.chips, layout.placement is not Placement.DEVICE, layout.cp))


def family_layouts(family: Family, sizes: ModelSizes, world_sizes: tuple[int, ...] = DEGREES) -> list[Layout]:
    """`layouts` the pack runs for this model: tp only where a TP plan shards its denoisers, cp only where the family
    has a CP plan it runs (a suggestion must not name a mesh the run would refuse)."""
    from .distributed.mesh import has_cp_plan

    return layouts(world_sizes, tp=any(sizes.planned.values()), cp=has_cp_plan(family))


# --- the device's memory


def device_memory_bytes(device_type: str) -> int | None:
    """Memory of one chip: the accelerator's own total where this process has it loaded (CUDA; TPU in a worker),
    TorchTPU 0.2.0's per-device table by the PCI device id otherwise (ComfyUI's process keeps TorchTPU out), the
    host's available memory on cpu. None when unknown."""
    from .device import TPU_IN_WORKERS_ENV, available_host_memory_bytes, tpu_kind

    if device_type == "cpu":
        return available_host_memory_bytes()
    if not (device_type == "tpu" and os.environ.get(TPU_IN_WORKERS_ENV)):
        try:
            import torch

            return int(torch.get_device_module(device_type).get_device_properties(0).total_memory)
        except Exception:  # noqa: BLE001 (no such call on this backend: the table below)
            pass
    kind = tpu_kind() if device_type == "tpu" else None
    return HBM_PER_DEVICE_GIB[kind] * GIB if kind else None


# --- the check before loading


def check_fits(handle, family: Family, request, holding: bool = False) -> list[str]:
    """Refuse a video run that cannot fit on each chip, before anything loads, naming a layout that would; with
    TPU_DIFFUSERS_MEMORY_PLAN=warn (the estimate was never measured on a chip) run it anyway: the message is
    logged and returned as a run info note. Returns the notes (none when it fits).

    For video families and models whose configs can be read before loading: a local folder, or single files (their
    configs folder, local or the hub cache); a hub model's are not read before its download. `holding`: the
    pack already holds pipelines in this host's memory; on cpu, where the budget is the host's available memory,
    they would be counted twice, so the check is left to the first load."""
    from .device import launchable_world_sizes, resolve_device, tpu_kind
    from .distributed.mesh import mesh_shape, world_size

    device = resolve_device(handle.device)
    configs_unread = not handle.files and not os.path.isabs(handle.source)
    if not family.makes_video or configs_unread or (device.type == "cpu" and holding):
        return []
    budget = device_memory_bytes(device.type)
    if budget is None:
        return []
    replicas, cp, tp = mesh_shape(handle.mesh, world_size(handle.mesh, device)) if handle.mesh else (1, 1, 1)
    layout = Layout(Placement(handle.placement), replicas=replicas, tp=tp, cp=cp)
    kind = tpu_kind() if device.type == "tpu" else None
    where = f"a {kind} chip" if kind else ("this host" if device.type == "cpu" else f"one {device.type} chip")
    sizes = sizes_of_folder(_configs_folder(handle), family)
    if handle.files and handle.load.quantized_weights.resolved(device.type).keeps_quantized:
        sizes = dataclasses.replace(sizes, quantized=quantized_sizes(handle, _configs_folder(handle)))
    message = latent_decoder_problem(handle, family, request, budget, where) or refusal(
        family, sizes, layout, request, budget, where, shared_host=device.type == "cpu",
        dtype_bytes=4 if handle.resolved_dtype(device) == "float32" else 2,
        world_sizes=launchable_world_sizes(kind) if kind else DEGREES)
    if not message:
        return []
    if settings.get("TPU_DIFFUSERS_MEMORY_PLAN") == "refuse":
        raise UserInputError(message + " (If the estimate is wrong for your chip, TPU_DIFFUSERS_MEMORY_PLAN=warn "
                                       "runs it anyway.)")
    note = f"memory plan: {message} Running anyway: TPU_DIFFUSERS_MEMORY_PLAN=warn."
    log.warning("TPU Diffusers: %s", note)
    return [note]


def latent_decoder_problem(handle, family: Family, request, budget: int, where: str) -> str | None:
    """Why a picked file's latent decoder (Family.latent_decoder) cannot run at the request's size on a chip, or None:
    what its run needs (`LatentDecoder.run_bytes`, its config from the configs folder, else the class defaults)."""
    from .single_file import carries_latent_decoder

    decoder = family.latent_decoder
    path = dict(handle.files).get(decoder.slot) if decoder else None
    if path is None or not carries_latent_decoder(family, decoder.slot, path):
        return None
    config_file = os.path.join(_configs_folder(handle), decoder.component, "config.json")
    config = {}
    if os.path.isfile(config_file):
        with open(config_file) as f:
            config = json.load(f)
    need = decoder.run_bytes(config, request.width, request.height, request.frames)
    if need <= budget * USABLE_SHARE:
        return None
    return (f"'{os.path.basename(path)}' decodes with {decoder.words}, which at {request.width}x{request.height} x "
            f"{request.frames} frames needs ~{need / GIB:,.0f} GiB (its attention runs densely here), and {where} has "
            f"{budget / GIB:.1f} GiB. Pick {decoder.instead} for {decoder.slot} (the VAE's own decoder), or a much "
            "smaller size.")


def quantized_sizes(handle, folder: str) -> dict:
    """ModelSizes.quantized of a handle's files, from their headers (the layers the loader keeps quantized)."""
    from .single_file import check_file_for_slot, kind_of_file
    from .sources import config_values, read_model_index

    settings = config_values(read_model_index(folder, is_folder=True))
    model_file = dict(handle.files).get(family_for(handle.model_class, settings=settings).denoiser)
    return {component: stored_sizes(path, check_file_for_slot(path, component, handle.model_class, settings,
                                                              model_file))
            for component, path in handle.files if not getattr(kind_of_file(path), "dequantized", False)}


# bytes per element of the safetensors header's dtypes the quantized layers use
HEADER_DTYPE_BYTES = {"I8": 1, "U8": 1, "F8_E4M3": 1, "F8_E5M2": 1, "BF16": 2, "F16": 2, "F32": 4}


def stored_sizes(path: str, prefix: str = "") -> tuple[int, int]:
    """(parameters, bytes as stored with their scales) of the file's layers under `prefix` that
    resident_weights.apply keeps quantized, from the header only (for the memory plan, before loading). A layer
    diffusers' converter rebuilds stays dequantized at load: the run info then says how many."""
    from safetensors import safe_open

    from .file_choice import quantized_layer_formats
    from .resident_weights import ROW_FORMATS

    params = stored = 0
    layers = quantized_layer_formats(path)
    with safe_open(path, "pt") as f:
        keys = set(f.keys())
        for key, (name, _) in layers.items():
            weight = f.get_slice(key)
            shape = weight.get_shape()
            if not key.startswith(prefix) or name not in ROW_FORMATS or len(shape) != 2:
                continue
            params += shape[0] * shape[1]
            stored += shape[0] * shape[1] * HEADER_DTYPE_BYTES[weight.get_dtype()]
            scale_key = key[: -len("weight")] + "weight_scale"
            if scale_key in keys:
                scale = f.get_slice(scale_key)
                stored += math.prod(scale.get_shape()) * HEADER_DTYPE_BYTES[scale.get_dtype()]
    return params, stored


def refusal(family: Family, sizes: ModelSizes, layout: Layout, request, budget: int, where: str,
            shared_host: bool = False, dtype_bytes: int = 2, world_sizes: tuple[int, ...] = DEGREES) -> str | None:
    """What to tell the user when `request` needs more than `budget` bytes per chip (None when it fits): the
    estimate, and what would fit (fewer outputs per replica, the fewest-chips layout over chips the host can launch,
    `world_sizes`, fewer frames; or, where one model alone is over a chip, more memory or smaller weights).
    shared_host: the chips are one host's processes (cpu), which share `budget`."""
    def usable(chips: int) -> int:
        return int(budget * USABLE_SHARE) // (chips if shared_host else 1)

    size = (request.width, request.height)
    extra = reference_tokens(sizes, request, family)
    need = estimate(sizes, layout, *size, request.frames, request.batch_size, dtype_bytes, extra)
    if need.total <= usable(layout.chips):
        return None
    tries = []
    if math.ceil(request.batch_size / layout.replicas) > 1:
        tries.append("a smaller batch (or more replicas)")
    better = next((other for other in family_layouts(family, sizes, world_sizes) if other != layout and estimate(
        sizes, other, *size, request.frames, 1, dtype_bytes, extra).total <= usable(other.chips)), None)
    if better is not None:
        per_chip = estimate(sizes, better, *size, request.frames, 1, dtype_bytes, extra).total
        tries.append(f"{better.words()} (~{per_chip / GIB:.1f} GiB per chip)")
    rule, step = family.frame_rule, family.temporal_factor
    # frame counts the family takes (none: images)
    fewer = (range(request.frames - rule.step, rule.least - 1, -rule.step) if rule else
             range(request.frames - step, 0, -step) if step else ())
    frames = next((n for n in fewer if estimate(sizes, layout, *size, n, request.batch_size, dtype_bytes,
                                                extra).total <= usable(layout.chips)), None)
    name, largest = max(component_bytes(sizes, layout, dtype_bytes).items(), key=lambda item: item[1])
    if better is None and largest > usable(layout.chips):  # no size helps: one model alone is over a chip
        tries.append(f"a chip with more memory, or smaller (int8) weights: its {name} alone is ~{largest / GIB:.1f} "
                     "GiB")
    else:
        tries.append(f"at most {frames} frames at this size with this mesh" if frames else "a smaller size")
    length = f" x {request.frames} frames" if family.makes_video else ""
    return (f"{family.name} at {request.width}x{request.height}{length}, batch "
            f"{request.batch_size}, needs {need.words()} with {layout.words()}, and {where} has "
            f"{budget / GIB:.1f} GiB ({USABLE_SHARE:.0%} usable{', shared by the ranks' if shared_host else ''}): "
            f"it cannot fit. Try {'; or '.join(tries)}. (docs/parallelism.md has a table of what fits each chip "
            "type.)")


def _configs_folder(handle) -> str:
    from . import single_file

    return single_file.config_folder(handle.source) if handle.files else handle.source


# --- the docs table

TABLE_SIZES = ((832, 480), (1280, 720))  # 480p and 720p video
TABLE_FRAMES = 81
TABLE_CHIPS = ("v5e", "v6e", "v5p", "v7")
# {model name: (its family, its published configs)}: every family's reference models, for the docs table
REFERENCE_MODELS = {name: (family, reference) for family in FAMILIES
                    for name, reference in family.memory.reference_models.items()}


def reference_sizes(model: str) -> ModelSizes:
    """ModelSizes of a reference model (REFERENCE_MODELS), from its published configs."""
    import importlib

    family, reference = REFERENCE_MODELS[model]
    configs = {name: (getattr(importlib.import_module(library), cls_name), config)
               for name, (library, cls_name, config) in reference.components.items()}
    sizes = sizes_from_configs(family.with_settings(reference.settings), configs)
    return dataclasses.replace(sizes, quantized={name: linear_weights(configs[name], per_weight)
                                                 for name, per_weight in reference.quantized.items()})


def linear_weights(component, bytes_per_weight: int) -> tuple[int, int]:
    """(weights of a component's linear layers, their bytes at `bytes_per_weight`), as ModelSizes.quantized counts
    the layers a File Loader keeps quantized."""
    import torch

    count = sum(module.weight.numel() for module in meta_module(*component).modules()
                if isinstance(module, torch.nn.Linear))
    return count, count * bytes_per_weight


def markdown_table() -> str:
    """docs/parallelism.md's table: for each reference model, size and chip type, the first of the layouts the pack
    runs for it (`family_layouts`: fewest chips, over as many as the chip type can launch) that fits one video in
    bf16 (81 frames, or the model's own count), and its estimate per chip."""
    from .device import launchable_world_sizes

    rows = ["| model | size x frames | " + " | ".join(f"{kind} ({HBM_PER_DEVICE_GIB[kind]} GiB)"
                                                 for kind in TABLE_CHIPS) + " |",
            "|---|---|" + "---|" * len(TABLE_CHIPS)]
    for model, (family, reference) in REFERENCE_MODELS.items():
        sizes = reference_sizes(model)
        frames = reference.frames or TABLE_FRAMES
        for width, height in reference.sizes or TABLE_SIZES:
            cells = []
            for kind in TABLE_CHIPS:
                usable = int(HBM_PER_DEVICE_GIB[kind] * GIB * USABLE_SHARE)
                tried = family_layouts(family, sizes, launchable_world_sizes(kind))
                layout = next((layout for layout in tried if estimate(
                    sizes, layout, width, height, frames, 1).total <= usable), None)
                cells.append(f"does not fit on {tried[-1].chips}" if layout is None else _cell(
                    layout, estimate(sizes, layout, width, height, frames, 1)))
            rows.append(f"| {model} | {width}x{height} x {frames} | " + " | ".join(cells) + " |")
    return "\n".join(rows)


def _cell(layout: Layout, need: Estimate) -> str:
    mesh = [f"tp {layout.tp}"] * (layout.tp > 1) + [f"cp {layout.cp}"] * (layout.cp > 1)
    placement = "offload" if layout.placement is Placement.MODEL_CPU_OFFLOAD else "device"
    return f"{placement}{', ' + ' x '.join(mesh) if mesh else ', 1 chip'} ({need.total / GIB:.1f} GiB)"
