"""Text to image: a prompt in, a batch of images out."""

from __future__ import annotations

from ..families import TEXT2IMAGE, Family
from .base import SampleRequest, Task, generators


class Text2Image(Task):
    name = TEXT2IMAGE

    def pipeline_kwargs(self, family: Family, request: SampleRequest) -> dict:
        kwargs = dict(
            prompt=request.prompt,
            height=request.height,
            width=request.width,
            num_inference_steps=request.steps,
            generator=generators(request),
            num_images_per_prompt=request.batch_size,
            output_type="pt",
        )
        kwargs[family.guidance_kwarg] = request.guidance
        if family.takes_negative_prompt:
            # diffusers runs QwenImage's true CFG only when a negative prompt is given; " " is its own default.
            kwargs["negative_prompt"] = request.negative_prompt or " "
        return kwargs

    def output(self, pipeline_output):
        """A float32 CPU tensor [B, H, W, C] in 0..1 (ComfyUI's IMAGE) from diffusers' [B, C, H, W]."""
        import torch

        images = pipeline_output.images
        return images.permute(0, 2, 3, 1).to(device="cpu", dtype=torch.float32).clamp(0, 1).contiguous()

    def host_bytes(self, request: SampleRequest) -> int:
        """The pipeline's float32 output and the IMAGE tensor made from it: 2 x 4 bytes per value."""
        return 2 * 4 * 3 * request.width * request.height * request.batch_size
