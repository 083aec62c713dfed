"""What one run did (RunInfo), for the node's info output and the log, and what it made (Generation).

A worker group's rank 0 sends its RunInfo as JSON, where tuples arrive as lists: `RunInfo.from_wire` turns
them back as the dataclass's field types say, so a new tuple field needs no list of names to keep.
"""

from __future__ import annotations

import dataclasses
import typing

@dataclasses.dataclass(frozen=True)
class RunInfo:
    """What actually happened in one run, for the node's info output and the log."""

    device: str
    mode: str  # the mode that ran, which may differ from the one asked for
    task: str  # e.g. text2image
    pipeline: str  # the diffusers class that ran
    placement: str
    loaded: bool  # False when the pipeline came from the cache
    load_seconds: float
    sample_seconds: float
    peak_device_memory_mb: float | None = None  # None on cpu, where the process RSS is the measure
    compiled_now: bool | None = None  # None when not in compiled mode
    compile_seconds: float = 0.0  # dynamo's compile time in this run (warm-up included)
    world_size: int = 1  # ranks that ran it (tensor parallelism)
    transformer_bytes_per_rank: tuple[int, ...] = ()  # weight bytes each rank holds (tensor parallelism)
    sharded_fraction_per_rank: tuple[float, ...] = ()  # share of the sharded weights each rank holds
    worker_pids: tuple[int, ...] = ()  # the worker group's launcher process (tensor parallelism, local launch)
    mesh_shape: tuple[int, ...] = ()  # (replicas, cp, tp) of a worker group, as its ranks resolved the mesh
    context_parallel: int = 1  # ranks per replica that split each video's tokens (the mesh's cp)
    tokens_per_rank: tuple[int, ...] = ()  # latent tokens each rank's transformer runs (1/cp of them under CP)
    image_bytes_per_rank: tuple[int, ...] = ()  # image bytes each rank gave rank 0 (a replica's first rank only)
    replica_images: tuple[int, ...] = ()  # images each replica made, in batch order
    replica_sample_seconds: tuple[float, ...] = ()
    replica_step_seconds: tuple[float, ...] = ()  # each replica's sampling seconds per step
    replica_compile_seconds: tuple[float, ...] = ()  # each replica's compile time (the compile cache may share it)
    replica_ranks: tuple[tuple[int, ...], ...] = ()  # the ranks of each replica (its TP group)
    grad_mode: str = ""  # seen inside the denoising loop: TorchTPU cannot compile under inference mode
    compile_cache: dict = dataclasses.field(default_factory=dict)  # compilation.cache_folders()
    compile_cache_lookups: dict = dataclasses.field(default_factory=dict)  # this run's; compilation.cache_lookups()
    frames: int = 0  # video: frames per video (the images output holds batch x frames of them)
    fps: float = 0.0  # video: the model's frame rate
    sample_rate: int = 0  # video with sound: its sound track's sample rate (Hz); 0: no sound made
    audio_seconds: float = 0.0  # ... and each video's track's length
    notes: tuple[str, ...] = ()

    def as_dict(self) -> dict:
        return dataclasses.asdict(self)

    @classmethod
    def from_wire(cls, data: dict) -> "RunInfo":
        """A RunInfo from its JSON form (`as_dict` sent over the protocol): keys it has no field for are left out,
        and lists become tuples (of tuples) where the field's type is a tuple."""
        types = typing.get_type_hints(cls)
        return cls(**{field.name: _as_type(data[field.name], types[field.name])
                      for field in dataclasses.fields(cls) if field.name in data})

    def summary(self) -> str:
        load = f"loaded in {self.load_seconds:.1f}s" if self.loaded else "reused loaded pipeline"
        lines = [f"device: {self.device}", f"task: {self.task} ({self.pipeline})", f"mode: {self.mode}",
                 f"placement: {self.placement}",
                 f"pipeline: {load}", f"sampling: {self.sample_seconds:.2f}s ({self.grad_mode})", *self.notes]
        if self.frames:
            sound = (f", sound {self.audio_seconds:.2f}s at {self.sample_rate} Hz" if self.sample_rate
                     else ", no sound")
            lines.insert(2, f"video: {self.frames} frames at {self.fps:g} fps{sound}")
        if self.mesh_shape and self.world_size > 1:
            replicas, cp, tp = self.mesh_shape
            parallel = f"{cp} CP" if cp > 1 else f"{tp} TP"
            lines.append(f"mesh: {replicas} replica(s) x {parallel}; " + ", ".join(
                f"replica {i} ranks {list(ranks)}: {images} image(s), {step:.3f}s/step" for i, (ranks, images, step)
                in enumerate(zip(self.replica_ranks, self.replica_images, self.replica_step_seconds))))
        if self.compile_cache and (self.compiled_now is not None or self.device == "tpu"):
            cache = self.compile_cache
            tpu = f", TorchTPU tier 3 {cache['tpu_tier3']}" if self.device == "tpu" else ""
            lines.append(f"compile cache: inductor {cache['inductor']}{tpu} (settings applied: {cache['applied']})")
        if any(self.compile_cache_lookups.values()):
            lines.append("compile cache lookups: " + ", ".join(f"{name} {count}" for name, count
                                                                in self.compile_cache_lookups.items()))
        return "\n".join(lines)


@dataclasses.dataclass(frozen=True)
class Generation:
    images: object  # torch.Tensor [B, H, W, C] float32 in 0..1
    info: RunInfo
    latent: dict | None = None  # ComfyUI's LATENT of the images (outputs.Outputs.latent); None for video
    mask: object = None  # ComfyUI's MASK of the images' alpha (outputs.Outputs.mask); None: the model decodes no alpha
    audio: dict | None = None  # ComfyUI's AUDIO of a video's sound (outputs.Outputs.audio); None: the model makes none


def _as_type(value, annotation):
    """`value` from JSON as `annotation` holds it: a list as a tuple for a tuple type, its items likewise."""
    if typing.get_origin(annotation) is not tuple or value is None:
        return value
    items = typing.get_args(annotation)
    item_type = items[0] if items else None
    return tuple(_as_type(item, item_type) for item in value)
