"""The modular pipeline kind on two tensor-parallel ranks (CPU mesh, gloo, torchrun workers): the workers load the
same sharded components into the family's modular blocks and give the single-process classic image."""

import torch

from tpu_diffusers_runtime.engine import Engine
from tpu_diffusers_runtime.handle import PipelineHandle
from tpu_diffusers_runtime.loading import inspect_source
from tpu_diffusers_runtime.specs import MeshSpec
from tpu_diffusers_runtime.tasks import SampleRequest

TP_VS_SINGLE_ATOL = 1e-5  # as in test_tensor_parallel.py: only the all-reduce order differs


def test_two_ranks_run_the_modular_kind_and_give_the_single_process_classic_image(tiny, monkeypatch):
    folder = tiny("flux1-schnell")
    request = SampleRequest(prompt="a cat sitting on a red chair", width=64, height=64, steps=2, seed=11)
    single = Engine(distribute=False).generate(PipelineHandle.of(source=folder, model_class=inspect_source(folder)),
                                               request)
    monkeypatch.setenv("TPU_DIFFUSERS_PIPELINE_KIND", "modular")  # the workers start with this environment
    engine = Engine()
    try:
        result = engine.generate(PipelineHandle.of(source=folder, model_class=inspect_source(folder),
                                                   mesh=MeshSpec(chips=2)), request)
    finally:
        engine.unload()
    assert single.info.pipeline == "FluxPipeline" and result.info.pipeline == "FluxModularPipeline"
    assert result.info.world_size == 2 and result.info.sharded_fraction_per_rank == (0.5, 0.5)
    torch.testing.assert_close(result.images, single.images, atol=TP_VS_SINGLE_ATOL, rtol=0)
