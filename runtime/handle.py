"""PipelineHandle: the lazy, hashable description of what to run.

Nodes pass handles along graph edges and refine them with `dataclasses.replace`; nothing
is loaded until a Sampler realises one. Only `load_key` decides whether a loaded
pipeline can be reused, so changing the prompt, seed, steps or mode reloads nothing.
"""

from __future__ import annotations

import dataclasses
import json

from .compile_cache import CompileSpec
from .device import DeviceInfo
from .distributed.mesh import MeshSpec
from .modes import ExecutionMode, Placement

DTYPES = ("auto", "bfloat16", "float16", "float32")


@dataclasses.dataclass(frozen=True)
class PipelineHandle:
    source: str  # absolute path of a diffusers folder, or a hub id
    pipeline_class: str  # from model_index.json, e.g. "FluxPipeline"
    dtype: str = "auto"  # "auto" = the device's default (bf16 on tpu/cuda, float32 on cpu)
    device: str = "auto"  # "auto" = detected (tpu > cuda > cpu)
    mode: ExecutionMode = ExecutionMode.EAGER
    placement: Placement = Placement.DEVICE
    compile: CompileSpec | None = None  # compiled mode's options; None = CompileSpec() defaults
    mesh: MeshSpec | None = None  # tensor parallelism over worker processes; None = this process

    def resolved_dtype(self, device: DeviceInfo) -> str:
        return device.default_dtype if self.dtype == "auto" else self.dtype

    def load_key(self, device: DeviceInfo) -> tuple:
        """What a loaded pipeline depends on; two handles with equal keys share one pipeline."""
        sharding = self.mesh and (self.mesh.shard_transformer, self.mesh.shard_text_encoder)
        return (self.source, self.pipeline_class, self.resolved_dtype(device), device.type, self.placement, sharding)

    def to_wire(self) -> dict:
        """Plain JSON data, for worker processes (which import the runtime under another package name)."""
        return json.loads(json.dumps(dataclasses.asdict(self), default=lambda v: v.value))

    @classmethod
    def from_wire(cls, data: dict) -> "PipelineHandle":
        compile_spec = data.get("compile")
        if compile_spec:
            compile_spec = CompileSpec(**{**compile_spec, "warmup_sizes": tuple(map(tuple, compile_spec["warmup_sizes"]))})
        mesh = data.get("mesh")
        return cls(**{**data, "mode": ExecutionMode(data["mode"]), "placement": Placement(data["placement"]),
                      "compile": compile_spec, "mesh": mesh and MeshSpec(**mesh)})

    def describe(self) -> str:
        return f"{self.pipeline_class} from {self.source} [{self.dtype}, {self.placement.value}]"
