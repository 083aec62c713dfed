"""Compiled mode: compile the transformer with static shapes, warm it up, keep per-shape books.

The guide's rules: static shapes (`dynamic=False`); the whole transformer when the pipeline
sits on the chip; only the repeated blocks under model CPU offload, whose hooks cannot be
traced. A new height/width compiles once; shapes already seen and a changed step count
reuse the graph. Compiled artifacts persist in a cache directory so a restarted ComfyUI
starts warm (inductor: TORCHINDUCTOR_CACHE_DIR; TorchTPU: its tier-3 cache root too).
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import os
import re

from .device import DeviceInfo
from .errors import UserInputError
from .modes import Placement

log = logging.getLogger("tpu_diffusers")

SCOPES = ("auto", "whole", "repeated_blocks")
# Compiled shapes per code object before dynamo gives up (torch's default, 8, is too few resolutions).
RECOMPILE_LIMIT = int(os.environ.get("TPU_DIFFUSERS_RECOMPILE_LIMIT", "64"))


class CompileError(RuntimeError):
    """Compiling failed; the message names the cause and what to try. The pipeline still runs eager."""


@dataclasses.dataclass(frozen=True)
class CompileSpec:
    scope: str = "auto"  # "auto": repeated blocks under model CPU offload, else the whole transformer
    fullgraph: bool = True
    warmup_sizes: tuple[tuple[int, int], ...] = ()  # (width, height) compiled ahead, at first realisation
    cache_dir: str = ""  # "" = default_cache_dir()

    def resolved_scope(self, placement: Placement) -> str:
        if self.scope != "auto":
            return self.scope
        return "repeated_blocks" if placement is Placement.MODEL_CPU_OFFLOAD else "whole"


def parse_sizes(text: str) -> tuple[tuple[int, int], ...]:
    """'1024x1024, 768x1344' -> ((1024, 1024), (768, 1344)); an unparsable entry is a clear error."""
    sizes = []
    for item in filter(None, (part.strip() for part in re.split(r"[,;\s]+", text))):
        match = re.fullmatch(r"(\d+)\s*[xX*]\s*(\d+)", item)
        if not match:
            raise UserInputError(f"warmup size '{item}' is not WIDTHxHEIGHT; write e.g. '1024x1024, 768x1344'.")
        sizes.append((int(match[1]), int(match[2])))
    return tuple(dict.fromkeys(sizes))


def default_cache_dir() -> str:
    return os.environ.get("TPU_DIFFUSERS_COMPILE_CACHE") or os.path.join(
        os.path.expanduser("~"), ".cache", "tpu_diffusers", "compile")


def cache_dir_inside(root: str, text: str) -> str:
    """The cache folder a workflow names, kept inside `root`: compiled artifacts are loaded and run,
    so a shared workflow must not point the process at a folder others can write to."""
    root = os.path.abspath(root)
    path = os.path.normpath(os.path.join(root, text))
    if os.path.commonpath([root, path]) != root:
        raise UserInputError(f"cache_dir '{text}' is outside {root}; give a folder inside it (or leave it empty).")
    return path


def use_cache_dir(path: str) -> str:
    """Point the compile caches at `path` (must happen before the first compile to persist it)."""
    path = os.path.abspath(path or default_cache_dir())
    os.makedirs(path, exist_ok=True)
    os.environ["TORCHINDUCTOR_CACHE_DIR"] = os.path.join(path, "inductor")
    os.environ["TORCH_TPU_TIER3_COMPILATION_CACHE_ROOT"] = os.path.join(path, "tpu")
    return path


def configure_dynamo() -> None:
    """Many resolutions must work, and hitting the limit must be said, not silently run eager."""
    import torch._dynamo

    config = torch._dynamo.config
    config.recompile_limit = RECOMPILE_LIMIT
    config.accumulated_recompile_limit = max(config.accumulated_recompile_limit, RECOMPILE_LIMIT * 8)
    config.fail_on_recompile_limit_hit = True


@dataclasses.dataclass
class ShapeRecord:
    compiles: int = 0
    compile_seconds: float = 0.0
    reuses: int = 0


@dataclasses.dataclass
class CompileState:
    """What has been compiled on one loaded pipeline, and how each shape fared."""

    scope: str  # what was compiled: "whole" or "repeated_blocks"
    fullgraph: bool
    backend: str
    cache_dir: str
    requested: tuple  # (spec scope, fullgraph, placement, backend) it was compiled for
    warmup_sizes: tuple[tuple[int, int], ...] = ()
    shapes: dict[tuple[int, int, int], ShapeRecord] = dataclasses.field(default_factory=dict)
    warmed: set[tuple[int, int, int]] = dataclasses.field(default_factory=set)

    def matches(self, spec: CompileSpec, placement: Placement, device: DeviceInfo) -> bool:
        return self.requested == (spec.scope, spec.fullgraph, placement, device.compile_backend)


def compile_transformer(pipe, spec: CompileSpec, placement: Placement, device: DeviceInfo) -> CompileState:
    """Mark the transformer for compilation (torch compiles lazily, on the first call per shape)."""
    cache_dir = use_cache_dir(spec.cache_dir)
    configure_dynamo()
    scope = spec.resolved_scope(placement)
    if spec.scope == "auto" and not getattr(pipe.transformer, "_repeated_blocks", None):
        scope = "whole"  # e.g. SD3 declares no repeated blocks: the whole transformer is all there is
    options = dict(backend=device.compile_backend, fullgraph=spec.fullgraph, dynamic=False)
    if scope == "whole":
        pipe.transformer.compile(**options)
    elif scope == "repeated_blocks":
        if not getattr(pipe.transformer, "_repeated_blocks", None):
            raise UserInputError(f"{type(pipe.transformer).__name__} declares no repeated blocks; "
                                 "use scope 'whole'.")
        pipe.transformer.compile_repeated_blocks(**options)
    else:
        raise UserInputError(f"compile scope '{scope}' is not one of {', '.join(SCOPES)}.")
    log.info("TPU Diffusers: transformer marked for compile (%s, backend %s, fullgraph %s, cache %s)",
             scope, device.compile_backend, spec.fullgraph, cache_dir)
    return CompileState(scope=scope, fullgraph=spec.fullgraph, backend=device.compile_backend, cache_dir=cache_dir,
                        requested=(spec.scope, spec.fullgraph, placement, device.compile_backend))


def remove_compile(pipe) -> None:
    """Back to eager: forget the compiled call on the transformer and all its blocks."""
    for module in pipe.transformer.modules():
        module._compiled_call_impl = None


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
def explained_compile_failures(state: CompileState, pipe):
    """Turn dynamo's failures into a message that says what to try; leave the pipeline eager."""
    import torch._dynamo.exc as dynamo_exc

    try:
        yield
    except dynamo_exc.FailOnRecompileLimitHit as e:
        remove_compile(pipe)
        raise CompileError(
            f"the compiled transformer hit torch's recompile limit ({RECOMPILE_LIMIT} shapes, "
            f"{len(state.shapes)} seen here). Use fewer distinct sizes, or raise TPU_DIFFUSERS_RECOMPILE_LIMIT "
            f"and restart ComfyUI. The pipeline runs eager until it is compiled again. ({e})") from e
    except dynamo_exc.TorchDynamoException as e:
        remove_compile(pipe)
        cause = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
        offloaded = state.requested[2] is Placement.MODEL_CPU_OFFLOAD
        if state.scope == "whole" and getattr(pipe.transformer, "_repeated_blocks", None):
            hint = "set scope to 'repeated_blocks', or turn fullgraph off"
        elif state.scope == "whole" and offloaded:
            hint = ("turn fullgraph off, or use placement 'device' (model CPU offload hooks cannot be traced and "
                    f"{type(pipe.transformer).__name__} declares no repeated blocks)")
        else:
            hint = "turn fullgraph off"
        raise CompileError(f"compiling the transformer ({state.scope}, fullgraph={state.fullgraph}, backend "
                           f"{state.backend}) failed: {cause}. Try: {hint}; or run eager. The pipeline runs "
                           f"eager until it is compiled again.") from e


def record_run(state: CompileState, shape: tuple[int, int, int], activity: CompileActivity) -> ShapeRecord:
    record = state.shapes.setdefault(shape, ShapeRecord())
    if activity.graphs:
        record.compiles += 1
        record.compile_seconds += activity.seconds
    else:
        record.reuses += 1
    return record


def describe(state: CompileState, shape: tuple[int, int, int], activity: CompileActivity) -> str:
    width, height, batch = shape
    if activity.graphs:
        return (f"compiled now for {width}x{height} (batch {batch}): {activity.graphs} graph(s) in "
                f"{activity.seconds:.1f}s")
    return f"reused compiled graph for {width}x{height} (batch {batch})"
