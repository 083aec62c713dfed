#!/usr/bin/env python3
"""ComfyUI's int8 ConvRot weights three ways, side by side in one run: W8A8 (runtime/int8_matmul.py: the
activations rotated and quantized, int8 x int8), weight-only (the int8 weight dequantized per layer, then a bf16
matmul) and plain bf16 weights.

    .venv/bin/python benchmarks/bench_int8_matmul.py [--device auto|tpu|cuda|cpu] [--width 3072]
        [--tokens 4608] [--runs 5] [--compile]

What runs: the linear layers of one transformer block with random weights (qkv, attention out, MLP up, GELU, MLP
down, with the residuals), at FLUX.1's width and its 1024x1024 tokens (4096 image + 512 text) by default. The
attention itself is left out: its cost does not depend on how the weights are stored. The weights are quantized by
comfy-kitchen as ComfyUI writes its int8_convrot files (group 256). Runs alternate the modes; the figure is the
fastest forward of each (on a shared machine other work only adds time), as a ratio to bf16. With --compile each
mode is also compiled (the device's compile backend, static shapes), the way the pack runs compiled mode.

Each output is compared with bf16's (relative difference of the norms). W8A8 is also checked against weight-only:
they differ only by the activations' rounding to int8 (0.0055 at width 256, 0.0062 at 3072 through this block on
the CPU), so a difference over MAX_W8A8_DIFFERENCE is a wrong result (a broken int8 matmul on the device): the run
fails, as it does when a mode fails.
"""

from __future__ import annotations

import argparse
import dataclasses
import sys
import time

import torch
from common import ROOT  # noqa: F401  (puts the runtime on the path)

from tpu_diffusers_runtime.device import resolve_device, synchronize
from tpu_diffusers_runtime.int8_matmul import int8_linear
from tpu_diffusers_runtime.quant_formats import QuantizedWeight

GROUP_SIZE = 256  # ComfyUI's convrot_groupsize
MAX_W8A8_DIFFERENCE = 0.05  # W8A8 vs weight-only, relative (measured on the CPU: 0.0055-0.0062)


def block_weights(width: int, generator) -> dict[str, tuple[torch.Tensor, torch.Tensor]]:
    """{layer: (weight [out, in], bias)} of a transformer block's linears in float32, initialised as nn.Linear does."""
    shapes = {"qkv": (3 * width, width), "out": (width, width), "mlp_up": (4 * width, width),
              "mlp_down": (width, 4 * width)}
    return {name: ((torch.rand(shape, generator=generator) * 2 - 1) / shape[1] ** 0.5,
                   (torch.rand(shape[0], generator=generator) * 2 - 1) / shape[1] ** 0.5)
            for name, shape in shapes.items()}


def quantized(weight: torch.Tensor, device) -> QuantizedWeight:
    """`weight` as ComfyUI's int8_convrot files hold it, on `device`."""
    from comfy_kitchen.tensor import TensorWiseINT8Layout

    qdata, params = TensorWiseINT8Layout.quantize(weight, per_channel=True, convrot=True, convrot_groupsize=GROUP_SIZE)
    return QuantizedWeight("int8_tensorwise", "TensorWiseINT8Layout", qdata.to(device),
                           dataclasses.replace(params, scale=params.scale.to(device)))


def forward(linear, layers: dict, x: torch.Tensor) -> torch.Tensor:
    """The block's linears: attention's projections around a stand-in for attention, then the MLP."""
    width = x.shape[-1]
    h = x + linear(layers["out"], linear(layers["qkv"], x)[..., :width])
    return h + linear(layers["mlp_down"], torch.nn.functional.gelu(linear(layers["mlp_up"], h), approximate="tanh"))


WEIGHT_ONLY, W8A8 = "weight-only (dequantized per layer)", "W8A8 (int8 x int8)"
MODES = {  # name: (how a layer (weight, bias) runs, which weights it takes)
    "bf16": (lambda layer, x: torch.nn.functional.linear(x, *layer), "bf16"),
    WEIGHT_ONLY: (lambda layer, x: torch.nn.functional.linear(x, layer[0].dequantize(x.dtype), layer[1]), "int8"),
    W8A8: (lambda layer, x: int8_linear(x, *layer), "int8"),
}


def measure(args) -> tuple[list[tuple], float | None]:
    """Rows (mode, compiled, fastest seconds or error, output), and W8A8's difference from weight-only (eager; None
    when either failed)."""
    info = resolve_device(args.device)
    device = info.torch_device()
    generator = torch.Generator().manual_seed(0)
    weights = block_weights(args.width, generator)
    layers = {"bf16": {name: (w.to(torch.bfloat16).to(device), b.to(torch.bfloat16).to(device))
                       for name, (w, b) in weights.items()},
              "int8": {name: (quantized(w.to(torch.bfloat16), device), b.to(torch.bfloat16).to(device))
                       for name, (w, b) in weights.items()}}
    x = torch.randn(1, args.tokens, args.width, generator=generator).to(torch.bfloat16).to(device)
    runs = {}
    for name, (linear, kind) in MODES.items():
        def run(x, linear=linear, kind=kind):
            return forward(linear, layers[kind], x)
        runs[(name, False)] = run
        if args.compile:
            runs[(name, True)] = torch.compile(run, backend=info.compile_backend, dynamic=False)
    fastest, outputs, errors = {}, {}, {}
    with torch.no_grad():
        for key, run in runs.items():  # the first call: warm-up (and the compile)
            try:
                outputs[key] = run(x).float().cpu()
            except Exception as error:  # noqa: BLE001  (a mode the device cannot run is a measured result)
                errors[key] = f"{type(error).__name__}: {str(error).strip().splitlines()[0] if str(error) else ''}"
        for _ in range(args.runs):
            for key, run in runs.items():
                if key in errors:
                    continue
                start = time.perf_counter()
                run(x)
                synchronize(info)
                fastest[key] = min(fastest.get(key, float("inf")), time.perf_counter() - start)
    rows = [(name, compiled, errors.get((name, compiled), fastest.get((name, compiled))),
             outputs.get((name, compiled))) for name, compiled in runs]
    w8a8, weight_only = outputs.get((W8A8, False)), outputs.get((WEIGHT_ONLY, False))
    return rows, None if w8a8 is None or weight_only is None else difference(w8a8, weight_only)


def difference(output: torch.Tensor, reference: torch.Tensor) -> float:
    return float((output - reference).norm() / reference.norm())


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--device", default="auto")
    parser.add_argument("--width", type=int, default=3072, help=f"a multiple of the group size {GROUP_SIZE}")
    parser.add_argument("--tokens", type=int, default=4608)
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--compile", action="store_true", help="also compiled, each mode")
    args = parser.parse_args(argv)
    rows, w8a8_difference = measure(args)
    agrees = w8a8_difference is not None and w8a8_difference <= MAX_W8A8_DIFFERENCE
    bf16 = {compiled: (seconds, output) for name, compiled, seconds, output in rows if name == "bf16"}
    print(f"\ndevice {resolve_device(args.device).type}, bf16 activations, one transformer block's linears at width "
          f"{args.width}, {args.tokens} tokens; int8 weights ConvRot group {GROUP_SIZE}; fastest of {args.runs}\n")
    print("| mode | compiled | ms per forward | vs bf16 | difference from bf16 |")
    print("|---|---|---|---|---|")
    for name, compiled, seconds, output in rows:
        base_seconds, base_output = bf16[compiled]
        if isinstance(seconds, str):
            figures = f"**FAIL** {seconds} | |"
        elif isinstance(base_seconds, str):
            figures = f"{seconds * 1000:.2f} | bf16 failed | bf16 failed"
        else:
            figures = f"{seconds * 1000:.2f} | {seconds / base_seconds:.2f} | {difference(output, base_output):.4f}"
        print(f"| {name} | {'yes' if compiled else 'no'} | {figures} |")
    measured = "one of them did not run" if w8a8_difference is None else f"{w8a8_difference:.4f}"
    print(f"\nW8A8 vs weight-only (eager): {measured}, allowed {MAX_W8A8_DIFFERENCE}: {'ok' if agrees else '**FAIL**'}")
    failed = not agrees or any(isinstance(seconds, str) for _, _, seconds, _ in rows)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
