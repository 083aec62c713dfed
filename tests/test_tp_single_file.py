"""Tensor parallelism on a pipeline from single files: 2 gloo ranks, workers launched with torchrun.
Each rank reads the whole transformer file, then diffusers' enable_parallelism keeps its half."""

import torch

from tpu_diffusers_runtime.distributed.sharding import local_bytes
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


def test_wan22_a14b_from_its_expert_files_on_two_ranks_shards_both_experts_and_gives_the_single_process_frames(
        single_files):
    """Wan 2.2 T2V A14B from ComfyUI's files (`transformer`, the File Loader's `model_2` as `transformer_2`, umt5,
    the VAE): each rank reads both expert files whole, then the family's TP plan keeps half of each planned weight.
    3 steps cross the boundary, so both experts run sharded."""
    from test_tensor_parallel import planned_bytes

    folder, files = single_files["wan22-t2v-a14b"]
    picked = tuple((name, str(files[name])) for name in ("transformer", "transformer_2", "text_encoder", "vae"))
    handle = PipelineHandle.of(source=str(folder), model_class="WanPipeline", files=picked)
    video = SampleRequest(prompt="a cat sitting on a red chair", width=64, height=64, steps=3, guidance=2.0, seed=5,
                          frames=5)
    single_engine = Engine(distribute=False)
    single = single_engine.generate(handle, video)
    pipe = single_engine.realise(handle)[0].pipe
    # what each rank holds when both experts are sharded: everything, less half of each planned weight
    experts = (pipe.transformer, pipe.transformer_2)
    expected = sum(local_bytes(expert) - planned_bytes(expert) // 2 for expert in experts)
    engine = Engine()
    try:
        result = engine.generate(handle.replace(mesh=MeshSpec(chips=2)), video)
    finally:
        engine.unload()
    torch.testing.assert_close(result.images, single.images, atol=TP_VS_SINGLE_ATOL, rtol=0)
    assert result.images.shape == (5, 64, 64, 3) and result.info.world_size == 2
    assert result.info.sharded_fraction_per_rank == (0.5, 0.5)
    assert result.info.transformer_bytes_per_rank == (expected, expected)  # a whole transformer_2 would add ~8%
