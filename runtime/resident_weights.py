"""int8 and fp8 layers kept quantized in device memory, dequantized per layer when they run (weight-only).

A 22B int8 transformer is ~22 GB as its file stores it and ~44 GB in bf16. With this setting a model loaded from a
ComfyUI file keeps each mapped Linear's weight as the file's packed data and scales (`ResidentLinear`); each call
computes the weight with `QuantizedWeight.dequantize`, the same comfy-kitchen function the dequantized-on-load path
uses, so the image is the same bit for bit.

Mapping back to the file: diffusers' single-file converters rename keys and split fused weights (torch.chunk,
torch.split), so a loaded Linear's weight is either a file layer's dequantized tensor or a block of its rows. The
loader may copy it (from_single_file loads in float32, then the model is cast to the dtype), so it is found by
value, exactly: the file layer of the same width and dtype whose rows from some start equal the weight (`rows`
slices the data and per-row scales, for the formats whose scales are per tensor or per row). Equal values
dequantize to the same weight, so the image is the same whichever equal layer is found. A layer the converter
built anew (concatenated, permuted, kept in float32) equals no file rows and stays dequantized; the run info says
how many.

`apply(model, ...)` makes a loaded model's layers resident, once, when it loads (the setting is in the load key).
`.to()` moves the packed data and scales (buffers), so model CPU offload moves 1 byte per weight. Under tensor
parallelism the denoisers stay dequantized (DTensor sharding splits plain weights only): runtime/loading.py loads
them with `dequantize on load` and says so in the run info.

LoRAs on resident layers are not fused into the int8/fp8 data (that would re-quantize, and the next strength change
would need the file again): runtime/features/lora.py keeps peft's unfused side branch on them instead.
"""

from __future__ import annotations

import dataclasses

import torch  # this module is imported where a model loads, not at queue time

from .quant_formats import SCALED_FP8_MARKER, QuantizedWeight
from .specs import QuantizedWeights

FINGERPRINT = 8  # leading values of a row hashed to find where a Linear's rows start in a file layer
# The formats kept quantized: one scale per tensor (fp8, also the older scaled fp8 files with a `scaled_fp8` marker;
# int8) or per output row (int8, also with ConvRot, whose rotation mixes input channels only), so a block of rows is
# the same block of the data and of the scales.
ROW_FORMATS = ("int8_tensorwise", "float8_e4m3fn", "float8_e5m2", SCALED_FP8_MARKER)
INT8_FORMAT = "int8_tensorwise"


def rows(weight: QuantizedWeight, start: int, stop: int) -> QuantizedWeight | None:
    """The quantized weight of rows [start, stop) of `weight`'s layer (a converter's torch.chunk of a fused
    layer); None for a format whose scales are not per tensor or per row."""
    scale = weight.params.scale
    if weight.format not in ROW_FORMATS or scale.numel() not in (1, weight.qdata.shape[0]):
        return None
    params = dataclasses.replace(weight.params, scale=scale if scale.numel() == 1 else scale[start:stop],
                                 orig_shape=(stop - start, *weight.params.orig_shape[1:]))
    return dataclasses.replace(weight, qdata=weight.qdata[start:stop], params=params)


def layer_forward(choice: QuantizedWeights, weight: QuantizedWeight):
    """The one place that picks a resident layer's matmul: weight-only (dequantize, then the dtype's matmul), or
    for int8 layers with the int8 matmul choice, int8 x int8 with the activations quantized per call."""
    if choice is QuantizedWeights.INT8_MATMUL and weight.format == INT8_FORMAT:
        return _int8_matmul
    return _weight_only


def _weight_only(x, quantized: QuantizedWeight, bias, dtype):
    return torch.nn.functional.linear(x, quantized.dequantize(dtype), bias)


def _int8_matmul(x, quantized: QuantizedWeight, bias, dtype):
    from .int8_matmul import int8_linear

    return int8_linear(x, quantized, bias)


class ResidentLinear(torch.nn.Linear):
    """A Linear whose weight stays as its file stores it: the packed data and the scales as buffers (so `.to()`
    and state_dict carry them), the rest of the layout's Params as plain values. A Linear subclass, so peft wraps
    it for LoRA like any Linear; `weight` is the dequantized weight, computed when read."""

    def __init__(self, linear, quantized: QuantizedWeight, choice: QuantizedWeights):
        torch.nn.Module.__init__(self)
        self.in_features, self.out_features = linear.in_features, linear.out_features
        self.bias = linear.bias
        self.format, self.layout, self.dtype = quantized.format, quantized.layout, linear.weight.dtype
        self.params = quantized.params
        self.tensor_fields = tuple(quantized.params._tensor_fields())
        self.register_buffer("qdata", quantized.qdata)
        for field in self.tensor_fields:
            self.register_buffer(field, getattr(quantized.params, field))
        self.matmul = layer_forward(choice, quantized)

    def quantized(self) -> QuantizedWeight:
        """The layer's QuantizedWeight, with the data and scales where the module is now."""
        params = dataclasses.replace(self.params, **{field: getattr(self, field) for field in self.tensor_fields})
        return QuantizedWeight(self.format, self.layout, self.qdata, params)

    @property
    def weight(self):
        return self.quantized().dequantize(self.dtype)

    def forward(self, x):
        return self.matmul(x, self.quantized(), self.bias, self.dtype)

    def extra_repr(self) -> str:
        return f"{super().extra_repr()}, {self.format} kept quantized"


@dataclasses.dataclass(frozen=True)
class Residency:
    """What `apply` did to one model: layers kept quantized (by format) and the file's quantized layers left
    dequantized (no Linear's weight equals it or a block of its rows)."""

    resident: dict
    left_dequantized: int

    def words(self, component: str) -> str:
        kept = ", ".join(f"{count} {fmt}" for fmt, count in sorted(self.resident.items())) or "no"
        left = (f"; {self.left_dequantized} quantized layers of the file left dequantized (diffusers' converter "
                "built them anew: fused differently, or kept in float32)") if self.left_dequantized else ""
        return f"{component}: {kept} layers kept quantized on the chip, dequantized per layer as they run{left}"


def apply(model, weights: dict, quantized: dict, choice: QuantizedWeights) -> Residency:
    """Make `model`'s Linears whose weight equals a quantized file layer, or a block of its rows, resident.

    `weights`: the file's dequantized tensors the model was loaded from, {file key: tensor}; `quantized`:
    {file key: QuantizedWeight} of its quantized layers (quant_formats.quantized_layers). Call after the model
    has its dtype: a later `.to(dtype)` would cast the fp8 data and the float32 scales too.

    Each Linear's first row is hashed (`_row_hashes`); each file layer's rows are hashed in one vectorised pass and
    looked up with `torch.isin`, so the search is linear in the file's rows (a 22B model maps in seconds), and every
    hit is confirmed by comparing the whole block."""
    linears = {name: module for name, module in model.named_modules() if type(module) is torch.nn.Linear}
    wanted: dict = {}  # (input width, dtype) -> {hash of a Linear's first row: [its names]}
    for name, module in linears.items():
        by_hash = wanted.setdefault((module.in_features, module.weight.dtype), {})
        by_hash.setdefault(int(_row_hashes(module.weight[:1])[0]), []).append(name)
    resident, used = {}, set()
    for key, weight in quantized.items():
        tensor = weights.get(key)
        if tensor is None or tensor.dim() != 2 or weight.format not in ROW_FORMATS or not _plain(weight):
            continue
        by_hash = wanted.get((tensor.shape[1], tensor.dtype))
        if not by_hash:
            continue
        hashes = _row_hashes(tensor)
        hits = torch.isin(hashes, torch.tensor(list(by_hash), dtype=hashes.dtype)).nonzero().flatten().tolist()
        for start in hits:
            for name in list(by_hash.get(int(hashes[start]), ())):
                module = linears[name]
                stop = start + module.out_features
                if type(model.get_submodule(name)) is not torch.nn.Linear or stop > tensor.shape[0] \
                        or not torch.equal(tensor[start:stop], module.weight):
                    continue
                part = weight if (start, stop) == (0, tensor.shape[0]) else rows(weight, start, stop)
                if part is None:
                    continue
                model.set_submodule(name, ResidentLinear(module, part, choice))
                resident[part.format] = resident.get(part.format, 0) + 1
                used.add(key)
    return Residency(resident, len(quantized) - len(used))


def _plain(weight: QuantizedWeight) -> bool:
    """The weight is its format, layout, data and Params alone: a layer with more (an AWQ input scale) is left
    dequantized, as ResidentLinear keeps those four only."""
    return all(getattr(weight, field.name) is None for field in dataclasses.fields(weight)
               if field.name not in ("format", "layout", "qdata", "params"))


def _row_hashes(tensor) -> torch.Tensor:
    """One int64 per row from the bits of its first FINGERPRINT values: equal rows hash equal (a lookup key; each
    hit is then compared whole)."""
    head = tensor[:, :FINGERPRINT].contiguous()
    bits = head.view({1: torch.int8, 2: torch.int16, 4: torch.int32, 8: torch.int64}[head.element_size()])
    weights = torch.arange(1, bits.shape[1] + 1, dtype=torch.int64) * 1_000_003
    return (bits.to(torch.int64) * weights).sum(dim=1)


def has_resident_layers(model) -> bool:
    return any(isinstance(module, ResidentLinear) for module in model.modules())

