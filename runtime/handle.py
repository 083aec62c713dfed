"""PipelineHandle: the lazy, hashable description of what to run.

Nodes pass handles along graph edges and refine them (`handle.replace`); nothing is loaded until a
Sampler realises one. A handle is two values: its `LoadSpec`, everything a loaded pipeline depends on
(the cache key is derived from it, so a field added there can never be left out of the key), and the
run options (mode, compile options, mesh, LoRAs) that reuse a loaded pipeline. Changing the prompt,
seed, steps, mode or LoRAs reloads nothing.
"""

from __future__ import annotations

import dataclasses
import json

from .device import DeviceInfo
from .distributed.mesh import layout
from .specs import CompileSpec, DeviceChoice, DType, ExecutionMode, LoraSpec, MeshSpec, Placement, QuantizedWeights


@dataclasses.dataclass(frozen=True)
class LoadSpec:
    """What a loaded pipeline is made of and where it lives."""

    source: str  # absolute path of a diffusers folder, or a hub id (with `files`: where configs and tokenizers come from)
    model_class: str  # the model_index.json `_class_name` of the source, (one of a family's `model_classes`)
    # (component, absolute path of a single weights file), e.g. ComfyUI's diffusion_models/vae files; these
    # components load from their files, everything else from `source`. An all-in-one checkpoint fills several.
    files: tuple[tuple[str, str], ...] = ()
    dtype: DType = DType.AUTO
    device: DeviceChoice = DeviceChoice.AUTO
    placement: Placement = Placement.DEVICE
    # a File Loader's files: int8/fp8 layers kept quantized on the chip or dequantized on load (resident_weights.py)
    quantized_weights: QuantizedWeights = QuantizedWeights.AUTO
    # for modular blocks whose workflows load different components (ModularBlocks.partitions: a reference to video
    # workflow with a transformer of its own): the workflow whose components load; "": the first partition's. Set per
    # run from its task (plan.loaded_handle)
    workflow: str = ""

    def __post_init__(self):  # also accepts the plain values a workflow or the wire carries
        for name, choice in (("dtype", DType), ("device", DeviceChoice), ("placement", Placement),
                             ("quantized_weights", QuantizedWeights)):
            object.__setattr__(self, name, choice(getattr(self, name)))
        object.__setattr__(self, "files", tuple((str(name), str(path)) for name, path in self.files))

    def resolved_dtype(self, device: DeviceInfo) -> str:
        return device.default_dtype if self.dtype is DType.AUTO else self.dtype.value


LOAD_FIELDS = frozenset(f.name for f in dataclasses.fields(LoadSpec))


@dataclasses.dataclass(frozen=True)
class PipelineHandle:
    load: LoadSpec
    mode: ExecutionMode = ExecutionMode.EAGER
    compile: CompileSpec | None = None  # compiled mode's options; None = CompileSpec() defaults
    mesh: MeshSpec | None = None  # replicas x tensor parallelism over worker processes; None = this process
    loras: tuple[LoraSpec, ...] = ()  # fused into the loaded pipeline's weights in this order; no reload to change

    def __post_init__(self):
        object.__setattr__(self, "mode", ExecutionMode(self.mode))
        object.__setattr__(self, "loras", tuple(l if isinstance(l, LoraSpec) else LoraSpec(**l) for l in self.loras))

    @classmethod
    def of(cls, **fields) -> "PipelineHandle":
        """A handle from flat fields: those of LoadSpec go to its load spec, the rest are run options."""
        return cls(load=LoadSpec(**{k: v for k, v in fields.items() if k in LOAD_FIELDS}),
                   **{k: v for k, v in fields.items() if k not in LOAD_FIELDS})

    def replace(self, **changes) -> "PipelineHandle":
        """A copy with `changes`, each to the load spec or the run options, wherever its field lives."""
        load = {k: v for k, v in changes.items() if k in LOAD_FIELDS}
        return dataclasses.replace(self, load=dataclasses.replace(self.load, **load),
                                   **{k: v for k, v in changes.items() if k not in LOAD_FIELDS})

    # the load spec's fields, read through
    source = property(lambda self: self.load.source)
    model_class = property(lambda self: self.load.model_class)
    files = property(lambda self: self.load.files)
    dtype = property(lambda self: self.load.dtype)
    device = property(lambda self: self.load.device)
    placement = property(lambda self: self.load.placement)

    def resolved_dtype(self, device: DeviceInfo) -> str:
        return self.load.resolved_dtype(device)

    def load_key(self, device: DeviceInfo) -> tuple:
        """What a loaded pipeline depends on; two handles with equal keys share one pipeline: the load spec,
        what `auto` resolves to on this device, and a mesh's layout (distributed.mesh.layout: each rank loads
        its own TP slices, or hooks its denoisers for its CP group). Only worker ranks load a handle with a
        mesh, and they set its `chips` to their group's size first (RankWorker.generate)."""
        return self.load, self.resolved_dtype(device), device.type, self.mesh and layout(self.mesh, self.mesh.chips)

    def to_wire(self) -> dict:
        """Plain JSON data, for worker processes."""
        return json.loads(json.dumps(dataclasses.asdict(self), default=lambda v: v.value))

    @classmethod
    def from_wire(cls, data: dict) -> "PipelineHandle":
        compile_spec, mesh = data.get("compile"), data.get("mesh")
        return cls(**{**data, "load": LoadSpec(**data["load"]), "compile": compile_spec and CompileSpec(**compile_spec),
                      "mesh": mesh and MeshSpec(**mesh)})

    def describe(self) -> str:
        files = "".join(f", {name} from {path}" for name, path in self.files)
        return f"{self.model_class} from {self.source}{files} [{self.dtype}, {self.placement}]"
