"""TPU Diffusers runtime: runs diffusers pipelines on TPU/CUDA/CPU. Imports nothing from ComfyUI."""

from .device import prepare_tpu_environment

# Before anything in this process starts libtpu (see device.prepare_tpu_environment).
prepare_tpu_environment()
