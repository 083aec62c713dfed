"""The plain choices a workflow makes, in one leaf module that imports nothing of the pack.

Nodes offer these enums as their combo options and put the specs on the handle; the runtime
modules that act on them (modes, features, distributed) import them from here, so the
handle no longer pulls in the distributed package (and it, the loader, and the handle again).
"""

from __future__ import annotations

import dataclasses
import enum
from typing import Callable

# on_progress(done, total, what[, preview]): called as work advances (loading, compiling, sampling); it may
# raise to cancel. Sampling steps pass a preview image too when the caller asked for previews.
ProgressCallback = Callable[..., None]


class Choice(str, enum.Enum):
    """A workflow choice: equal to, and printed as, the widget value it comes from."""

    def __str__(self) -> str:
        return self.value

    def __format__(self, spec: str) -> str:
        return format(self.value, spec)


class ExecutionMode(Choice):
    EAGER = "eager"  # EagerMode.DEFER_NEVER: ops dispatched one by one
    FUSED_EAGER = "fused_eager"  # EagerMode.DEFER_AND_FUSE: ops deferred and fused into graphs
    COMPILED = "compiled"  # transformer through torch.compile (backend tpu / inductor); the rest strict eager


class Placement(Choice):
    DEVICE = "device"  # the whole pipeline lives on the accelerator
    MODEL_CPU_OFFLOAD = "model_cpu_offload"  # each model moves to the accelerator only while it runs


class QuantizedWeights(Choice):
    """What a File Loader does with a file's int8 and fp8 layers (runtime/resident_weights.py)."""

    AUTO = "auto"  # kept quantized on tpu and cuda (chip memory is scarce), dequantized on load on cpu
    KEEP_QUANTIZED = "keep quantized"  # int8/fp8 data in device memory, each layer dequantized when it runs
    DEQUANTIZE = "dequantize on load"  # every weight dequantized to the dtype when read
    INT8_MATMUL = "int8 matmul (W8A8)"  # kept quantized; int8 layers multiply int8 x int8 (runtime/int8_matmul.py)

    def resolved(self, device_type: str) -> "QuantizedWeights":
        """What auto is on a device: kept quantized on tpu and cuda, where chip memory decides what fits. On cpu,
        dequantized on load: host memory is the budget there and is larger, and dequantizing every layer at
        every step would cost CPU time for nothing saved on a chip."""
        if self is not QuantizedWeights.AUTO:
            return self
        return QuantizedWeights.DEQUANTIZE if device_type == "cpu" else QuantizedWeights.KEEP_QUANTIZED

    @property
    def keeps_quantized(self) -> bool:
        return self in (QuantizedWeights.KEEP_QUANTIZED, QuantizedWeights.INT8_MATMUL)


class DType(Choice):
    AUTO = "auto"  # the device's default: bf16 on tpu/cuda, float32 on cpu
    BFLOAT16 = "bfloat16"
    FLOAT16 = "float16"
    FLOAT32 = "float32"


class DeviceChoice(Choice):
    AUTO = "auto"  # detected: tpu > cuda > cpu
    TPU = "tpu"
    CUDA = "cuda"
    CPU = "cpu"


class CompileScope(Choice):
    AUTO = "auto"  # repeated blocks under model CPU offload (when the model declares them), else whole
    WHOLE = "whole"
    REPEATED_BLOCKS = "repeated_blocks"


class Workers(Choice):
    LAUNCH_LOCAL = "launch_local"  # torchrun on this host
    ATTACH = "attach"  # workers already started with torchrun, maybe on other hosts


class LoraExpert(Choice):
    """Which denoiser a LoRA goes into, for a model with two experts (a family's `lora_targets`); every other
    model takes it into its one denoiser."""
    HIGH_NOISE = "high_noise"  # the first expert (`transformer`), the only one of other models
    LOW_NOISE = "low_noise"  # the second expert (`transformer_2`)
    BOTH = "both"  # the same LoRA into each
    # the model's transformer in the refine stage of a two-stage run only (a distilled LoRA, as ComfyUI's
    # two-stage templates apply it)
    REFINE = "refine"


@dataclasses.dataclass(frozen=True)
class CompileSpec:
    scope: CompileScope = CompileScope.AUTO
    fullgraph: bool = True
    # (width, height[, image width, image height]) compiled ahead, at first realisation
    warmup_sizes: tuple[tuple[int, ...], ...] = ()

    def __post_init__(self):  # also accepts the plain values a workflow or the wire carries
        object.__setattr__(self, "scope", CompileScope(self.scope))
        object.__setattr__(self, "warmup_sizes", tuple(tuple(size) for size in self.warmup_sizes))


@dataclasses.dataclass(frozen=True)
class MeshSpec:
    chips: int = 0  # ranks in the whole mesh (replicas x context_parallel x tp); 0 = every local chip
    replicas: int = 0  # data-parallel degree; 0 = as many as fit (see distributed.mesh.mesh_shape)
    shard_transformer: bool = True
    shard_text_encoder: bool = True  # where transformers has a TP plan for the encoder; others stay whole
    workers: Workers = Workers.LAUNCH_LOCAL
    address: str = ""  # attach: host:port of rank 0's control channel (the key: only $TPU_DIFFUSERS_CONTROL_KEY)
    # ranks per replica that split each video's tokens (sequence-parallel attention); 1 = none. Not with tp > 1.
    context_parallel: int = 1

    def __post_init__(self):
        object.__setattr__(self, "workers", Workers(self.workers))


@dataclasses.dataclass(frozen=True)
class LoraSpec:
    path: str  # absolute path of a LoRA file inside ComfyUI's models/loras
    strength: float = 1.0  # 0 leaves the base weights exactly as they are
    expert: LoraExpert = LoraExpert.HIGH_NOISE

    def __post_init__(self):
        object.__setattr__(self, "strength", float(self.strength))
        object.__setattr__(self, "expert", LoraExpert(self.expert))
