"""W8A8: a linear layer of ComfyUI's int8 weights as an int8 x int8 matmul, as ComfyUI itself runs those files.

Weight-only (QuantizedWeight.dequantize per layer) keeps int8 weights small on the chip but multiplies in bf16.
Chips with int8 matrix units (TPU v5e/v6e/v7x, CUDA since Turing) multiply int8 faster than bf16, and that is
what ConvRot is for: a fixed Hadamard rotation of each group of input channels spreads outliers, so the weight
(rotated offline, in the file) and the activations (rotated here, per call) both quantize well to int8. The
steps, each comfy-kitchen's own eager function (both 0.2.31 and 0.2.40 have them; the math is not written again):

1. ConvRot weights: rotate the activations group-wise with the same Hadamard and quantize them to int8, one scale
   per row (`quantize_and_rotate_rowwise`); plain int8 weights: quantize only (`quantize_int8_rowwise`).
2. int8 x int8 with int32 accumulation (exact integer sums).
3. Rescale by the activation's row scale times the weight's scale (per tensor or per output row) in float32, cast
   to x's dtype, add the bias: the order of comfy-kitchen's `int8_linear`, so on the CPU the result equals
   ComfyUI's own W8A8 bit for bit.

Which op does step 2 where:
- CPU and CUDA: comfy-kitchen's `mm_int8` (`torch._int_mm`; cuBLASLt's int8 kernels on CUDA). Run on the CPU in
  the tests; designed, not run on a CUDA chip here.
- TPU: TorchTPU 0.2.0 has no kernel for `aten::_int_mm` (the name is in none of its libraries), and its
  `aten::mm.dtype` kernel cannot be compiled for int8 (torch's own meta function for it, which tracing uses,
  refuses int8 -> int32). So the TPU multiplies the int8 tensors widened to int32 with `torch.mm`: exact, and in
  one compiled graph (compiled mode, fused eager) a widening convert feeding a dot, which XLA's
  ConvertOperandFolding pass (in libtpu's pass pipelines) rewrites into an int8 x int8 dot with int32 results.
  Strict eager runs each op alone: the int32 copies are made and nothing is gained there. Designed, not run on a
  TPU: the ratio to bf16 is what `benchmarks/bench_int8_matmul.py` measures on the chip (verify_device's plan).

Only `int8_tensorwise` (plain and ConvRot) runs this way; other formats (fp8, nvfp4, mxfp8, ...) stay weight-only.
"""

from __future__ import annotations

from .errors import UserInputError

W8A8_FORMATS = ("int8_tensorwise",)  # QuantizedWeight.format values int8_linear runs
INT32_MATMUL_DEVICES = ("tpu",)  # device types whose int8 matmul is torch.mm on int32 (no _int_mm kernel there)


def int8_linear(x, weight, bias=None):
    """`F.linear(x, weight, bias)` for an int8 QuantizedWeight (runtime/quant_formats.py), as W8A8: the activations
    rotated (ConvRot) and quantized per row to int8, an int8 x int8 matmul, rescaled; the result in x's dtype."""
    import torch
    from comfy_kitchen.backends.eager import quantization
    from comfy_kitchen.tensor.int8_utils import _build_hadamard

    if weight.format not in W8A8_FORMATS or weight.qdata.dtype != torch.int8:
        raise UserInputError(f"the int8 x int8 path runs {', '.join(W8A8_FORMATS)} weights only; this layer is "
                             f"{weight.format} ({weight.qdata.dtype}), which stays weight-only (dequantized per "
                             "layer).")
    out_features, in_features = weight.qdata.shape
    weight_scale = weight.params.scale.to(device=x.device, dtype=torch.float32).reshape(1, -1)
    if weight_scale.shape[1] not in (1, out_features):
        raise UserInputError(f"an int8 weight of shape {[out_features, in_features]} has "
                             f"{weight_scale.shape[1]} scales; it needs one, or one per output row.")
    rows = x.reshape(-1, in_features)
    if weight.params.convrot:
        group_size = weight.params.convrot_groupsize
        hadamard = _build_hadamard(group_size, device=x.device, dtype=x.dtype)
        x_int8, x_scale = quantization.quantize_and_rotate_rowwise(rows, hadamard, group_size)
    else:
        x_int8, x_scale = quantization.quantize_int8_rowwise(rows)
    accumulated = int8_matmul(x_int8, weight.qdata.to(x.device).T)
    out = (accumulated.float() * (x_scale.to(torch.float32) * weight_scale)).to(x.dtype)
    if bias is not None:
        out = out + bias.to(device=out.device, dtype=out.dtype).reshape(1, -1)
    return out.reshape(*x.shape[:-1], out_features)


def int8_matmul(a, b):
    """a [M, K] int8 @ b [K, N] int8 -> int32 [M, N], exact, with an op the device has (the module's docstring)."""
    import torch
    from comfy_kitchen.backends.eager import quantization

    if a.device.type in INT32_MATMUL_DEVICES:
        return torch.mm(a.to(torch.int32), b.to(torch.int32))
    return quantization.mm_int8(a, b.contiguous())
