"""Features of one shape (runtime/features): one registry order, applied by `realise`, each undone by its remove."""

import torch

import tiny_loras
from tpu_diffusers_runtime import features
from tpu_diffusers_runtime.device import resolve_device
from tpu_diffusers_runtime.families import family_for
from tpu_diffusers_runtime.handle import PipelineHandle
from tpu_diffusers_runtime.modes import outside_inference_mode
from tpu_diffusers_runtime.pipeline_cache import PipelineCache
from tpu_diffusers_runtime.specs import CompileSpec, ExecutionMode, LoraSpec
from tpu_diffusers_runtime.tasks import SampleRequest, run_pipeline

REQUEST = SampleRequest(prompt="a cat sitting on a red chair", width=64, height=64, steps=2, seed=3)


def test_the_registry_order_puts_context_parallelism_before_placement_and_lora_before_compiling():
    assert [feature.NAME for feature in features.FEATURES] == ["context_parallel", "placement", "lora", "compilation"]


def test_lora_then_compiling_then_removing_both_gives_the_fresh_pipelines_image(tiny, tiny_dir, tmp_path):
    """A LoRA fused, the denoiser compiled, then each feature's remove in reverse order: the pipeline is the
    fresh one again, eager and with its base weights (bit for bit)."""
    base = PipelineHandle.of(source=tiny("flux1-schnell"), model_class="FluxPipeline")
    lora = tiny_loras.build(tiny_dir / "tiny-flux1-schnell", tmp_path / "lora.safetensors", seed=1)
    asked = base.replace(loras=(LoraSpec(str(lora), 1.0),), mode=ExecutionMode.COMPILED, compile=CompileSpec())
    family, cpu = family_for("FluxPipeline"), resolve_device("cpu")
    with outside_inference_mode():
        fresh = run_pipeline(features.realise(PipelineCache(), base, cpu)[0].pipe, family, REQUEST).images
        entry = features.realise(PipelineCache(), asked, cpu)[0]
        assert list(entry.states) == ["placement", "lora", "compilation"]  # applied in the registry's order
        changed = run_pipeline(entry.pipe, family, REQUEST).images
        for feature in reversed(features.FEATURES):
            if feature.NAME in entry.states:
                feature.remove(entry, entry.states.pop(feature.NAME))
        restored = run_pipeline(entry.pipe, family, REQUEST).images
    assert (changed - fresh).abs().max().item() > 1e-3
    assert all(module._compiled_call_impl is None for module in entry.pipe.transformer.modules())
    assert torch.equal(restored, fresh)
