"""Live previews: the denoising loop's latents as a small RGB image, once per step.

The map is linear, as ComfyUI's own "latent2rgb" previews: one (R, G, B) row per latent channel
plus a bias, applied to the family's image-shaped latent (`Family.latent_grid`). The factors come
from the caller (the ComfyUI node reads them from ComfyUI's latent formats), so the runtime holds no
copy of them and a worker process gets them as plain JSON.
"""

from __future__ import annotations

import dataclasses
import logging

from .families import Family

log = logging.getLogger("tpu_diffusers")


@dataclasses.dataclass(frozen=True)
class PreviewSpec:
    """ComfyUI's latent_rgb_factors (one R, G, B row per latent channel) and latent_rgb_factors_bias."""

    factors: tuple[tuple[float, float, float], ...]
    bias: tuple[float, float, float] | None = None

    def to_wire(self) -> dict:
        return dataclasses.asdict(self)

    @classmethod
    def from_wire(cls, data: dict) -> "PreviewSpec":
        bias = data["bias"]
        return cls(factors=tuple(tuple(row) for row in data["factors"]), bias=bias and tuple(bias))


class Previewer:
    """Turns one step's latents into an RGB uint8 array (h, w, 3) at latent resolution (1/8 of the image, 1/16 for a
    16x VAE); the first image of a batch, as ComfyUI previews."""

    def __init__(self, spec: PreviewSpec, pipe, family: Family, height: int, width: int):
        import torch

        self.pipe, self.family, self.height, self.width = pipe, family, height, width
        self.factors = torch.tensor(spec.factors, dtype=torch.float32)  # (C, 3)
        self.bias = None if spec.bias is None else torch.tensor(spec.bias, dtype=torch.float32)
        self.enabled = True

    def __call__(self, latents):
        """The preview image, or None when the factors do not fit this model's latent channels (logged once)."""
        import torch

        if not self.enabled:
            return None
        # One small copy off the device (the first image's latents); the rest is a few CPU ops, so the
        # accelerator runs no extra kernels and compiles nothing for previews.
        first = latents[:1].detach().to("cpu", torch.float32)
        grid = self.family.latent_grid(self.pipe, first, self.height, self.width)[0]  # (C, h, w)
        if grid.shape[0] != self.factors.shape[0]:
            log.warning("TPU Diffusers: no previews: the %s latent has %d channels, the preview factors %d",
                        self.family.name, grid.shape[0], self.factors.shape[0])
            self.enabled = False
            return None
        rgb = grid.movedim(0, -1) @ self.factors
        if self.bias is not None:
            rgb += self.bias
        # -1..1 to 0..255, as ComfyUI's preview_to_image
        return rgb.add(1).mul(127.5).clamp(0, 255).round().to(torch.uint8).numpy()
