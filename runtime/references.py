"""A reference-to-video request's references (the TPU Video Reference node's chain): pictures, videos with their
frame rate and sound, and sound clips, in the order the prompt refers to them (`<Picture 1>`, `<Video 1>`,
`<Audio 1>`: numbered per kind in that order). Plain arrays and numbers, so a request carrying them travels to worker
processes as its images do (binary payloads beside JSON)."""

from __future__ import annotations

import dataclasses
import importlib.util
import math
from collections.abc import Mapping

IMAGE, VIDEO, AUDIO = "image", "video", "audio"
KINDS = (IMAGE, VIDEO, AUDIO)


@dataclasses.dataclass(frozen=True)
class Reference:
    kind: str  # IMAGE, VIDEO or AUDIO
    frames: object = None  # IMAGE: float32 [1, H, W, 3]; VIDEO: float32 [F, H, W, 3], in 0..1 (ComfyUI's IMAGE)
    fps: float = 0.0  # VIDEO: the rate its frames carry
    audio: object = None  # VIDEO (its sound, optional) or AUDIO: float32 [channels, samples]
    sample_rate: int = 0  # the rate `audio` carries

    def __post_init__(self):
        import numpy as np

        for name in ("frames", "audio"):
            value = getattr(self, name)
            if value is not None:
                if hasattr(value, "detach"):
                    value = value.detach().cpu()
                object.__setattr__(self, name, np.ascontiguousarray(np.asarray(value, dtype=np.float32)))

    def problem(self) -> str | None:
        """What makes this reference unusable, said so that it can be fixed; None when it is fine."""
        if self.kind not in KINDS:
            return f"a reference of kind {self.kind!r}: references are {', '.join(KINDS)}."
        if self.kind != AUDIO and (self.frames is None or self.frames.ndim != 4 or self.frames.shape[3] != 3
                                   or min(self.frames.shape[:3]) < 1):
            shape = None if self.frames is None else list(self.frames.shape)
            return f"a {self.kind} reference has frames of shape {shape}; it takes an RGB IMAGE [frames, H, W, 3]."
        if self.kind == VIDEO and not self.fps > 0:
            return f"a video reference has frame rate {self.fps}; give the rate its frames were made at."
        if self.kind == AUDIO and self.audio is None:
            return "an audio reference has no sound."
        if self.audio is not None and (self.audio.ndim != 2 or self.audio.shape[0] not in (1, 2)
                                       or self.audio.shape[1] < 1 or self.sample_rate < 1):
            return (f"a {self.kind} reference's sound has shape {list(self.audio.shape)} at {self.sample_rate} Hz; it "
                    "takes mono or stereo samples [channels, samples] at a positive sample rate.")
        return None

    def words(self) -> str:
        """How it is named in messages and the run's info: 'picture 64x48', 'video 30 frames at 24 fps with sound'."""
        if self.kind == AUDIO:
            return f"sound {self.audio.shape[1] / self.sample_rate:.1f} s"
        height, width = self.frames.shape[1:3]
        if self.kind == IMAGE:
            return f"picture {width}x{height}"
        sound = " with sound" if self.audio is not None else ""
        return f"video {len(self.frames)} frames of {width}x{height} at {self.fps:g} fps{sound}"

    def to_wire(self) -> tuple[dict, list]:
        """Plain JSON data and its arrays (frames, then sound), for worker processes."""
        arrays = [a for a in (self.frames, self.audio) if a is not None]
        data = {"kind": self.kind, "fps": self.fps, "sample_rate": self.sample_rate,
                "frames_shape": None if self.frames is None else list(self.frames.shape),
                "audio_shape": None if self.audio is None else list(self.audio.shape)}
        return data, arrays

    @classmethod
    def from_wire(cls, data: dict, arrays: list) -> "Reference":
        """The reference `to_wire` described; `arrays` are its payloads (as many as its shapes name), in order."""
        import numpy as np

        given = iter(arrays)
        values = {name: np.frombuffer(next(given), dtype=np.float32).reshape(data[f"{name}_shape"])
                  for name in ("frames", "audio") if data[f"{name}_shape"] is not None}
        return cls(kind=data["kind"], fps=data["fps"], sample_rate=data["sample_rate"], **values)

    @staticmethod
    def payload_count(data: dict) -> int:
        return sum(data[f"{name}_shape"] is not None for name in ("frames", "audio"))


@dataclasses.dataclass(frozen=True)
class ReferenceRule:
    """What a reference to video model reads (diffusers' rules for its blocks): how many of each kind, whether sound
    clips need a picture or a video beside them, and the rates and sizes it resamples them to, for the checks and the
    memory plan before loading."""

    most: Mapping[str, int]  # {kind: the most references of that kind}
    total: int  # the most references in all
    sound_needs_sight: bool = True  # sound clips only with a picture or a video
    # the model's sound rate: sound at another rate is resampled by diffusers with torchaudio, which must be installed
    sound_rate: int = 0
    picture_edge: int = 0  # the short edge pictures are encoded at, whatever the video's size
    canvas_edge: int = 0  # a video reference's frames go on a canvas of their own aspect with this short edge,
    canvas_pixels: int = 0  # and at most this many pixels
    fps: float = 0.0  # the rate video references are resampled to
    least_video_frames: int = 1  # the fewest frames of a video reference, at `fps`

    def encoded_sizes(self, references, frames: int) -> list[tuple[int, int, int]]:
        """(width, height, frames) each picture and video is encoded at, at most, for the memory plan: a picture at
        `picture_edge` on its short edge, a video's frames resampled to `fps` and cut to the video's `frames`, on a
        canvas of `canvas_edge` and at most `canvas_pixels`. Sound clips are left out (40 latents a second)."""
        sizes = []
        for reference in references:
            if reference.kind == AUDIO:
                continue
            count, height, width = reference.frames.shape[:3]
            if reference.kind == IMAGE:
                scale = self.picture_edge / min(width, height)
            else:
                scale = min(self.canvas_edge / min(width, height), (self.canvas_pixels / (width * height)) ** 0.5)
                count = min(frames, self.resampled_frames(reference))
            sizes.append((round(width * scale), round(height * scale), count))
        return sizes

    def resampled_frames(self, video: Reference) -> int:
        """A video reference's frames at `fps` (each held until the next one's slot, as diffusers resamples)."""
        return math.floor(len(video.frames) * self.fps / video.fps + 0.5)

    def problem(self, references, model: str) -> str | None:
        """What makes these references unreadable for `model`, said so that it can be fixed; None when they are fine."""
        kinds = [reference.kind for reference in references]
        for kind in KINDS:
            if kinds.count(kind) > self.most.get(kind, 0):
                return (f"{model} reads at most {self.most.get(kind, 0)} {kind} references; {kinds.count(kind)} are "
                        "connected. Remove some TPU Video Reference nodes (or images of a batch).")
        if len(kinds) > self.total:
            return f"{model} reads at most {self.total} references in all; {len(kinds)} are connected."
        if self.sound_needs_sight and kinds and set(kinds) == {AUDIO}:
            return (f"{model} takes sound references only beside a picture or a video reference; add one to the TPU "
                    "Video Reference chain.")
        short = next((r for r in references
                      if r.kind == VIDEO and r.fps > 0 and self.resampled_frames(r) < self.least_video_frames), None)
        if short is not None:
            return (f"a video reference of {len(short.frames)} frames at {short.fps:g} fps is too short: {model} reads "
                    f"at least {self.least_video_frames} frames at {self.fps:g} fps "
                    f"({self.least_video_frames / self.fps:.2f} s). Use a longer clip.")
        rates = sorted({r.sample_rate for r in references if r.audio is not None and r.sample_rate != self.sound_rate})
        if rates and importlib.util.find_spec("torchaudio") is None:
            return (f"a sound reference at {', '.join(map(str, rates))} Hz: {model} resamples sound to "
                    f"{self.sound_rate} Hz with torchaudio, which is not installed. Install torchaudio (pip install "
                    f"torchaudio, matching your torch), or resample the sound to {self.sound_rate} Hz first.")
        return None
