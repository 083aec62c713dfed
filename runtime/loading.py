"""Find a model, check it, load it, and keep loaded pipelines for reuse.

A source is a diffusers-format folder (what ComfyUI's `models/diffusers` holds) or a
Hugging Face hub id. `inspect_source` only reads `model_index.json` and safetensors
headers, so the Loader node can reject a bad model at once; `PipelineCache` does the
heavy part when a Sampler needs it, one component at a time so that progress is
reported and cancel is honoured between components.
"""

from __future__ import annotations

import collections
import dataclasses
import gc
import importlib
import inspect
import json
import logging
import os
import re
import threading
from typing import TYPE_CHECKING, Callable

from .device import DeviceInfo, empty_cache
from .errors import ModelLoadError, UserInputError
from . import single_file
from .families import family_for
from .lora import LoraState
from .specs import Placement

if TYPE_CHECKING:  # handle.py imports the mesh spec, which uses this module
    from .handle import PipelineHandle

log = logging.getLogger("tpu_diffusers")

# model_index.json names the library of each component; importing anything else from a
# shared workflow's model folder would let a JSON file choose which module runs.
ALLOWED_LIBRARIES = ("diffusers", "transformers")
HUB_ID = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]*/[A-Za-z0-9][A-Za-z0-9._-]*$")

# on_progress(done, total, what[, preview]): called as work advances; it may raise to cancel. Sampling steps
# pass a preview image too when the caller asked for previews (Engine.generate).
ProgressCallback = Callable[..., None]


def list_model_folders(roots: list[str]) -> list[str]:
    """Names (relative to a root) of the diffusers folders under the given model roots."""
    names = set()
    for root in roots:
        if not os.path.isdir(root):
            continue
        for dirpath, dirnames, filenames in os.walk(root, followlinks=True):
            if "model_index.json" in filenames:
                names.add(os.path.relpath(dirpath, root).replace(os.sep, "/"))
                dirnames.clear()  # a pipeline's subfolders are its components, not more models
            dirnames[:] = sorted(d for d in dirnames if not d.startswith("."))
    return sorted(names)


def resolve_model_folder(name: str, roots: list[str]) -> str:
    """The absolute folder for a model name from a workflow, never outside the model roots."""
    parts = name.replace("\\", "/").split("/")
    if not name or os.path.isabs(name) or ".." in parts:
        raise UserInputError(f"model name '{name}' is not a folder name inside models/diffusers; "
                             "pick a model from the list.")
    for root in roots:
        root = os.path.abspath(root)
        candidate = os.path.normpath(os.path.join(root, *parts))
        if os.path.commonpath([root, candidate]) == root and os.path.isdir(candidate):
            return candidate
    raise UserInputError(f"model folder '{name}' was not found in {', '.join(roots) or 'models/diffusers'}; "
                         "put the diffusers folder there (it has a model_index.json) or pick another model.")


def read_model_index(source: str, is_folder: bool) -> dict:
    if is_folder:
        path = os.path.join(source, "model_index.json")
        if not os.path.isfile(path):
            raise UserInputError(f"'{source}' is not a diffusers pipeline folder: it has no model_index.json. "
                                 "Point the loader at the folder that contains model_index.json.")
    else:
        path = _hub_model_index(source)
    try:
        with open(path) as f:
            index = json.load(f)
    except (OSError, ValueError) as e:
        raise ModelLoadError(f"model_index.json of '{source}' cannot be read ({e}); re-download the model.") from e
    if not isinstance(index, dict) or "_class_name" not in index:
        raise UserInputError(f"model_index.json of '{source}' names no pipeline class (_class_name); "
                             "it is not a diffusers pipeline.")
    return index


def _hub_model_index(repo_id: str) -> str:
    from huggingface_hub import hf_hub_download
    from huggingface_hub.errors import LocalEntryNotFoundError

    try:
        return hf_hub_download(repo_id, "model_index.json")
    except LocalEntryNotFoundError as e:
        raise UserInputError(
            f"'{repo_id}' is not in the local Hugging Face cache and this machine cannot download it "
            f"(offline or HF_HUB_OFFLINE=1). Download it where there is network, e.g. "
            f"`huggingface-cli download {repo_id} --local-dir ComfyUI/models/diffusers/{repo_id.split('/')[-1]}`, "
            f"then pick that folder in the list.") from e


def components(index: dict) -> dict[str, tuple[str, str]]:
    """{component name: (library, class)} for the components a pipeline folder provides."""
    out = {}
    for name, value in index.items():
        if name.startswith("_") or not isinstance(value, list) or len(value) != 2 or None in value:
            continue
        out[name] = (value[0], value[1])
    return out


def is_hub_id(source: str) -> bool:
    """Folders are always absolute paths; anything else must be an 'owner/name' hub id, so a
    workflow cannot smuggle in a relative path that diffusers would read as a local folder."""
    return not os.path.isabs(source)


def check_hub_id(text: str) -> str:
    """A hub id from a workflow, refused unless it is exactly 'owner/name' (never a path)."""
    if not HUB_ID.match(text):
        raise UserInputError(f"'{text}' is not a hub id like 'owner/name'. To use a local model, put its "
                             "folder in models/diffusers and pick it in the list.")
    return text


def inspect_source(source: str) -> str:
    """Check a folder or hub id without loading weights; returns its pipeline class name.

    Catches what a user can fix before any sampling starts: not a pipeline, an unsupported
    pipeline, a missing component folder, a truncated or corrupt safetensors file.
    """
    hub = check_source(source)
    index = read_model_index(source, is_folder=not hub)
    check_index(source, index, folder=None if hub else source)
    return index["_class_name"]


def check_source(source: str) -> bool:
    """Refuse a malformed hub id or a missing folder; returns whether `source` is a hub id."""
    if is_hub_id(source):
        check_hub_id(source)
        return True
    if not os.path.isdir(source):
        raise UserInputError(f"model folder '{source}' does not exist.")
    return False


def check_index(source: str, index: dict, folder: str | None, from_files: frozenset = frozenset(),
                left_out: frozenset = frozenset()) -> None:
    """Refuse an unsupported pipeline and components from another library; with the local `folder`,
    also a missing component folder or a truncated or corrupt safetensors file. Components named in
    `from_files` load from single files: their folder only needs its config; every other model component
    then must have weights in the folder (a config-only folder says which file to pick)."""
    family_for(index["_class_name"], where=f"'{source}'")
    for name, (library, cls) in components(index).items():
        if library not in ALLOWED_LIBRARIES:
            raise UserInputError(f"component '{name}' of '{source}' comes from library '{library}'; "
                                 f"only {', '.join(ALLOWED_LIBRARIES)} components are loaded.")
        if folder:
            _check_component_folder(folder, source, name, cls)
            if from_files and name not in from_files | left_out:
                _check_has_weights(folder, source, name, cls)


WEIGHT_SUFFIXES = (".safetensors", ".bin", ".pth")


def has_weights(pipeline_folder: str, name: str) -> bool:
    """Whether component `name` of a diffusers folder holds weights (a configs-only download holds none)."""
    folder = os.path.join(pipeline_folder, name)
    return os.path.isdir(folder) and any(f.endswith(WEIGHT_SUFFIXES) for f in os.listdir(folder))


def _check_has_weights(pipeline_folder: str, source: str, name: str, cls: str) -> None:
    """A model component (its folder has a config.json) that no file provides needs weights in the folder."""
    if os.path.isfile(os.path.join(pipeline_folder, name, "config.json")) and not has_weights(pipeline_folder, name):
        raise UserInputError(f"'{source}' has only the config of '{name}' ({cls}), no weights, and no file was "
                             f"picked for it: pick a weights file for {name} (or a folder that has its weights).")


def local_folder(source: str) -> str:
    """The folder to load from: the source itself, or the hub snapshot diffusers downloads (or finds cached)."""
    if not check_source(source):
        return source
    from diffusers import DiffusionPipeline

    try:
        return DiffusionPipeline.download(source)
    except OSError as e:
        raise UserInputError(f"'{source}' could not be downloaded ({e}). Download it where there is network, "
                             f"then put the folder in models/diffusers and pick it in the list.") from e


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
                  sharding=None):
    """Load every component with its own library class, then assemble and place the pipeline.

    model_index.json is read once here, checked, and that same content says what loads: the folder
    may have changed since the Loader checked it, and a second read could differ from the checked
    one. The pipeline is built from the loaded components directly, as `from_pretrained` would read
    the file again. `sharding` (distributed.sharding.Sharding, on a TP rank) adds each component's
    sharding arguments and says which components it placed itself.
    """
    import diffusers
    import torch

    files = dict(handle.files)
    # With single files, the folder (or the hub repo's small files) gives configs, tokenizers, scheduler.
    folder = single_file.config_folder(handle.source) if files else local_folder(handle.source)
    index = read_model_index(folder, is_folder=True)
    left_out = optional_left_out(handle, folder) if files else {}
    check_index(handle.source, index, folder, from_files=frozenset(files), left_out=frozenset(left_out))
    if index["_class_name"] != handle.pipeline_class:
        raise ModelLoadError(f"'{handle.source}' now holds a {index['_class_name']}, not the {handle.pipeline_class} "
                             "the Loader found; queue the workflow again.")
    pipeline_cls = getattr(diffusers, handle.pipeline_class)
    takes = inspect.signature(pipeline_cls).parameters
    parts = {name: part for name, part in components(index).items() if name in takes}
    unknown = sorted(set(files) - set(parts))
    if unknown:
        raise UserInputError(f"{handle.pipeline_class} has no component {', '.join(unknown)} to load from a file; "
                             f"it has {', '.join(parts)}.")
    parts = {name: part for name, part in parts.items() if name not in left_out}
    dtype = getattr(torch, handle.resolved_dtype(device))
    total = len(parts) + 1
    loaded = dict(left_out)  # None: the pipeline runs without them
    weights_cache: dict = {}  # one read of an all-in-one checkpoint serves all its components
    for done, (name, (library, cls)) in enumerate(parts.items()):
        if on_progress:
            on_progress(done, total, f"loading {name}")
        if name in files:
            loaded[name] = single_file.load_component(name, _component_class(name, library, cls), files[name],
                                                      folder, dtype, weights_cache)
            if sharding and name == "transformer":
                _shard_loaded(loaded[name], sharding.load_kwargs(folder, name), device)
        else:
            loaded[name] = _load_component(folder, name, library, cls, dtype,
                                           sharding.load_kwargs(folder, name) if sharding else {})
    weights_cache.clear()
    try:
        pipe = pipeline_cls(**loaded)
    except TypeError as e:  # a component the pipeline needs is not in model_index.json
        raise ModelLoadError(f"'{handle.source}' cannot make a {handle.pipeline_class} ({e}); "
                             "download the model again.") from e
    for module in pipe.components.values():
        if isinstance(module, torch.nn.Module):
            # Inference only. Frozen parameters also keep libtpu from starting autograd machinery.
            module.eval().requires_grad_(False)
    if sharding:
        for name, module in pipe.components.items():
            if isinstance(module, torch.nn.Module) and name not in sharding.sharded:
                module.to(device.torch_device())  # replicated on every rank; sharded ones are placed already
    elif handle.placement is Placement.MODEL_CPU_OFFLOAD:
        pipe.enable_model_cpu_offload(device=device.torch_device())
    else:
        pipe.to(device.torch_device())
    if on_progress:
        on_progress(total, total, "placed on " + device.type)
    return pipe


def optional_left_out(handle: PipelineHandle, folder: str) -> dict[str, str]:
    """{component: its tokenizer} of the family's optional components (SD3's T5) that neither a picked file
    nor the configs folder's weights provide: the pipeline runs without them, as diffusers allows."""
    left_out = {}
    for name in family_for(handle.pipeline_class).optional_slots:
        if name not in dict(handle.files) and not has_weights(folder, name):
            left_out[name] = None
            left_out[name.replace("text_encoder", "tokenizer")] = None
    return left_out


def _shard_loaded(transformer, shard_kwargs: dict, device: DeviceInfo) -> None:
    """A transformer from a single file on a TP rank: `from_single_file` cannot shard while it reads, so the
    whole transformer is read into host memory first (peak: all of it, per rank) and diffusers' own
    `enable_parallelism` then keeps this rank's slice, on the mesh's device; what the plan leaves whole
    (embedders, norms) follows it there, as a sharded `from_pretrained` places it. Text encoders from files
    stay whole on every rank."""
    if "parallel_config" in shard_kwargs:
        if set(getattr(transformer, "hf_device_map", None) or {}) == {""}:
            transformer.hf_device_map = None  # from_single_file records "all on one device": nothing was dispatched
        transformer.enable_parallelism(config=shard_kwargs["parallel_config"])
        transformer.to(device.torch_device())


def _component_class(name: str, library: str, cls: str):
    component_cls = getattr(importlib.import_module(library), cls, None)
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


@dataclasses.dataclass
class LoadedPipeline:
    """A loaded, placed pipeline and what has been done to it since (compiling, warm-up)."""

    pipe: object
    compiled: object = None  # compile_cache.CompileState while the transformer is compiled
    lora: LoraState = dataclasses.field(default_factory=LoraState)  # the LoRAs fused into its weights now


@dataclasses.dataclass
class CacheStats:
    loads: int = 0  # pipelines loaded from disk since start
    hits: int = 0  # realisations served from memory


class PipelineCache:
    """Loaded pipelines keyed by `PipelineHandle.load_key`, least recently used evicted first.

    The default capacity is one pipeline: accelerator memory is the scarce resource, and a
    second model is better loaded after the first is gone than beside it.
    """

    def __init__(self, capacity: int = 1, loader=load_pipeline):
        self.capacity = capacity
        self.loader = loader  # (handle, device, on_progress) -> pipeline
        self.stats = CacheStats()
        self._pipelines: collections.OrderedDict[tuple, LoadedPipeline] = collections.OrderedDict()
        self._lock = threading.Lock()

    def get(self, handle: PipelineHandle, device: DeviceInfo,
            on_progress: ProgressCallback | None = None) -> tuple[LoadedPipeline, bool]:
        """The loaded pipeline for `handle`, and whether it was loaded just now."""
        key = handle.load_key(device)
        with self._lock:
            if key in self._pipelines:
                self._pipelines.move_to_end(key)
                self.stats.hits += 1
                return self._pipelines[key], False
            while len(self._pipelines) >= self.capacity:
                self._evict_oldest(device)
            log.info("TPU Diffusers: loading %s on %s", handle.describe(), device.type)
            entry = LoadedPipeline(self.loader(handle, device, on_progress))
            self._pipelines[key] = entry
            self.stats.loads += 1
            return entry, True

    def _evict_oldest(self, device: DeviceInfo) -> None:
        _, entry = self._pipelines.popitem(last=False)
        entry.pipe.remove_all_hooks()
        del entry
        gc.collect()
        empty_cache(device)

    def clear(self, device: DeviceInfo) -> int:
        """Drop every loaded pipeline and give the device memory back; returns how many were dropped."""
        with self._lock:
            count = len(self._pipelines)
            while self._pipelines:
                self._evict_oldest(device)
            return count

    def __len__(self) -> int:
        return len(self._pipelines)
