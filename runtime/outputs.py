"""What a run gives back, as ComfyUI's types: each output kind adapts one pipeline call's output (and the
denoising loop's final latents) into its part of the result, and joins the calls' parts in batch order.

Kinds: decoded images (IMAGE), video frames (IMAGE, frame after frame, video after video), the alpha channel of a
family that decodes RGBA (MASK), LATENT (the family's `ComfyLatent`: what ComfyUI's own VAE Decode takes) and the
sound track of a video family that makes sound (AUDIO, `Family.sound_rate`). A task's images are what plain
diffusers returns with output_type="pt"; the LATENT is taken beside them from the last step's callback latents, so
asking for it changes nothing in the images.
"""

from __future__ import annotations

import dataclasses

IMAGES = "images"
FRAMES = "frames"
MASK = "mask"
LATENT = "latent"
AUDIO = "audio"


@dataclasses.dataclass(frozen=True)
class Outputs:
    """One run's results: each kind's ComfyUI value, None for a kind the run did not make."""

    images: object  # IMAGE: float32 CPU [B, H, W, C] in 0..1 (a video's frames, video after video)
    latent: dict | None = None  # LATENT: {"samples": float32 CPU tensor} in the family's ComfyUI format
    mask: object = None  # MASK: float32 CPU [B, H, W], 1 - the decoded alpha (`AlphaMask`); None: no alpha decoded
    # AUDIO, a video's sound track (`SoundTrack`): {"waveform": float32 CPU [B, C, T], "sample_rate": int}; None: no
    # sound made
    audio: dict | None = None


@dataclasses.dataclass(frozen=True)
class CallResult:
    """What one pipeline call left: its output, and the last step's latents when a kind needs them. Each kind
    takes its part at once, so no call's device tensors outlive it."""

    output: object
    final_latents: object
    pipe: object
    family: object


class OutputKind:
    """One thing a run returns: `take` one call's part, `join` the parts in batch order into `Outputs.<field>`."""

    name: str
    field: str
    needs_final_latents = False

    def take(self, call: CallResult):
        raise NotImplementedError

    def join(self, parts: list):
        import torch

        return (parts[0] if len(parts) == 1 else torch.cat(parts)).contiguous()


class DecodedImages(OutputKind):
    """The pipeline's decoded images ([N, C, H, W], output_type="pt") as ComfyUI's IMAGE: RGB (the alpha channel of a
    pipeline that decodes RGBA is the MASK, `AlphaMask`)."""

    name, field = IMAGES, "images"

    @staticmethod
    def pixels(output):
        return output.images

    def take(self, call: CallResult):
        import torch

        rgb = self.pixels(call.output)[:, :3]
        return rgb.permute(0, 2, 3, 1).to(device="cpu", dtype=torch.float32).clamp(0, 1)


class AlphaMask(DecodedImages):
    """The alpha channel of a pipeline that decodes RGBA (`Family.decodes_alpha`) as ComfyUI's MASK, float32 [N, H, W],
    in ComfyUI's convention: 1 - alpha, as Load Image makes a mask from a PNG's alpha and as Join Image with Alpha
    reads one (its alpha is 1 - mask). So 1 marks what is transparent (the background a background-removal prompt
    drops), Join Image with Alpha of the images and this mask is the pipeline's RGBA image, and the mask can go
    straight into an inpaint or composite node as Load Image's would."""

    name, field = MASK, "mask"

    def take(self, call: CallResult):
        import torch

        alpha = self.pixels(call.output)[:, 3]
        return (1 - alpha.to(device="cpu", dtype=torch.float32)).clamp(0, 1)


class VideoFrames(DecodedImages):
    """A video pipeline's frames ([B, F, C, H, W]) as one IMAGE batch, video after video."""

    name = FRAMES

    @staticmethod
    def pixels(output):
        return output.frames.flatten(0, 1)


class ComfyLatents(OutputKind):
    """The last step's latents in ComfyUI's LATENT format for the family (`Family.comfy_latent`)."""

    name, field = LATENT, "latent"
    needs_final_latents = True

    def take(self, call: CallResult):
        import torch

        # one copy off the device, then a few CPU ops: the accelerator runs nothing more
        latents = call.final_latents.detach().to("cpu", torch.float32)
        # the size the pipeline decoded, which may not be the one asked (a max_area pipeline picks its own)
        height, width = call.output.images.shape[-2:]
        return call.family.comfy_latent.to_comfy(call.pipe, latents, height, width)

    def join(self, parts: list):
        return {"samples": super().join(parts)}


class SoundTrack(OutputKind):
    """The sound track of a video family that makes sound (`Family.sound_rate`) as ComfyUI's AUDIO:
    {"waveform": float32 CPU [B, C, T], "sample_rate": int}, one track per video, in the videos' order (what Create
    Video, Save Audio and Preview Audio take). diffusers returns the waveform as a tensor [B, C, T] in `audio` beside
    the frames whatever output_type is asked; its rate is the loaded pipeline's (its vocoder's)."""

    name, field = AUDIO, "audio"

    def take(self, call: CallResult):
        import torch

        waveform = torch.as_tensor(call.output.audio).to(device="cpu", dtype=torch.float32)
        return {"waveform": waveform, "sample_rate": int(call.family.sound_rate(call.pipe))}

    def join(self, parts: list):
        rates = {part["sample_rate"] for part in parts}
        if len(rates) != 1:  # one pipeline makes every call's: a mix would be a bug, not a track to play
            raise ValueError(f"the calls' sound tracks have different sample rates {sorted(rates)}")
        return {"waveform": super().join([part["waveform"] for part in parts]), "sample_rate": rates.pop()}


KINDS = {kind.name: kind for kind in (DecodedImages(), VideoFrames(), AlphaMask(), ComfyLatents(), SoundTrack())}


def joined(parts: dict) -> Outputs:
    """{kind: its parts from every call, in batch order} -> each kind's value."""
    return Outputs(**{kind.field: kind.join(taken) for kind, taken in parts.items()})
