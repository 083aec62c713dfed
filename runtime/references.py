"""A reference-to-video request's references (the TPU Video Reference node's chain): pictures, videos with their
frame rate and sound, and sound clips, in the order the prompt refers to them (`<Picture 1>`, `<Video 1>`,
`<Audio 1>`: numbered per kind in that order). Plain arrays and numbers, so a request carrying them travels to worker
processes as its images do (binary payloads beside JSON)."""

from __future__ import annotations

import dataclasses

from .families.base import AUDIO, IMAGE, KINDS, VIDEO


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
