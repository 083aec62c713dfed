import dataclasses

import pytest
import torch

from tpu_diffusers_runtime import features
from tpu_diffusers_runtime.device import device_info, resolve_device
from tpu_diffusers_runtime.engine import Engine
from tpu_diffusers_runtime.errors import UserInputError
from tpu_diffusers_runtime.families import FAMILIES
from tpu_diffusers_runtime.handle import PipelineHandle
from tpu_diffusers_runtime.loading import inspect_source
from tpu_diffusers_runtime.pipeline_cache import PipelineCache
from tpu_diffusers_runtime.specs import ExecutionMode, Placement
from tpu_diffusers_runtime.tasks import SampleRequest

SAMPLE_SIZE = 64  # small, and a multiple of 16 as every family needs
FAMILY_FOLDERS = ["flux1-schnell", "flux1-dev", "sd3", "flux2", "qwenimage", "flux2-klein", "sdxl", "zimage",
                  "qwenimage21", "krea2", "flux3", "flux3-distilled"]


def request(**overrides):
    values = dict(prompt="a cat sitting on a red chair", width=SAMPLE_SIZE, height=SAMPLE_SIZE, steps=2,
                  guidance=3.5, seed=7)
    return SampleRequest(**{**values, **overrides})


@pytest.fixture
def handle_for(tiny):
    def make(name, **fields):
        source = tiny(name)
        return PipelineHandle.of(source=source, model_class=inspect_source(source), **fields)
    return make


@pytest.mark.parametrize("placement", list(Placement))
@pytest.mark.parametrize("name", FAMILY_FOLDERS)
def test_every_family_loads_and_samples(handle_for, name, placement):
    engine = Engine()
    handle = handle_for(name, placement=placement)
    result = engine.generate(handle, request(width=96, height=64, negative_prompt="blurry"))
    images = result.images
    assert images.shape == (1, 64, 96, 3) and images.dtype == torch.float32
    assert torch.isfinite(images).all() and 0 <= images.min() and images.max() <= 1
    assert images.std() > 0  # not a constant image
    device = resolve_device(handle.device)
    assert result.info.loaded and result.info.device == device.type and result.info.mode == "eager"
    # diffusers' own notion of where the pipeline runs (the offload hooks' device under model CPU offload)
    assert engine.realise(handle)[0].pipe._execution_device.type == device.type


def test_same_seed_same_image_different_seed_different_image(handle_for):
    engine = Engine()
    handle = handle_for("flux1-schnell")
    a = engine.generate(handle, request(seed=1)).images
    b = engine.generate(handle, request(seed=1)).images
    c = engine.generate(handle, request(seed=2)).images
    assert torch.equal(a, b)
    assert (a - c).abs().max() > 1e-3


def test_batch_image_i_is_the_image_of_seed_plus_i(handle_for):
    engine = Engine()
    handle = handle_for("sd3")
    batch = engine.generate(handle, request(seed=10, batch_size=2)).images
    second = engine.generate(handle, request(seed=11)).images
    assert batch.shape[0] == 2
    torch.testing.assert_close(batch[1:], second, atol=1e-5, rtol=0)


def test_second_run_of_the_same_spec_loads_nothing(handle_for):
    engine = Engine()
    handle = handle_for("flux2")
    first = engine.generate(handle, request())
    second = engine.generate(handle, request(prompt="another prompt", seed=3, steps=3))
    assert first.info.loaded and not second.info.loaded
    assert engine.cache.stats.loads == 1


@pytest.mark.parametrize("mode", [ExecutionMode.EAGER, ExecutionMode.FUSED_EAGER])
@pytest.mark.parametrize("placement", list(Placement))
def test_modes_and_placements_run_and_give_the_same_image(handle_for, mode, placement):
    engine = Engine()
    reference = engine.generate(handle_for("flux1-schnell"), request()).images
    result = engine.generate(handle_for("flux1-schnell", mode=mode, placement=placement), request())
    torch.testing.assert_close(result.images, reference, atol=1e-5, rtol=0)
    assert result.info.placement == placement.value
    if mode is ExecutionMode.FUSED_EAGER:  # no fused eager on cpu: said, not hidden
        assert result.info.mode.startswith("eager (fused eager needs TorchTPU")


def test_the_pipeline_is_placed_on_the_device_it_is_given(handle_for):
    """On a device that is not cpu, so that this can fail on a CPU-only host: torch's meta device stands
    in for a chip (nothing runs; where the weights are is what is checked)."""
    chip = dataclasses.replace(device_info("cpu"), type="meta")
    pipe = features.realise(PipelineCache(), handle_for("flux1-schnell"), chip)[0].pipe
    models = [pipe.transformer, pipe.vae, pipe.text_encoder, pipe.text_encoder_2]
    assert {p.device.type for model in models for p in model.parameters()} == {"meta"}


def test_model_offload_runs_on_the_resolved_device_and_keeps_weights_on_cpu_between_runs(handle_for):
    engine = Engine()
    handle = handle_for("flux1-schnell", placement=Placement.MODEL_CPU_OFFLOAD)
    engine.generate(handle, request())
    pipe = engine.realise(handle)[0].pipe
    assert getattr(pipe.transformer, "_hf_hook", None) is not None  # accelerate's offload hook is installed
    assert pipe._execution_device.type == resolve_device(handle.device).type  # where the hooks run each model
    assert pipe.transformer.device.type == "cpu"  # where it rests between runs


def test_progress_reports_every_step_and_cancel_stops_within_one_step(handle_for):
    engine = Engine()
    handle = handle_for("flux1-schnell")
    engine.realise(handle)
    steps_seen = []

    class Cancelled(Exception):
        pass

    def cancel_at_step_3(done, total, what):
        if what == "sampling":
            steps_seen.append(done)
            if done == 3:
                raise Cancelled

    with pytest.raises(Cancelled):
        engine.generate(handle, request(steps=50), on_progress=cancel_at_step_3)
    assert steps_seen == [1, 2, 3]
    full = []
    engine.generate(handle, request(steps=4), on_progress=lambda d, t, w: full.append((d, t)))
    assert full == [(1, 4), (2, 4), (3, 4), (4, 4)]


@pytest.mark.parametrize("name, overrides, message", [
    ("flux1-schnell", dict(width=1000), r"width 1000 cannot be used with FLUX.1: it must be a multiple of 16. "
                                        r"Nearest valid widths: 992 or 1008"),
    ("flux1-schnell", dict(height=8), r"height 8 .* Nearest valid heights: 16 or 32"),
    ("flux1-schnell", dict(steps=0), r"steps is 0; at least 1"),
    ("flux1-schnell", dict(prompt="   "), r"FLUX.1 needs a prompt"),
    ("flux1-schnell", dict(batch_size=0), r"batch size is 0"),
    # a multiple of 16 (what a queued prompt is checked against), not of Qwen-Image 2.1's 32
    ("qwenimage21", dict(width=80), r"width 80 cannot be used with Qwen-Image 2.1: it must be a multiple of 32. "
                                    r"Nearest valid widths: 64 or 96"),
])
def test_bad_requests_fail_before_loading_with_what_to_fix(handle_for, name, overrides, message):
    engine = Engine()
    with pytest.raises(UserInputError, match=message):
        engine.generate(handle_for(name), request(**overrides))
    assert engine.cache.stats.loads == 0


def test_negative_prompt_for_a_family_without_one_is_noted_not_silently_dropped(handle_for):
    result = Engine().generate(handle_for("flux1-schnell"), request(negative_prompt="blurry"))
    assert "negative prompt ignored: FLUX.1 (FluxPipeline) takes none" in result.info.summary()


def test_the_family_table_covers_every_supported_pipeline():
    assert {family.base_class for family in FAMILIES} == {"FluxPipeline", "StableDiffusion3Pipeline", "Flux2Pipeline",
                                                          "QwenImagePipeline", "Flux2KleinPipeline",
                                                          "StableDiffusionXLPipeline", "ZImagePipeline", "WanPipeline",
                                                          "QwenImage21Pipeline", "Krea2Pipeline",
                                                          "Flux3ModularPipeline", "LTX2Pipeline",
                                                          "MiniMaxH3ModularPipeline"}


@pytest.mark.parametrize("dtype", ["bfloat16", "float16"])
def test_sdxl_in_half_precision_equals_plain_diffusers(handle_for, dtype):
    """SDXL's VAE overflows in fp16: its config's force_upcast makes diffusers decode in float32 then, and ours
    is diffusers' own pipeline, so the image is plain diffusers' bit for bit. The reference's models are frozen as
    ours are (loading.py): CPU fp16 kernels for parameters that require grad round differently (measured up to
    2e-3 on the image, even under inference_mode)."""
    from diffusers import StableDiffusionXLPipeline

    handle = handle_for("sdxl", dtype=dtype, device="cpu")
    ours = Engine(distribute=False).generate(handle, request(guidance=5.0)).images
    pipe = StableDiffusionXLPipeline.from_pretrained(handle.source, dtype=getattr(torch, dtype), local_files_only=True)
    assert pipe.vae.config.force_upcast
    for model in (pipe.unet, pipe.vae, pipe.text_encoder, pipe.text_encoder_2):
        model.requires_grad_(False)
    with torch.inference_mode():
        plain = pipe(prompt=request().prompt, negative_prompt=" ", height=SAMPLE_SIZE, width=SAMPLE_SIZE,
                     num_inference_steps=2, guidance_scale=5.0, generator=torch.Generator("cpu").manual_seed(7),
                     output_type="pt").images.permute(0, 2, 3, 1)
    assert torch.isfinite(ours).all()
    assert torch.equal(ours, plain.float())


def test_a_request_too_large_for_host_memory_is_refused_before_anything_is_allocated(handle_for):
    from tpu_diffusers_runtime import tasks as sampling

    TEXT2IMAGE = sampling.TASKS["text2image"]

    big = request(width=8192, height=8192, batch_size=64)
    with pytest.raises(UserInputError, match=r"batch 64 at 8192x8192 is too large for this machine's memory: the "
                                             r"images alone need 96\.0 GiB and 8\.0 GiB are available"):
        sampling.check_host_memory(TEXT2IMAGE, big, available=8 * 2**30)
    sampling.check_host_memory(TEXT2IMAGE, request(), available=8 * 2**30)  # a normal request passes
    sampling.check_host_memory(TEXT2IMAGE, big, available=None)  # unknown (not Linux): no guess
    engine = Engine()
    with pytest.raises(UserInputError, match="too large for this machine's memory"):
        engine.generate(handle_for("flux1-schnell"), request(width=8192, height=8192, batch_size=4096))
    assert engine.cache.stats.loads == 0
