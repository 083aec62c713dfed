"""Compiled mode: compile the denoiser with static shapes, warm it up, keep per-shape books.

The guide's rules: static shapes (`dynamic=False`); the whole transformer when the pipeline
sits on the chip; only the repeated blocks under model CPU offload, whose hooks cannot be
traced. A new height/width compiles once; shapes already seen and a changed step count
reuse the graph. Compiled artifacts persist in the process's cache folders (set before torch
starts: process_env.py), so a restarted ComfyUI starts warm. dynamo's limits are patched around
our compiled calls only, never process-wide (ComfyUI's own TorchCompileModel and other packs
keep torch's settings).
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import logging
import re
from typing import Callable

from .. import process_env, settings
from ..device import DeviceInfo
from ..errors import CompileError, UserInputError
from ..specs import CompileScope, CompileSpec, Placement, ProgressCallback

log = logging.getLogger("tpu_diffusers")

NAME = "compilation"

WARMUP_STEPS = 2  # the step count does not change the compiled graph; two steps exercise the whole loop


def parse_sizes(text: str) -> tuple[tuple[int, ...], ...]:
    """'1024x1024, 768x1344, 1024x1024@1024x768' -> ((1024, 1024), (768, 1344), (1024, 1024, 1024, 768)): an
    output size, optionally with the size the request's images are resized to for that warm-up (an edit
    model's references change the transformer's input shape); an unparsable entry is a clear error."""
    sizes = []
    for item in filter(None, (part.strip() for part in re.split(r"[,;\s]+", text))):
        match = re.fullmatch(r"(\d+)[xX*](\d+)(?:@(\d+)[xX*](\d+))?", item)
        if not match:
            raise UserInputError(f"warmup size '{item}' is not WIDTHxHEIGHT or WIDTHxHEIGHT@IMAGEWIDTHxIMAGEHEIGHT; "
                                 "write e.g. '1024x1024, 768x1344, 1024x1024@1024x768'.")
        sizes.append(tuple(int(group) for group in match.groups() if group is not None))
    return tuple(dict.fromkeys(sizes))


def cache_folders() -> dict[str, str]:
    """Where this process's compiled artifacts persist (process settings, for the run info)."""
    from torch._inductor.runtime.cache_dir_utils import default_cache_dir

    folders = process_env.compile_cache_settings()
    folders["inductor"] = folders["inductor"] or default_cache_dir()  # unset: torch's own default
    return folders


def cache_lookups(device: DeviceInfo) -> dict[str, int]:
    """This process's compile-cache lookups so far: inductor's FX graph cache, and on a TPU TorchTPU's
    own cache (`torch.tpu._get_cache_stats()`, private: left out when it fails, never failing a run)."""
    import torch
    from torch._dynamo.utils import counters

    lookups = {"fxgraph_hits": counters["inductor"]["fxgraph_cache_hit"],
               "fxgraph_misses": counters["inductor"]["fxgraph_cache_miss"]}
    if device.type == "tpu":
        try:
            stats = torch.tpu._get_cache_stats()
            lookups.update(tpu_hits=int(stats.num_cache_hits),
                           tpu_misses=int(stats.num_cache_reqs) - int(stats.num_cache_hits),
                           tpu_compilations=int(stats.num_compilations))
        except Exception as e:  # noqa: BLE001 - a private API may change; the run goes on without the figures
            _stats_unavailable(f"{type(e).__name__}: {e}")
    return lookups


@functools.cache
def _stats_unavailable(reason: str) -> None:
    log.warning("TPU Diffusers: TorchTPU's compile cache statistics are unavailable (%s); the run info "
                "leaves them out.", reason)


def lookups_since(before: dict[str, int], after: dict[str, int]) -> dict[str, int]:
    return {name: after[name] - before[name] for name in after if name in before}


def dynamo_limits():
    """Many resolutions must work (torch's default of 8 shapes per code object is too few), and hitting
    the limit must be said, not silently run eager.
    A context manager: torch's settings are patched around our compiled calls only."""
    import torch._dynamo

    config = torch._dynamo.config
    limit = settings.get("TPU_DIFFUSERS_RECOMPILE_LIMIT")
    return config.patch(recompile_limit=limit,
                        accumulated_recompile_limit=max(config.accumulated_recompile_limit, limit * 8),
                        fail_on_recompile_limit_hit=True)


@dataclasses.dataclass
class ShapeRecord:
    compiles: int = 0
    compile_seconds: float = 0.0
    reuses: int = 0


@dataclasses.dataclass(frozen=True)
class CompileRequest:
    """Everything that decides how the denoiser is compiled: a pipeline compiled for another
    request is compiled again. (Warm-up sizes change nothing compiled; the cache folders are fixed
    for the process.)"""

    scope: CompileScope  # as asked
    fullgraph: bool
    placement: Placement
    backend: str

    @classmethod
    def of(cls, spec: CompileSpec, placement: Placement, device: DeviceInfo) -> "CompileRequest":
        return cls(scope=spec.scope, fullgraph=spec.fullgraph, placement=placement, backend=device.compile_backend)

    def resolved_scope(self) -> CompileScope:
        if self.scope is not CompileScope.AUTO:
            return self.scope
        offloaded = self.placement is Placement.MODEL_CPU_OFFLOAD
        return CompileScope.REPEATED_BLOCKS if offloaded else CompileScope.WHOLE


@dataclasses.dataclass
class CompileState:
    """What has been compiled on one loaded pipeline, and how each shape fared."""

    request: CompileRequest
    scope: CompileScope  # what was compiled: WHOLE or REPEATED_BLOCKS
    warmup_sizes: tuple[tuple[int, ...], ...] = ()  # (width, height[, image width, image height])
    shapes: dict[tuple[int, ...], ShapeRecord] = dataclasses.field(default_factory=dict)  # (w, h, batch, frames)
    warmed: set[tuple] = dataclasses.field(default_factory=set)  # (warm-up size, batch) done

    def matches(self, request: CompileRequest) -> bool:
        return self.request == request


def compile_denoiser(denoisers: tuple, request: CompileRequest, prepare=None,
                     untraceable_whole: str = "") -> CompileState:
    """Mark the denoisers (a pipeline's transformer or unet; both experts of a two-expert model) for compilation (torch
    compiles lazily, on the first call per shape), each after its family's `prepare_compile` (if any).
    `untraceable_whole`: the family's reason its denoiser cannot be traced whole with fullgraph, or ""."""
    scope = request.resolved_scope()
    blocks = getattr(denoisers[0], "_repeated_blocks", None)
    if request.scope is CompileScope.AUTO and not blocks:
        scope = CompileScope.WHOLE  # a model that declares no repeated blocks: the whole model is all there is
    if untraceable_whole and request.fullgraph and scope is CompileScope.WHOLE:
        if request.scope is not CompileScope.AUTO or not blocks:
            raise UserInputError(f"{type(denoisers[0]).__name__} cannot be compiled whole with fullgraph: "
                                 f"{untraceable_whole}. Use scope 'repeated_blocks' or 'auto', or turn fullgraph off.")
        scope = CompileScope.REPEATED_BLOCKS
    if scope is not CompileScope.WHOLE and not blocks:
        raise UserInputError(f"{type(denoisers[0]).__name__} declares no repeated blocks; use scope 'whole'.")
    options = dict(backend=request.backend, fullgraph=request.fullgraph, dynamic=False)
    for denoiser in denoisers:
        if prepare is not None:
            prepare(denoiser)
        if scope is CompileScope.WHOLE:
            denoiser.compile(**options)
        else:
            denoiser.compile_repeated_blocks(**options)
    log.info("TPU Diffusers: %d x %s marked for compile (%s, backend %s, fullgraph %s)", len(denoisers),
             type(denoisers[0]).__name__, scope, request.backend, request.fullgraph)
    return CompileState(request=request, scope=scope)


def uncompile(models) -> None:
    """Back to eager: forget the compiled call on the models and all their blocks."""
    for model in models:
        for module in model.modules():
            module._compiled_call_impl = None


@dataclasses.dataclass(frozen=True)
class CompileAsk:
    """What a handle in compiled mode asks: how to compile, what to warm up, and which models."""

    request: CompileRequest
    warmup_sizes: tuple[tuple[int, ...], ...]
    denoisers: tuple[str, ...]  # the pipeline's denoiser components (a two-expert model: both)
    prepare: Callable | None = None  # the family's prepare_compile
    untraceable_whole: str = ""  # the family's


def apply(entry, ask: CompileAsk | None, state: CompileState | None,
          on_progress: ProgressCallback | None = None) -> CompileState | None:
    """Compile, recompile with other options, or go back to eager (ask None), as the run options ask; the new
    state. A changed warm-up list needs no recompile."""
    if state is not None and (ask is None or not state.matches(ask.request)):
        remove(entry, state)
        state = None
    if ask is None:
        return None
    if state is None:
        models = (getattr(entry.pipe, name, None) for name in ask.denoisers)
        state = compile_denoiser(tuple(model for model in models if model is not None), ask.request, ask.prepare,
                                 ask.untraceable_whole)
    state.warmup_sizes = ask.warmup_sizes
    return state


def remove(entry, state: CompileState) -> None:
    """Every model of the pipeline eager again."""
    import torch

    uncompile(module for module in entry.pipe.components.values() if isinstance(module, torch.nn.Module))


@dataclasses.dataclass
class CompileActivity:
    graphs: int = 0  # graphs compiled during the watched run
    seconds: float = 0.0  # time dynamo spent compiling them


@contextlib.contextmanager
def watch_compiles():
    """Count what dynamo compiles inside the body (its own counters, not a timer around the run)."""
    from torch._dynamo.utils import compilation_time_metrics, counters

    def totals():
        return counters["stats"]["unique_graphs"], sum(compilation_time_metrics.get("_compile.compile_inner", []))

    graphs_before, seconds_before = totals()
    activity = CompileActivity()
    try:
        yield activity
    finally:
        graphs_after, seconds_after = totals()
        activity.graphs, activity.seconds = graphs_after - graphs_before, seconds_after - seconds_before


@contextlib.contextmanager
def explained_compile_failures(state: CompileState, denoisers: tuple):
    """Turn dynamo's failures into a message that says what to try; leave the pipeline eager."""
    import torch._dynamo.exc as dynamo_exc

    denoiser = denoisers[0]
    try:
        yield
    except dynamo_exc.FailOnRecompileLimitHit as e:
        uncompile(denoisers)
        raise CompileError(
            f"the compiled denoiser hit torch's recompile limit ({settings.get('TPU_DIFFUSERS_RECOMPILE_LIMIT')} shapes, "
            f"{len(state.shapes)} seen here). Use fewer distinct sizes, or raise TPU_DIFFUSERS_RECOMPILE_LIMIT "
            f"and restart ComfyUI. The pipeline runs eager until it is compiled again. ({e})") from e
    except dynamo_exc.TorchDynamoException as e:
        uncompile(denoisers)
        root = _root_cause(e)
        cause = f"{type(root).__name__}: {_first_line(root)}" if root is not e else _first_line(e)
        folder = cache_folders()["inductor"]
        if folder in f"{root} {getattr(root, 'filename', '')}":  # e.g. not writable, or a damaged cached file
            raise CompileError(
                f"compiling the denoiser failed because the compile cache {folder} cannot be used ({cause}). "
                "Check that the folder is writable and its disk has space; if a file in it is damaged (e.g. by a "
                "crash), stop ComfyUI and delete the folder: it is rebuilt. The pipeline runs eager until it is "
                "compiled again.") from e
        offloaded = state.request.placement is Placement.MODEL_CPU_OFFLOAD
        if state.scope is CompileScope.WHOLE and getattr(denoiser, "_repeated_blocks", None):
            hint = "set scope to 'repeated_blocks', or turn fullgraph off"
        elif state.scope is CompileScope.WHOLE and offloaded:
            hint = ("turn fullgraph off, or use placement 'device' (model CPU offload hooks cannot be traced and "
                    f"{type(denoiser).__name__} declares no repeated blocks)")
        else:
            hint = "turn fullgraph off"
        raise CompileError(f"compiling the denoiser ({state.scope}, fullgraph={state.request.fullgraph}, backend "
                           f"{state.request.backend}) failed: {cause}. Try: {hint}; or run eager. The pipeline runs "
                           f"eager until it is compiled again.") from e


def _root_cause(error: BaseException) -> BaseException:
    """The exception under dynamo's wrappers (BackendCompilerFailed keeps it as `inner_exception`)."""
    seen = set()
    while id(error) not in seen:
        seen.add(id(error))
        inner = getattr(error, "inner_exception", None) or error.__cause__
        if inner is None:
            break
        error = inner
    return error


def _first_line(error: BaseException) -> str:
    text = str(error).strip()
    return text.splitlines()[0] if text else type(error).__name__


def record_run(state: CompileState, shape: tuple[int, ...], activity: CompileActivity) -> ShapeRecord:
    record = state.shapes.setdefault(shape, ShapeRecord())
    if activity.graphs:
        record.compiles += 1
        record.compile_seconds += activity.seconds
    else:
        record.reuses += 1
    return record


def describe(state: CompileState, shape: tuple[int, ...], activity: CompileActivity) -> str:
    """shape: (width, height, batch[, frames]); a video's frame count is part of the compiled shape."""
    width, height, batch, *frames = shape
    size = f"{width}x{height}" + (f"x{frames[0]} frames" if frames and frames[0] else "")
    if activity.graphs:
        return f"compiled now for {size} (batch {batch}): {activity.graphs} graph(s) in {activity.seconds:.1f}s"
    return f"reused compiled graph for {size} (batch {batch})"


def counted_run(state: CompileState | None, denoisers: tuple, shape: tuple[int, ...], call):
    """call() (one pipeline run) with the compiles it causes counted, recorded for `shape` and explained
    when they fail; returns (its result, the compile activity)."""
    if state is None:
        return call(), CompileActivity()
    with explained_compile_failures(state, denoisers), dynamo_limits(), watch_compiles() as activity:
        result = call()
    record_run(state, shape, activity)
    return result, activity


@dataclasses.dataclass
class Warmup:
    seconds: float = 0.0
    notes: list[str] = dataclasses.field(default_factory=list)


def warm_up(state: CompileState | None, batch_size: int, run_size, on_progress=None) -> Warmup:
    """Compile the warm-up sizes ahead, once per loaded pipeline, with progress (and so cancel) per size.
    run_size(width, height, image_size, on_step) runs WARMUP_STEPS steps at that size, the request's images
    resized to image_size ((width, height), or None: as they are); returns its CompileActivity."""
    result = Warmup()
    if state is None:
        return result
    pending = [size for size in state.warmup_sizes if (size, batch_size) not in state.warmed]
    for index, size in enumerate(pending):
        width, height, image_size = size[0], size[1], size[2:] or None
        label = f"warm-up {width}x{height}" + (f" (images {image_size[0]}x{image_size[1]})" if image_size else "")

        def on_step(_done, _total, index=index, label=label):
            if on_progress:
                on_progress(index, len(pending), label)

        activity = run_size(width, height, image_size, on_step)
        state.warmed.add((size, batch_size))
        result.seconds += activity.seconds
        images = f", images at {image_size[0]}x{image_size[1]}" if image_size else ""
        result.notes.append(f"warm-up: {describe(state, (width, height, batch_size), activity)}{images}")
    return result
