"""Live previews in the runtime: one latent-to-RGB image per step, of the latent's size, for every family."""

import json

import numpy as np
import pytest
import torch

from tpu_diffusers_runtime.engine import Engine
from tpu_diffusers_runtime.families import family_for
from tpu_diffusers_runtime.handle import PipelineHandle
from tpu_diffusers_runtime.loading import inspect_source
from tpu_diffusers_runtime.preview import Previewer, PreviewSpec
from tpu_diffusers_runtime.tasks import SampleRequest
from tpu_diffusers_runtime.specs import MeshSpec

# The latent channels ComfyUI's factors are for (the tiny models have the real VAEs' channel counts).
CHANNELS = {"flux1-schnell": 16, "sd3": 16, "flux2": 32, "qwenimage": 16, "flux2-klein": 32, "zimage": 16, "sdxl": 4,
            "krea2": 16, "qwenimage21": 64, "flux3": 32}
FACTORS = {"qwenimage21": 16}  # pixels per latent pixel where not 8 (its 16x VAE)


def spec(channels: int, seed: int = 0) -> PreviewSpec:
    rows = torch.randn(channels, 3, generator=torch.Generator().manual_seed(seed)) * 0.2
    return PreviewSpec(factors=tuple(tuple(row) for row in rows.tolist()), bias=(0.1, -0.1, 0.0))


def run(tiny, name, preview, steps=3, engine=None):
    source = tiny(name)
    handle = PipelineHandle.of(source=source, model_class=inspect_source(source))
    calls = []
    (engine or Engine()).generate(
        handle, SampleRequest(prompt="a cat", width=96, height=64, steps=steps, guidance=2.0, seed=3,
                              negative_prompt="blurry"),
        on_progress=lambda done, total, what, *image: calls.append((done, what, *image)), preview=preview)
    return [call for call in calls if call[1] == "sampling"]


@pytest.mark.parametrize("name", list(CHANNELS))
def test_each_family_sends_a_preview_per_step_at_latent_resolution(tiny, name):
    steps = run(tiny, name, spec(CHANNELS[name]))
    assert [done for done, *_ in steps] == [1, 2, 3]
    images = [image for _, _, image in steps]
    for image in images:
        factor = FACTORS.get(name, 8)  # H/8 x W/8, as ComfyUI's (Qwen-Image 2.1: /16)
        assert image.dtype == np.uint8 and image.shape == (64 // factor, 96 // factor, 3)
    assert images[0].std() > 0  # an image, not a constant
    assert not np.array_equal(images[0], images[-1])  # it follows the denoising


def test_without_a_preview_spec_steps_get_no_image(tiny):
    steps = run(tiny, "flux1-schnell", None, steps=2)
    assert steps == [(1, "sampling"), (2, "sampling")]


def test_flux2_unpacking_matches_the_pipelines_own_helpers(tiny):
    """Our inverse of Flux2Pipeline._pack_latents equals diffusers' id-based unpacking + unpatchify."""
    source = tiny("flux2")
    pipe = Engine().realise(PipelineHandle.of(source=source, model_class=inspect_source(source)))[0].pipe
    height, width = 64, 96
    grid = torch.randn(2, 128, height // 16, width // 16)
    packed = pipe._pack_latents(grid)
    expected = pipe._unpatchify_latents(pipe._unpack_latents_with_ids(packed, pipe._prepare_latent_ids(grid)))
    assert torch.equal(family_for("Flux2Pipeline").latent_grid(pipe, packed, height, width), expected)
    assert expected.shape == (2, 32, height // 8, width // 8)


def test_the_map_is_comfyuis_latent2rgb():
    """rgb = latent @ factors + bias, then -1..1 to 0..255, on the first image of the batch."""
    family = family_for("StableDiffusion3Pipeline")  # its latents are image-shaped already
    preview = spec(16, seed=1)
    latents = torch.randn(2, 16, 4, 6)
    image = Previewer(preview, None, family, 32, 48)(latents)
    rgb = latents[0].movedim(0, -1) @ torch.tensor(preview.factors) + torch.tensor(preview.bias)
    expected = ((rgb + 1) * 127.5).clamp(0, 255).round().to(torch.uint8).numpy()
    assert np.array_equal(image, expected)


def test_factors_that_do_not_fit_the_latent_give_no_preview_and_the_run_goes_on(tiny):
    steps = run(tiny, "flux1-schnell", spec(4), steps=2)
    assert steps == [(1, "sampling", None), (2, "sampling", None)]


def test_a_preview_spec_survives_the_wire():
    preview = spec(16)
    assert PreviewSpec.from_wire(json.loads(json.dumps(preview.to_wire()))) == preview


def test_tensor_parallel_previews_come_from_rank_0_and_match_one_process(tiny):
    """Rank 0 sends each step's preview as bytes over the control channel (2 CPU ranks, gloo)."""
    single = run(tiny, "flux1-schnell", spec(16), steps=2)
    engine = Engine()
    source = tiny("flux1-schnell")
    handle = PipelineHandle.of(source=source, model_class=inspect_source(source), mesh=MeshSpec(chips=2))
    calls = []
    try:
        engine.generate(handle, SampleRequest(prompt="a cat", width=96, height=64, steps=2, guidance=2.0, seed=3,
                                              negative_prompt="blurry"),
                        on_progress=lambda done, total, what, *image: calls.append((done, what, *image)),
                        preview=spec(16))
    finally:
        engine.unload()
    # each step's report carries its preview; the same progress repeated while the workers are quiet (so that
    # Cancel is checked then too) carries none
    sharded = [call for call in calls if call[1] == "sampling" and len(call) == 3]
    assert [done for done, *_ in sharded] == [1, 2]
    for (_, _, one), (_, _, tp) in zip(single, sharded):
        assert tp.shape == one.shape and tp.dtype == np.uint8
        assert np.abs(tp.astype(int) - one.astype(int)).max() <= 1  # the all-reduce order may round one level
