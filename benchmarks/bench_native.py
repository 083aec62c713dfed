#!/usr/bin/env python3
"""Ours vs ComfyUI's own nodes: step time of FLUX.1's denoising loop on the same single-file transformer.

    .venv/bin/python benchmarks/bench_native.py [--file flux1-dev.safetensors --model DIR]
        [--device auto|tpu|cuda|cpu] [--size 256x256] [--steps 4] [--runs 3] [--dtype auto|bfloat16|float32]

Both contenders load one FLUX.1 transformer file in BFL's layout (the layout of flux1-dev.safetensors),
at one size and one step count, in this one process:

  ours    Engine().generate with a PipelineHandle whose transformer comes from the file (`files`); configs,
          tokenizers, text encoders and VAE come from the diffusers folder --model of the same model.
  native  ComfyUI imported here: the file loaded as UNETLoader loads it (comfy.sd.load_diffusion_model,
          weight_dtype "default"), sampled as KSampler samples (comfy.sample.sample: euler, simple, cfg 1.0,
          which makes ComfyUI skip the negative) from an empty latent as EmptySD3LatentImage makes it
          (16 channels at 1/8 size), inside torch.inference_mode() as ComfyUI's executor runs nodes.

Text encoding is outside the comparison on both sides: ComfyUI's CLIP loaders hard-code the real T5-XXL
and CLIP-L sizes, so the native side gets its conditioning made directly, as tensors of the shapes that
our pipeline fed its transformer (recorded by a hook during our warm-up: T5 context (1, 512, D), CLIP
pooled (1, P), and the guidance when the file has guidance_in). What is compared is the gap between step
callbacks (the first step, the text encoding and the VAE decode all fall outside it), synchronised with
the device before each timestamp off CPU. Each side warms up once, then the runs alternate (taking turns
at going first); the figures are the fastest and the median gap over all runs (on a shared machine other
work only adds time, so the fastest step is the fair comparison; the median shows the noise). On CPU
the table adds the median CPU seconds per step of this process (all its threads), which other processes'
load inflates far less than wall time.

The dtype is the same on both sides: --dtype auto is our device's default (float32 on CPU, bfloat16 on
TPU/CUDA). ComfyUI gets it by UNETLoader's "default" where its own choice agrees, else as its
--bf16-unet / --fp32-unet would force it; on CPU ComfyUI then keeps bf16 weights but computes in float32
(manual cast: its should_use_bf16 is False for CPU). The table says what each side actually ran.
ComfyUI's import-time torch settings (attention backend flags on CUDA) apply to both, as inside ComfyUI.

Without --file it builds tools/tiny_single_files.flux1_wide (FLUX.1-dev at the real width, 24 heads of
128, with one double and one single block, bf16 weights, tiny text encoders and VAE) and its transformer
in BFL's layout, once, under .comfyui/bench-models/. ComfyUI has no TPU device: on a TPU only our side runs.
"""

from __future__ import annotations

import argparse
import contextlib
import logging
import statistics
import sys
import time
from pathlib import Path

from common import PROMPT, StepClock, built_wide_flux1, parse_size

from tpu_diffusers_runtime.device import resolve_device
from tpu_diffusers_runtime.engine import Engine
from tpu_diffusers_runtime.handle import PipelineHandle
from tpu_diffusers_runtime.tasks import SampleRequest

SEED = 0


def built_files() -> tuple[Path, Path]:
    """(the transformer file in BFL's layout, the diffusers folder it was written from), built once;
    each beside its final name, so an interrupted build is never taken for a finished one."""
    import tiny_single_files
    from safetensors.torch import save_file

    folder = built_wide_flux1()
    file = folder.parent / "wide-flux1-dev-files" / "flux1-dev.safetensors"
    if not file.exists() or file.stat().st_mtime < (folder / "model_index.json").stat().st_mtime:
        file.unlink(missing_ok=True)  # written from an older folder
        print(f"writing its transformer in BFL's layout to {file}", flush=True)
        file.parent.mkdir(parents=True, exist_ok=True)
        bfl = tiny_single_files.flux_to_bfl(tiny_single_files.folder_weights(folder, "transformer"))
        partial = file.with_name(file.name + ".partial")
        save_file({k: v.contiguous() for k, v in bfl.items()}, str(partial))
        partial.rename(file)
    return file, folder


def device_sync(device_type: str):
    """Waits for the device's queued work, so a step's timestamp is taken when the step ran."""
    if device_type == "cpu":
        return lambda: None
    import torch

    return torch.accelerator.synchronize


class Clock(StepClock):
    """StepClock that synchronises the device first; gaps between steps of one run, in wall-clock seconds
    and in this process's CPU seconds (all threads: on a shared CPU host, what the step cost itself)."""

    def __init__(self, sync):
        super().__init__()
        self.sync, self.cpu_stamps = sync, []

    def __call__(self, done: int, total: int, what: str, *preview) -> None:
        if what == "sampling":
            self.sync()
            self.cpu_stamps.append(time.process_time())
        super().__call__(done, total, what, *preview)

    def gaps(self) -> list[tuple[float, float]]:
        return [(b - a, d - c) for a, b, c, d in zip(self.stamps, self.stamps[1:], self.cpu_stamps,
                                                     self.cpu_stamps[1:])]


# ------------------------------------------------------------------------------------------------ ours
class Ours:
    name = "ours"

    def __init__(self, file: Path, folder: Path, args, device_type: str):
        import torch

        width, height = parse_size(args.size)
        self.handle = PipelineHandle.of(source=str(folder), model_class="FluxPipeline",
                                     files=(("transformer", str(file)),), device=args.device, dtype=args.dtype)
        self.request = SampleRequest(prompt=PROMPT, width=width, height=height, steps=args.steps,
                                     guidance=args.guidance, seed=SEED)
        self.engine, self.sync = Engine(), device_sync(device_type)
        self.inputs: dict = {}
        pipe = self.engine.realise(self.handle)[0].pipe
        hook = pipe.transformer.register_forward_pre_hook(self._record_inputs, with_kwargs=True)
        with torch.inference_mode():  # as ComfyUI calls every node
            self.engine.generate(self.handle, self.request)  # loads, warms up, and records the inputs
        hook.remove()
        self.dtype = short(pipe.transformer.dtype)
        attention = getattr(pipe.transformer, "_attention_backend", None) or "diffusers default (torch SDPA)"
        self.ran = f"weights and compute {pipe.transformer.dtype}; attention {attention}; device {device_type}"

    def _record_inputs(self, _module, _args, kwargs):
        if not self.inputs:
            self.inputs = {name: (tuple(value.shape) if value is not None else None) for name, value in kwargs.items()
                           if name in ("hidden_states", "encoder_hidden_states", "pooled_projections", "guidance")}

    def run(self) -> list[float]:
        import torch

        clock = Clock(self.sync)
        with torch.inference_mode():
            self.engine.generate(self.handle, self.request, on_progress=clock)
        return clock.gaps()

    def close(self):
        self.engine.unload()


# ---------------------------------------------------------------------------------------------- native
@contextlib.contextmanager
def quiet_logging(level=logging.ERROR):
    """ComfyUI logs its device set-up and missing optional packages (torchaudio) at import."""
    logging.disable(level - 1)
    try:
        yield
    finally:
        logging.disable(logging.NOTSET)


def import_comfy(comfyui: Path, device_type: str):
    """ComfyUI's `comfy` package, first on sys.path; its device is picked at import, so --cpu is set
    before (ComfyUI's own arguments keep their defaults: comfy.options leaves argv unparsed)."""
    sys.path.insert(0, str(comfyui))
    with quiet_logging():
        from comfy.cli_args import args as comfy_args

        comfy_args.cpu = device_type == "cpu"
        import comfy.ldm.modules.attention
        import comfy.model_management
        import comfy.sample
        import comfy.sd
        import comfy.utils
    return comfy


class Native:
    name = "native"

    def __init__(self, comfy, file: Path, args, inputs: dict, wanted, device_type: str):
        import torch

        self.comfy, self.steps, self.sync = comfy, args.steps, device_sync(device_type)
        with torch.inference_mode():
            model, how = comfy.sd.load_diffusion_model(str(file)), 'UNETLoader weight_dtype "default"'
            if model.model.get_dtype() != wanted:  # what --bf16-unet / --fp32-unet would do
                default = model.model.get_dtype()
                del model
                model = comfy.sd.load_diffusion_model(str(file), model_options={"dtype": wanted})
                how = f"ComfyUI's default here is {short(default)}: loaded as --{short(wanted)}-unet loads it"
        self.model = model
        width, height = parse_size(args.size)
        latent = torch.zeros([1, 16, height // 8, width // 8])  # EmptySD3LatentImage
        self.latent = comfy.sample.fix_empty_latent_channels(model, latent)
        generator = torch.Generator().manual_seed(SEED)
        context = torch.randn(inputs["encoder_hidden_states"], generator=generator)
        pooled = torch.randn(inputs["pooled_projections"], generator=generator)
        options = {"pooled_output": pooled}
        if inputs.get("guidance") is not None:  # a file with guidance_in (FLUX.1-dev): FluxGuidance's value
            options["guidance"] = args.guidance
        self.cond = [[context, options]]
        self.negative = [[torch.zeros_like(context), {"pooled_output": torch.zeros_like(pooled)}]]  # skipped at cfg 1
        base = model.model
        weights, compute = base.get_dtype(), base.manual_cast_dtype or base.get_dtype()
        self.dtype = short(weights) if weights == compute else f"{short(weights)} w, {short(compute)} compute"
        attention = comfy.ldm.modules.attention.optimized_attention.__name__
        self.ran = (f"weights {weights}, compute {compute}; attention {attention}; {how}; "
                    f"device {comfy.model_management.get_torch_device()}")
        self.run()  # warm-up: ComfyUI loads the model onto its device at the first sample

    def run(self) -> list[float]:
        import torch

        clock = Clock(self.sync)
        noise = self.comfy.sample.prepare_noise(self.latent, SEED)
        with torch.inference_mode():
            self.comfy.sample.sample(self.model, noise, self.steps, 1.0, "euler", "simple", self.cond, self.negative,
                                     self.latent, denoise=1.0, disable_pbar=True, seed=SEED,
                                     callback=lambda step, _x0, _x, total: clock(step + 1, total, "sampling"))
        return clock.gaps()

    def close(self):
        self.comfy.model_management.unload_all_models()
        self.model = None


def short(dtype) -> str:
    return {"float32": "fp32", "bfloat16": "bf16", "float16": "fp16"}.get(str(dtype).removeprefix("torch."),
                                                                          str(dtype).removeprefix("torch."))


# ------------------------------------------------------------------------------------------------ main
def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--file", type=Path, help="a FLUX.1 transformer file in BFL's layout (needs --model)")
    parser.add_argument("--model", type=Path, help="the diffusers folder of the same model (configs, tokenizers, "
                                                   "text encoders, VAE for our side)")
    parser.add_argument("--device", default="auto", choices=("auto", "tpu", "cuda", "cpu"))
    parser.add_argument("--size", default="256x256")
    parser.add_argument("--steps", type=int, default=4)
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--dtype", default="auto", choices=("auto", "bfloat16", "float32"),
                        help="both sides' weights; auto: our device default (float32 on CPU, bfloat16 elsewhere)")
    parser.add_argument("--guidance", type=float, default=3.5,
                        help="FLUX.1-dev's guidance (a file without guidance_in ignores it)")
    parser.add_argument("--comfyui", type=Path, help="a ComfyUI checkout (default: tools/comfy_host.prepare_comfyui())")
    args = parser.parse_args(argv)
    if (args.file is None) != (args.model is None):
        parser.error("--file and --model go together: the file's transformer and the diffusers folder of its model")
    if args.steps < 2:
        parser.error("--steps must be at least 2: a step time is the gap between two step callbacks")
    import torch

    file, folder = (args.file.resolve(), args.model.resolve()) if args.file else built_files()
    device = resolve_device(args.device)
    wanted = getattr(torch, PipelineHandle.of(source="", model_class="FluxPipeline", dtype=args.dtype)
                     .resolved_dtype(device))

    print(f"file {file}\nfolder {folder}", flush=True)
    ours = Ours(file, folder, args, device.type)
    contenders = [ours]
    if device.type == "tpu":
        native_note = "native: not available on TPU (ComfyUI has no TPU device); our side only"
    else:
        from comfy_host import prepare_comfyui

        comfy = import_comfy((args.comfyui or prepare_comfyui()).resolve(), device.type)
        contenders.append(Native(comfy, file, args, ours.inputs, wanted, device.type))
        native_note = ""
    gaps = {c.name: [] for c in contenders}
    for run in range(args.runs):
        for contender in contenders if run % 2 == 0 else contenders[::-1]:  # neither always goes first
            gaps[contender.name] += contender.run()
        print(f"run {run + 1}/{args.runs}: " + ", ".join(
            f"{name} {statistics.median(wall for wall, _ in g[-(args.steps - 1):]):.3f}s/step"
            for name, g in gaps.items()), flush=True)
    for contender in contenders:
        contender.close()

    fastest = {name: min(wall for wall, _ in g) for name, g in gaps.items()}
    median = {name: statistics.median(wall for wall, _ in g) for name, g in gaps.items()}
    cpu = {name: statistics.median(cpu for _, cpu in g) for name, g in gaps.items()}
    show_cpu = device.type == "cpu"
    print(f"\ndevice {device.type}, {args.size}, {args.steps} steps ({args.steps - 1} step gaps timed per run), "
          f"{args.runs} runs each, alternating; seconds per step")
    print(f"{'contender':<10}{'dtype':<22}{'size':<10}{'steps':>6}{'fastest s/step':>16}{'median s/step':>15}"
          + (f"{'median CPU s/step':>19}" if show_cpu else "")
          + ("  ours/native: fastest  median" + ("  CPU" if show_cpu else "") if "native" in gaps else ""))
    for contender in contenders:
        name = contender.name
        ratios = ""
        if name == "ours" and "native" in gaps:
            ratios = f"{fastest[name] / fastest['native']:>22.3f}{median[name] / median['native']:>8.3f}"
            ratios += f"{cpu[name] / cpu['native']:>5.2f}" if show_cpu else ""
        print(f"{name:<10}{contender.dtype:<22}{args.size:<10}{args.steps:>6}{fastest[name]:>16.3f}"
              f"{median[name]:>15.3f}" + (f"{cpu[name]:>19.3f}" if show_cpu else "") + ratios)
    print(f"\ntransformer inputs (ours, recorded): {ours.inputs}")
    for contender in contenders:
        print(f"{contender.name}: {contender.ran}")
    if native_note:
        print(native_note)
    return 0


if __name__ == "__main__":
    sys.exit(main())
