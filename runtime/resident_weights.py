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

from .quant_formats import QuantizedWeight
from .specs import QuantizedWeights

FINGERPRINT = 8  # leading values of a row that find where a Linear's rows start in a file layer
# The formats kept quantized: one scale per tensor (fp8, int8) or per output row (int8, also with ConvRot, whose
# rotation mixes input channels only), so a block of rows is the same block of the data and of the scales.
ROW_FORMATS = ("int8_tensorwise", "float8_e4m3fn", "float8_e5m2")
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
    has its dtype: a later `.to(dtype)` would cast the fp8 data and the float32 scales too."""
    by_width: dict = {}  # (input width, dtype) -> [(file key, dequantized tensor, its rows' first values, weight)]
    for key, weight in quantized.items():
        tensor = weights.get(key)
        if tensor is not None and tensor.dim() == 2 and weight.format in ROW_FORMATS and _plain(weight):
            by_width.setdefault((tensor.shape[1], tensor.dtype), []).append(
                (key, tensor, tensor[:, :FINGERPRINT], weight))
    resident, used = {}, set()
    for name, module in list(model.named_modules()):
        if type(module) is not torch.nn.Linear:
            continue
        found = _find(module.weight, by_width.get((module.in_features, module.weight.dtype), ()))
        if found is None:
            continue
        key, part = found
        model.set_submodule(name, ResidentLinear(module, part, choice))
        resident[part.format] = resident.get(part.format, 0) + 1
        used.add(key)
    return Residency(resident, len(quantized) - len(used))


def _plain(weight: QuantizedWeight) -> bool:
    """The weight is its format, layout, data and Params alone: a layer with more (an AWQ input scale) is left
    dequantized, as ResidentLinear keeps those four only."""
    return all(getattr(weight, field.name) is None for field in dataclasses.fields(weight)
               if field.name not in ("format", "layout", "qdata", "params"))


def _find(param, candidates) -> tuple[str, QuantizedWeight] | None:
    """(file key, the quantized weight of `param`): the file layer whose rows [start, start + rows of `param`)
    equal `param` exactly (the whole layer, or a converter's chunk or split of it); rows are found by their
    first FINGERPRINT values, then compared whole. None when no file layer holds it."""
    rows_wanted = param.shape[0]
    for key, tensor, fingerprints, weight in candidates:
        if tensor.shape[0] < rows_wanted:
            continue
        starts = (fingerprints[: tensor.shape[0] - rows_wanted + 1] == param[0, :FINGERPRINT]).all(dim=1)
        for start in starts.nonzero().flatten().tolist():
            if torch.equal(tensor[start:start + rows_wanted], param):
                if rows_wanted == tensor.shape[0]:
                    return key, weight
                part = rows(weight, start, start + rows_wanted)
                if part is not None:
                    return key, part
    return None


def has_resident_layers(model) -> bool:
    return any(isinstance(module, ResidentLinear) for module in model.modules())

