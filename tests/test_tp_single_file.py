"""Tensor parallelism on a pipeline from single files: 2 gloo ranks, workers launched with torchrun.
Each rank reads the whole transformer file, then diffusers' enable_parallelism keeps its half."""

import torch

from tpu_diffusers_runtime.engine import Engine
from tpu_diffusers_runtime.handle import PipelineHandle
from tpu_diffusers_runtime.tasks import SampleRequest
from tpu_diffusers_runtime.specs import MeshSpec

TP_VS_SINGLE_ATOL = 1e-5  # as tests/test_tensor_parallel.py: only the all-reduce order differs


def test_two_ranks_from_single_files_give_the_single_process_image_each_holding_half(single_files):
    folder, files = single_files["flux2"]
    picked = (("transformer", str(files["transformer"])), ("text_encoder", str(files["text_encoder"])),
              ("vae", str(files["vae"])))
    handle = PipelineHandle.of(source=str(folder), model_class="Flux2Pipeline", files=picked)
    request = SampleRequest(prompt="a cat sitting on a red chair", width=64, height=64, steps=2, guidance=2.0, seed=5)
    single = Engine().generate(handle, request)
    engine = Engine()
    try:
        result = engine.generate(handle.replace(mesh=MeshSpec(chips=2)), request)
    finally:
        engine.unload()
    torch.testing.assert_close(result.images, single.images, atol=TP_VS_SINGLE_ATOL, rtol=0)
    assert result.info.world_size == 2 and result.info.sharded_fraction_per_rank == (0.5, 0.5)
    assert any("text_encoder (Mistral3ForConditionalGeneration) from a single file: whole on every rank" in note
               for note in result.info.notes), result.info.notes
