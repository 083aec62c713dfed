"""ComfyUI's quantized weight formats, read through comfy-kitchen (ComfyUI's own kernel library).

A quantized layer in a ComfyUI file is `<layer>.weight` (the packed data), its scales (`weight_scale`,
`weight_scale_2`, ...) and `<layer>.comfy_quant` (the format as JSON). comfy-kitchen's layout class for the
format knows how to turn those into the weight (`Layout.dequantize(qdata, params)`, its eager backend is
plain torch), so the math lives there, not here.
"""

from __future__ import annotations

import dataclasses


@dataclasses.dataclass(frozen=True)
class QuantizedWeight:
    """One layer's weight as its file stores it: the format's name in the file, comfy-kitchen's layout class
    for it, the packed data and the layout's Params (scales, group sizes, the original shape and dtype)."""

    format: str
    layout: str
    qdata: object  # torch.Tensor
    params: object  # the layout's Params dataclass

    def dequantize(self, dtype):
        """The weight in `dtype`, computed by comfy-kitchen's layout (the same function on every path, so the
        weights a model gets on load and the ones a resident layer computes per step are equal bit for bit)."""
        from comfy_kitchen.tensor import get_layout_class

        return get_layout_class(self.layout).dequantize(self.qdata, self.params).to(dtype)

    @property
    def nbytes(self) -> int:
        """Bytes the layer takes while it stays quantized: the packed data and every tensor of its Params."""
        import torch

        tensors = [self.qdata, *(v for v in vars(self.params).values() if isinstance(v, torch.Tensor))]
        return sum(t.numel() * t.element_size() for t in tensors)
