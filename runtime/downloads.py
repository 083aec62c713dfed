"""Hub pipelines on disk: found in the Hugging Face cache, or downloaded with progress and Cancel.

A hub id in a shared workflow can name tens of GB. The download reports its bytes through the run's
`on_progress` (the node's bar) and stops when `on_progress` raises (ComfyUI's Cancel), and
TPU_DIFFUSERS_DOWNLOADS=forbid refuses a model that is not in the cache yet, before any request is
made, as ComfyUI itself never downloads a model because a workflow names it. With HF_HUB_OFFLINE=1 the
cache is all there is, and diffusers' own `DiffusionPipeline.download` finds it there, as before.

Every file goes through huggingface_hub's `hf_hub_download`, which writes to a `.incomplete` file of
its own and renames it only once the file is whole (and deletes it when the transfer fails), so a
stopped download never leaves a file that looks complete.
"""

from __future__ import annotations

import os
import re
import threading

import huggingface_hub
from huggingface_hub import constants, get_cached_repo_tree, hf_hub_download, snapshot_download, try_to_load_from_cache
from huggingface_hub.errors import CachedRepoTreeNotFoundError, EntryNotFoundError, LocalEntryNotFoundError
from huggingface_hub.utils import tqdm

from . import settings
from .errors import UserInputError
from .model_folder import INDEX, read_index_file
from .specs import ProgressCallback

POLL_SECONDS = 0.5  # how often the caller's thread reports progress, so Cancel is seen within about this long

# What diffusers counts as weights (pipeline_loading_utils' weight names), so the same files are fetched.
WEIGHT_PREFIXES = "diffusion_pytorch_model|pytorch_model|model|weights"
MODEL_FILE_ENDINGS = ("bin", "safetensors", "onnx", "pb", "flashpack")  # a folder with one of these holds a model

# One download at a time: the switch from xet to plain HTTP below is process-wide.
_ONE_AT_A_TIME = threading.Lock()


def files_to_fetch(index: dict, repo_files) -> list[str]:
    """The files of a hub pipeline that loading reads, as `DiffusionPipeline.download` picks them.

    model_index.json and, in each folder model_index.json names: for a model (its folder holds weights)
    its config.json and its weights without a variant (safetensors when every model has them, else .bin;
    never fp16 variants, Flax, ONNX); for a tokenizer or scheduler every file but such weights. Unlike
    diffusers, nothing at the repo's root but model_index.json: loading never reads it, and a hub repo's
    root can hold an all-in-one checkpoint as large as the pipeline.
    """
    skip = set(index.get("_ignore_files", []))
    folders = {key for key, value in index.items() if isinstance(value, list) and not key.startswith("_")}
    names: dict[str, list[str]] = {}  # folder: the paths inside it
    for path in repo_files:
        top, _, rest = path.partition("/")
        if top in folders and rest and path not in skip:
            names.setdefault(top, []).append(rest)

    def holds_model(inside: list[str]) -> bool:
        return any("/" not in name and name.endswith(MODEL_FILE_ENDINGS) for name in inside)

    def weights(kind: str) -> re.Pattern:  # one file or a shard, as diffusers names them
        return re.compile(rf"({WEIGHT_PREFIXES})(-\d{{5}}-of-\d{{5}})?\.{kind}$")

    safetensors = weights("safetensors")
    kind = "safetensors" if all(any(safetensors.match(n) for n in inside)
                                for inside in names.values() if holds_model(inside)) else "bin"
    chosen = re.compile(rf"{weights(kind).pattern}|({WEIGHT_PREFIXES})\.{kind}\.index\.json$")
    others = [e for e in ("bin", "safetensors", "msgpack", "onnx", "pb") if e != kind]

    def other_weights(name: str) -> bool:
        return any(name.endswith(f".{e}") or (f".{e}.index." in name and name.endswith("json")) for e in others)

    keep = [INDEX]
    for folder, inside in names.items():
        if holds_model(inside):
            keep += [f"{folder}/{n}" for n in inside if n == "config.json" or chosen.match(n)]
        else:
            keep += [f"{folder}/{n}" for n in inside if not other_weights(n)]
    return sorted(keep)


def downloads_forbidden() -> bool:
    """TPU_DIFFUSERS_DOWNLOADS=forbid while the hub is reachable (offline, nothing is downloaded anyway)."""
    return not huggingface_hub.is_offline_mode() and settings.get("TPU_DIFFUSERS_DOWNLOADS") == "forbid"


def cached_snapshot(repo_id: str) -> str | None:
    """The cached folder of `repo_id`'s main branch if it holds every file loading reads, else None.

    Reads only the cache: which files the repo has comes from the listing huggingface_hub keeps next to
    the snapshot. A snapshot without one (an older huggingface_hub fetched it) counts as complete once
    its model_index.json is there; loading then reports a missing component folder.
    """
    index_path = try_to_load_from_cache(repo_id, INDEX)
    if not isinstance(index_path, str):
        return None
    folder = os.path.dirname(index_path)
    try:
        listing = get_cached_repo_tree(repo_id, revision=os.path.basename(folder))
    except CachedRepoTreeNotFoundError:
        return folder
    needed = files_to_fetch(read_index_file(index_path, repo_id), [f.path for f in listing])
    return folder if all(os.path.isfile(os.path.join(folder, f)) for f in needed) else None


def check_downloads_allowed(repo_id: str) -> None:
    """Refuse a hub id that would have to be downloaded while TPU_DIFFUSERS_DOWNLOADS=forbid (no network)."""
    if downloads_forbidden():
        _cached_or_refused(repo_id)


def model_index_file(repo_id: str) -> str:
    """The path of a hub pipeline's model_index.json: fetched (a small file), or from the cache only."""
    if downloads_forbidden():
        return os.path.join(_cached_or_refused(repo_id), INDEX)
    try:
        return hf_hub_download(repo_id, INDEX)
    except LocalEntryNotFoundError as e:
        raise UserInputError(
            f"'{repo_id}' is not in the local Hugging Face cache and this machine cannot download it "
            f"(offline or HF_HUB_OFFLINE=1). Download it where there is network, e.g. "
            f"`hf download {repo_id} --local-dir ComfyUI/models/diffusers/{repo_id.split('/')[-1]}`, "
            f"then pick that folder in the list.") from e
    except EntryNotFoundError as e:  # a repository of modular blocks has a modular_model_index.json instead
        raise UserInputError(
            f"'{repo_id}' has no model_index.json: if it is a model diffusers runs only as modular blocks (its "
            f"modular_model_index.json), TPU Diffusers loads it from a folder, not from a hub id yet. Download it, "
            f"e.g. `hf download {repo_id} --local-dir ComfyUI/models/diffusers/{repo_id.split('/')[-1]}`, then pick "
            f"that folder in the list (or load its single files with TPU File Loader).") from e


def pipeline_folder(repo_id: str, on_progress: ProgressCallback | None = None) -> str:
    """The folder of a hub pipeline with every file loading reads, downloading what the cache lacks.

    on_progress(bytes done, bytes total, "downloading <repo>") is called from this thread every
    POLL_SECONDS while files transfer; when it raises, the transfer is stopped and the exception
    goes on to the caller at once.
    """
    if huggingface_hub.is_offline_mode():
        return _offline_folder(repo_id)
    if downloads_forbidden():
        return _cached_or_refused(repo_id)
    return _download(repo_id, on_progress)


def _cached_or_refused(repo_id: str) -> str:
    folder = cached_snapshot(repo_id)
    if folder is None:
        name = repo_id.split("/")[-1]
        raise UserInputError(
            f"'{repo_id}' is not in the local Hugging Face cache, and TPU_DIFFUSERS_DOWNLOADS=forbid keeps the "
            f"pack from downloading a model a workflow names. Download it yourself: `hf download {repo_id} "
            f"--local-dir ComfyUI/models/diffusers/{name}` (gated repos need `hf auth login` first), then pick "
            f"'{name}' in the list; or allow downloads with TPU_DIFFUSERS_DOWNLOADS=allow.")
    return folder


def _offline_folder(repo_id: str) -> str:
    from diffusers import DiffusionPipeline

    try:
        return DiffusionPipeline.download(repo_id)
    except OSError as e:
        raise UserInputError(f"'{repo_id}' could not be downloaded ({e}). Download it where there is network, "
                             f"then put the folder in models/diffusers and pick it in the list.") from e


def _download_error(repo_id: str, e: BaseException) -> UserInputError:
    name = repo_id.split("/")[-1]
    return UserInputError(f"'{repo_id}' could not be downloaded ({type(e).__name__}: {e}). Download it where there "
                          f"is network (`hf download {repo_id} --local-dir ComfyUI/models/diffusers/{name}`; gated "
                          f"repos need `hf auth login` first), then pick '{name}' in the list.")


class _Transfer:
    """One pipeline's download: bytes counted by the thread that downloads, read by the caller's thread."""

    def __init__(self, total: int, done: int):
        self.total = total
        self.done = done
        self.cancelled = threading.Event()
        self.error: BaseException | None = None


class _Cancelled(Exception):
    """Ends the transfer in its own thread; the caller has already raised on_progress's exception."""


def _download(repo_id: str, on_progress: ProgressCallback | None) -> str:
    """Fetch model_index.json and the repo's file listing (small requests, made here), then the files
    loading reads that the cache lacks, one at a time in a thread of their own, while this thread
    reports progress. huggingface_hub reports a plain HTTP transfer from inside its read loop (every
    10 MB), so raising there ends it; the reads themselves stay in that thread, so a stalled network
    never delays Cancel."""
    try:
        folder = snapshot_download(repo_id, allow_patterns=[INDEX])  # also caches the listing and refs/main
    except OSError as e:
        raise _download_error(repo_id, e) from e
    try:
        sizes = {f.path: f.size for f in get_cached_repo_tree(repo_id, revision=os.path.basename(folder))}
    except CachedRepoTreeNotFoundError:
        return folder  # the hub was out of reach and an older download is all there is
    needed = files_to_fetch(read_index_file(os.path.join(folder, INDEX), repo_id), sizes)
    missing = [f for f in needed if not os.path.isfile(os.path.join(folder, f))]
    if not missing:
        return folder
    transfer = _Transfer(total=sum(sizes[f] for f in needed), done=sum(sizes[f] for f in needed if f not in missing))
    worker = threading.Thread(target=_fetch, args=(repo_id, os.path.basename(folder), missing, transfer),
                              name=f"download {repo_id}", daemon=True)
    worker.start()
    what = f"downloading {repo_id}"
    try:
        while worker.is_alive():
            if on_progress:
                on_progress(transfer.done, transfer.total, what)
            worker.join(POLL_SECONDS)
    except BaseException:
        transfer.cancelled.set()  # the transfer ends at its next chunk; its .incomplete file is deleted then
        raise
    if transfer.error is not None:
        raise _download_error(repo_id, transfer.error) from transfer.error
    if on_progress:
        on_progress(transfer.total, transfer.total, what)
    return folder


def _fetch(repo_id: str, commit: str, files: list[str], transfer: _Transfer) -> None:
    """Download `files` of `commit` in this (the download's own) thread over plain HTTP: hf_xet reports
    progress from a thread of its own that swallows the exception Cancel raises (huggingface_hub#4632),
    so an xet transfer could not be stopped."""
    with _ONE_AT_A_TIME:
        xet_was_disabled = constants.HF_HUB_DISABLE_XET
        constants.HF_HUB_DISABLE_XET = True
        try:
            bar = _counting_bar(transfer)
            for path in files:
                if transfer.cancelled.is_set():
                    return
                hf_hub_download(repo_id, path, revision=commit, tqdm_class=bar)
        except Exception as e:  # reported by the caller's thread (unless it was cancelled)
            transfer.error = e
        finally:
            constants.HF_HUB_DISABLE_XET = xet_was_disabled


def _counting_bar(transfer: _Transfer) -> type:
    """huggingface_hub's console bar for one file, whose updates also count the transfer's bytes and,
    once Cancel was pressed, stop it."""

    class CountingBar(tqdm):
        def update(self, n=1):
            if transfer.cancelled.is_set():
                raise _Cancelled()
            transfer.done += n
            return super().update(n)

    return CountingBar
