"""runtime/int8_matmul.py: ComfyUI's int8 weights (plain and ConvRot) as W8A8 on the CPU.

Weights are quantized with comfy-kitchen's own quantizer (TensorWiseINT8Layout.quantize, as ComfyUI writes its
files), per tensor and per output row. Two references:

- ComfyUI's own W8A8 result: `F.linear` on comfy-kitchen's QuantizedTensor with its eager backend (what ComfyUI
  runs for these files). int8_linear takes the same steps in the same order and sums integers exactly, so on the
  CPU the results are equal bit for bit (measured: a difference of 0 in float32 and bfloat16): the tolerance is 0.
- F.linear on the dequantized weight (the pack's weight-only path). W8A8 differs from it by the rounding of the
  activations to int8: each value moves by at most half its row's step s = absmax(row) / 127, uniformly, so
  ||W8A8 - dequantized|| is expected at sqrt(sum over rows of s^2 / 12) x ||W||_F (the Hadamard rotation keeps
  norms). Measured over 3 seeds and the three kinds: 0.97-1.02 x that in float32, 1.16-1.20 x in bfloat16 (the
  output's own rounding adds to it). Allowed: 0.5-1.5 x. Below 0.5 the activations were not quantized (a weight-only
  result measures 0), above 1.5 something else is wrong: a wrong rotation group size measures ~125 x.
"""

import dataclasses

import pytest
import torch

from tpu_diffusers_runtime import int8_matmul
from tpu_diffusers_runtime.errors import UserInputError
from tpu_diffusers_runtime.quant_formats import QuantizedWeight

ALLOWED = (0.5, 1.5)  # ||W8A8 - dequantized|| over the expected activation rounding (the module's docstring)
KINDS = {"per tensor": dict(per_channel=False, convrot=False), "per row": dict(per_channel=True, convrot=False),
         "ConvRot": dict(per_channel=True, convrot=True)}


def quantized(weight: torch.Tensor, kind: str, group_size: int = 256) -> QuantizedWeight:
    """`weight` quantized by comfy-kitchen as ComfyUI's int8 files are ("int8_tensorwise", optionally ConvRot)."""
    from comfy_kitchen.tensor import TensorWiseINT8Layout

    qdata, params = TensorWiseINT8Layout.quantize(weight, convrot_groupsize=group_size, **KINDS[kind])
    return QuantizedWeight("int8_tensorwise", "TensorWiseINT8Layout", qdata, params)


def comfyui_w8a8(x, weight: QuantizedWeight, bias):
    """ComfyUI's own result: F.linear on comfy-kitchen's QuantizedTensor, its eager backend."""
    import comfy_kitchen
    from comfy_kitchen.tensor import QuantizedTensor

    with comfy_kitchen.use_backend("eager"):
        return torch.nn.functional.linear(x, QuantizedTensor(weight.qdata, weight.layout, weight.params), bias)


def layer(kind: str, dtype, seed: int = 0):
    """x [2, 48, 1024], a quantized [384, 1024] weight and a bias, in `dtype`."""
    generator = torch.Generator().manual_seed(seed)
    x = (3 * torch.randn(2, 48, 1024, generator=generator)).to(dtype)
    weight = (0.05 * torch.randn(384, 1024, generator=generator)).to(dtype)
    bias = (0.1 * torch.randn(384, generator=generator)).to(dtype)
    return x, quantized(weight, kind), bias


def against_dequantized(x, weight: QuantizedWeight, bias, out) -> float:
    """||out - F.linear on the dequantized weight|| over the expected activation rounding (module docstring)."""
    dequantized = weight.dequantize(x.dtype)
    step = x.float().abs().amax(dim=-1) / 127
    expected = (step.square().sum() / 12).sqrt() * dequantized.float().norm()
    return float((out.float() - torch.nn.functional.linear(x, dequantized, bias).float()).norm() / expected)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("kind", list(KINDS))
def test_w8a8_equals_comfyuis_own_and_is_the_activation_rounding_away_from_the_dequantized_path(kind, dtype):
    x, weight, bias = layer(kind, dtype)
    out = int8_matmul.int8_linear(x, weight, bias)
    assert out.dtype == dtype and out.shape == (2, 48, 384)
    assert torch.equal(out, comfyui_w8a8(x, weight, bias))
    assert ALLOWED[0] <= against_dequantized(x, weight, bias, out) <= ALLOWED[1]


@pytest.mark.parametrize("kind", list(KINDS))
def test_the_tpus_int32_matmul_gives_the_same_result(kind, monkeypatch):
    """The TPU's op (int8 widened to int32, torch.mm) run here on the CPU: integer sums, so the same bits."""
    x, weight, bias = layer(kind, torch.bfloat16, seed=1)
    on_cpu = int8_matmul.int8_linear(x, weight, bias)
    monkeypatch.setattr(int8_matmul, "INT32_MATMUL_DEVICES", ("cpu",))
    assert torch.equal(int8_matmul.int8_linear(x, weight, bias), on_cpu)


def test_a_wrong_rotation_group_size_is_caught_by_the_tolerance():
    """The file's weight was rotated in groups of 256; rotating the activations in groups of 64 is far outside it."""
    x, weight, bias = layer("ConvRot", torch.float32)
    wrong = dataclasses.replace(weight, params=dataclasses.replace(weight.params, convrot_groupsize=64))
    assert against_dequantized(x, weight, bias, int8_matmul.int8_linear(x, wrong, bias)) > 50 * ALLOWED[1]


def test_without_activation_quantization_the_result_is_caught_too():
    """The weight-only result (F.linear on the dequantized weight) is below the tolerance's floor."""
    x, weight, bias = layer("ConvRot", torch.float32)
    weight_only = torch.nn.functional.linear(x, weight.dequantize(x.dtype), bias)
    assert against_dequantized(x, weight, bias, weight_only) < ALLOWED[0]


def test_other_formats_stay_weight_only():
    from comfy_kitchen.tensor import TensorCoreFP8Layout

    qdata, params = TensorCoreFP8Layout.quantize(torch.randn(8, 16))
    fp8 = QuantizedWeight("float8_e4m3fn", "TensorCoreFP8Layout", qdata, params)
    with pytest.raises(UserInputError, match="runs int8_tensorwise weights only; this layer is float8_e4m3fn"):
        int8_matmul.int8_linear(torch.randn(2, 16), fp8)
