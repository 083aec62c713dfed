"""PipelineHandle: the lazy, hashable description of what to run.

Nodes pass handles along graph edges and refine them with `dataclasses.replace`; nothing
is loaded until a Sampler realises one. Only `load_key` decides whether a loaded
pipeline can be reused, so changing the prompt, seed, steps or mode reloads nothing.
"""

from __future__ import annotations

import dataclasses
import json

from .device import DeviceInfo
from .specs import CompileSpec, DeviceChoice, DType, ExecutionMode, LoraSpec, MeshSpec, Placement


@dataclasses.dataclass(frozen=True)
class PipelineHandle:
    source: str  # absolute path of a diffusers folder, or a hub id (with `files`: where configs and tokenizers come from)
    pipeline_class: str  # from model_index.json, e.g. "FluxPipeline"
    dtype: DType = DType.AUTO
    device: DeviceChoice = DeviceChoice.AUTO
    mode: ExecutionMode = ExecutionMode.EAGER
    placement: Placement = Placement.DEVICE
    compile: CompileSpec | None = None  # compiled mode's options; None = CompileSpec() defaults
    mesh: MeshSpec | None = None  # tensor parallelism over worker processes; None = this process
    # (component, absolute path of a single weights file), e.g. ComfyUI's diffusion_models/vae files; these
    # components load from their files, everything else from `source`. An all-in-one checkpoint fills several.
    files: tuple[tuple[str, str], ...] = ()
    loras: tuple[LoraSpec, ...] = ()  # fused into the loaded pipeline's weights in this order; no reload to change

    def __post_init__(self):  # also accepts the plain values a workflow or the wire carries
        for name, choice in (("dtype", DType), ("device", DeviceChoice), ("mode", ExecutionMode),
                             ("placement", Placement)):
            object.__setattr__(self, name, choice(getattr(self, name)))
        object.__setattr__(self, "files", tuple((str(name), str(path)) for name, path in self.files))
        object.__setattr__(self, "loras", tuple(l if isinstance(l, LoraSpec) else LoraSpec(**l) for l in self.loras))

    def resolved_dtype(self, device: DeviceInfo) -> str:
        return device.default_dtype if self.dtype is DType.AUTO else self.dtype.value

    def load_key(self, device: DeviceInfo) -> tuple:
        """What a loaded pipeline depends on; two handles with equal keys share one pipeline."""
        sharding = self.mesh and (self.mesh.replicas, self.mesh.shard_transformer, self.mesh.shard_text_encoder)
        return (self.source, self.files, self.pipeline_class, self.resolved_dtype(device), device.type, self.placement,
                sharding)

    def to_wire(self) -> dict:
        """Plain JSON data, for worker processes (which import the runtime under another package name)."""
        return json.loads(json.dumps(dataclasses.asdict(self), default=lambda v: v.value))

    @classmethod
    def from_wire(cls, data: dict) -> "PipelineHandle":
        compile_spec, mesh = data.get("compile"), data.get("mesh")
        return cls(**{**data, "compile": compile_spec and CompileSpec(**compile_spec), "mesh": mesh and MeshSpec(**mesh)})

    def describe(self) -> str:
        files = "".join(f", {name} from {path}" for name, path in self.files)
        return f"{self.pipeline_class} from {self.source}{files} [{self.dtype}, {self.placement}]"
