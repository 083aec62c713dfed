"""Check a model source and load it: every component with its own library class, assembled into its pipeline.

A source is a diffusers-format folder (what ComfyUI's `models/diffusers` holds) or a Hugging Face hub
id (runtime/sources.py). `inspect_source` only reads `model_index.json` and safetensors headers, so the
Loader node can reject a bad model at once; `load_pipeline` does the heavy part when a Sampler needs it,
one component at a time so that progress is reported and cancel is honoured between components.
"""

from __future__ import annotations

import importlib
import os

from . import pipeline_kinds, single_file
from .device import DeviceInfo
from .errors import ModelLoadError, UserInputError
from .families import Family, family_for
from .handle import PipelineHandle
from .sources import (check_source, component_module, components, config_values, has_weights,
                      is_diffusers_pipeline_class, local_folder, read_model_index)
from .specs import ProgressCallback, QuantizedWeights

# model_index.json names the library of each component; importing anything else from a
# shared workflow's model folder would let a JSON file choose which module runs.
ALLOWED_LIBRARIES = ("diffusers", "transformers")


def inspect_source(source: str) -> str:
    """Check a folder or hub id without loading weights; returns its model class (model_index's _class_name).

    Catches what a user can fix before any sampling starts: not a pipeline, an unsupported
    pipeline, a missing component folder, a truncated or corrupt safetensors file.
    """
    hub = check_source(source)
    index = read_model_index(source, is_folder=not hub)
    check_index(source, index, folder=None if hub else source)
    return index["_class_name"]


def check_index(source: str, index: dict, folder: str | None, from_files: frozenset = frozenset(),
                left_out: frozenset = frozenset()) -> None:
    """Refuse an unsupported pipeline and components from another library; with the local `folder`,
    also a missing component folder or a truncated or corrupt safetensors file. Components named in
    `from_files` load from single files: their folder only needs its config; every other model component
    then must have weights in the folder (a config-only folder says which file to pick)."""
    family_for(index["_class_name"], where=f"'{source}'")
    for name, (library, cls) in components(index).items():
        if library not in ALLOWED_LIBRARIES and not is_diffusers_pipeline_class(library, cls):
            raise UserInputError(f"component '{name}' of '{source}' comes from library '{library}'; "
                                 f"only {', '.join(ALLOWED_LIBRARIES)} components are loaded.")
        if folder:
            _check_component_folder(folder, source, name, cls)
            if from_files and name not in from_files | left_out:
                _check_has_weights(folder, source, name, cls)


def _check_has_weights(pipeline_folder: str, source: str, name: str, cls: str) -> None:
    """A model component (its folder has a config.json) that no file provides needs weights in the folder."""
    if os.path.isfile(os.path.join(pipeline_folder, name, "config.json")) and not has_weights(pipeline_folder, name):
        raise UserInputError(f"'{source}' has only the config of '{name}' ({cls}), no weights, and no file was "
                             f"picked for it: pick a weights file for {name} (or a folder that has its weights).")


def _check_component_folder(pipeline_folder: str, source: str, name: str, cls: str) -> None:
    from safetensors import SafetensorError, safe_open

    folder = os.path.join(pipeline_folder, name)
    if not os.path.isdir(folder):
        raise ModelLoadError(f"'{source}' lists component '{name}' ({cls}) but has no '{name}' folder; "
                             "the download is incomplete: download the model again.")
    for file in sorted(os.listdir(folder)):
        if not file.endswith(".safetensors"):
            continue
        try:
            with safe_open(os.path.join(folder, file), "pt"):
                pass
        except (SafetensorError, OSError) as e:
            raise ModelLoadError(f"weights file {name}/{file} of '{source}' is truncated or corrupt ({e}); "
                                 "download the model again.") from e


def load_pipeline(handle: PipelineHandle, device: DeviceInfo, on_progress: ProgressCallback | None = None,
                  sharding=None, notes: list[str] | None = None):
    """Load every component with its own library class, then assemble the pipeline (on the host: the engine
    places it, with the other features: runtime/features).

    model_index.json is read once here, checked, and that same content says what loads: the folder
    may have changed since the Loader checked it, and a second read could differ from the checked
    one. The pipeline is built from the loaded components directly, as `from_pretrained` would read
    the file again. `sharding` (distributed.sharding.Sharding, on a TP rank) adds each component's
    sharding arguments and says which components it placed itself; the rest are placed here, as every rank
    holds them whole. What every run's info should say about the loaded pipeline is appended to `notes`.
    """
    import torch

    files = dict(handle.files)
    # With single files, the folder (or the hub repo's small files) gives configs, tokenizers, scheduler.
    folder = single_file.config_folder(handle.source) if files else local_folder(handle.source, on_progress)
    index = read_model_index(folder, is_folder=True)
    family = family_for(handle.model_class, settings=config_values(index))  # settings may change denoisers and slots
    left_out = optional_left_out(family, handle, folder) if files else {}
    kind = pipeline_kinds.kind_for(family, handle.model_class)  # classic or modular (runtime/pipeline_kinds.py)
    takes = kind.takes(handle.model_class, handle.load.workflow)
    if notes is not None and (partition := kind.partition_note(handle.model_class, handle.load.workflow)):
        notes.append(partition)  # a switch to another partition's workflow says what it loads
    # what the pipeline does not take (a family's latent decoder: the family loads it, where it is used) needs no
    # weights in a configs folder
    not_taken = frozenset(components(index)) - takes
    check_index(handle.source, index, folder, from_files=frozenset(files), left_out=frozenset(left_out) | not_taken)
    if index["_class_name"] != handle.model_class:
        raise ModelLoadError(f"'{handle.source}' now holds a {index['_class_name']}, not the {handle.model_class} "
                             "the Loader found; queue the workflow again.")
    parts = {name: part for name, part in components(index).items() if name in takes}
    if handle.load.workflow:  # another partition's file (the File Loader's fl2va transformer) is not read
        files = {name: path for name, path in files.items() if name in parts}
    unknown = sorted(set(files) - set(parts))
    if unknown:
        raise UserInputError(f"{handle.model_class} has no component {', '.join(unknown)} to load from a file; "
                             f"it has {', '.join(parts)}.")
    parts = {name: part for name, part in parts.items() if name not in left_out}
    dtype = getattr(torch, handle.resolved_dtype(device))
    quantized = handle.load.quantized_weights.resolved(device.type)
    if files and sharding and quantized.keeps_quantized and notes is not None:
        notes.append("quantized weights: the tensor parallel denoisers are kept dequantized (sharding splits plain "
                     "weights only); the other components as the File Loader says")
    total = len(parts)
    loaded = dict(left_out)  # None: the pipeline runs without them
    weights_cache: dict = {}  # one read of an all-in-one checkpoint serves all its components
    for done, (name, (library, cls)) in enumerate(parts.items()):
        if on_progress:
            on_progress(done, total, f"loading {name}")
        if name in files:
            # under TP a denoiser is sharded after loading, which splits plain weights only: kept dequantized
            sharded = sharding and name in family.denoisers
            quantized_weights = QuantizedWeights.DEQUANTIZE if sharded else quantized
            loaded[name] = single_file.load_component(name, _component_class(name, library, cls), files[name],
                                                      folder, dtype, weights_cache, [] if notes is None else notes,
                                                      quantized_weights, files.get(family.denoiser))
            if sharded:  # a second expert (model_2) too
                _shard_loaded(loaded[name], sharding.load_kwargs(folder, name), device)
            if files[name] not in (files.get(later) for later in list(parts)[done + 1:]):
                # no later component reads this file: its whole read goes now (on a TP rank, a two-expert model's
                # first expert, sharded above, is not held whole while the second is read)
                weights_cache.pop(files[name])
        else:
            loaded[name] = _load_component(folder, name, library, cls, dtype,
                                           sharding.load_kwargs(folder, name) if sharding else {})
    weights_cache.clear()
    pipe = kind.assemble(handle.model_class, loaded, index, handle.source)  # pipeline kind
    for module in pipe.components.values():
        if isinstance(module, torch.nn.Module):
            # Inference only. Frozen parameters also keep libtpu from starting autograd machinery.
            module.eval().requires_grad_(False)
    if sharding:
        for name, module in pipe.components.items():
            if isinstance(module, torch.nn.Module) and name not in sharding.sharded:
                module.to(device.torch_device())  # replicated on every rank; sharded ones are placed already
    return pipe


def load_latent_decoder(family: Family, handle: PipelineHandle, dtype):
    """The family's latent decoder (Family.latent_decoder) where the model has one, else None: from the file picked
    for its slot where that file carries it. A model folder's decoder folder is not used: diffusers' classic
    pipeline decodes with the VAE, and so does the pack (see docs/video.md for why)."""
    decoder = family.latent_decoder
    path = dict(handle.files).get(decoder.slot)
    if path is None:
        return None
    return single_file.load_latent_decoder(family, path, single_file.config_folder(handle.source), dtype)


def optional_left_out(family: Family, handle: PipelineHandle, folder: str) -> dict[str, str]:
    """{component: its tokenizer} of the family's optional components (`FileSlot.optional`) that neither a picked file
    nor the configs folder's weights provide: the pipeline runs without them, as diffusers allows."""
    left_out = {}
    for name in family.optional_slots:
        if name not in dict(handle.files) and not has_weights(folder, name):
            left_out[name] = None
            left_out[name.replace("text_encoder", "tokenizer")] = None
    return left_out


def _shard_loaded(denoiser, shard_kwargs: dict, device: DeviceInfo) -> None:
    """A denoiser from a single file on a TP rank: `from_single_file` cannot shard while it reads, so the
    whole model is read into host memory first (peak: all of it, per rank) and diffusers' own
    `enable_parallelism` then keeps this rank's slice, on the mesh's device; what the plan leaves whole
    (embedders, norms) follows it there, as a sharded `from_pretrained` places it. Text encoders from files
    stay whole on every rank."""
    if "parallel_config" in shard_kwargs:
        if set(getattr(denoiser, "hf_device_map", None) or {}) == {""}:
            denoiser.hf_device_map = None  # from_single_file records "all on one device": nothing was dispatched
        denoiser.enable_parallelism(config=shard_kwargs["parallel_config"])
        denoiser.to(device.torch_device())


def _component_class(name: str, library: str, cls: str):
    component_cls = getattr(importlib.import_module(component_module(library)), cls, None)
    if component_cls is None:
        raise ModelLoadError(f"component '{name}' needs {library}.{cls}, which the installed {library} lacks; "
                             f"upgrade {library}.")
    return component_cls


def _load_component(folder: str, name: str, library: str, cls: str, dtype, extra_kwargs: dict):
    import torch

    component_cls = _component_class(name, library, cls)
    kwargs = {"subfolder": name, "local_files_only": True, **extra_kwargs}
    if isinstance(component_cls, type) and issubclass(component_cls, torch.nn.Module):
        kwargs["dtype"] = dtype
    try:
        return component_cls.from_pretrained(folder, **kwargs)
    except (OSError, ValueError, RuntimeError) as e:
        raise ModelLoadError(f"could not load component '{name}' ({cls}) from '{folder}': {e}. "
                             "If the files are damaged, download the model again.") from e
