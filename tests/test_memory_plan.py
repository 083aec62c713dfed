"""What fits a chip (runtime/memory_plan.py, the Wan family's TP plan): at the real Wan 2.2 widths, with every model
built on the meta device from its published config (no weights, nothing downloaded)."""

import dataclasses
from pathlib import Path

import pytest

from tpu_diffusers_runtime import memory_plan
from tpu_diffusers_runtime.device import device_info, launchable_world_sizes
from tpu_diffusers_runtime.distributed.mesh import check_mesh, shardable_families
from tpu_diffusers_runtime.families import family_for, minimax_h3, wan
from tpu_diffusers_runtime.handle import PipelineHandle
from tpu_diffusers_runtime.loading import inspect_source
from tpu_diffusers_runtime.memory_plan import GIB, Layout, estimate, reference_sizes, refusal
from tpu_diffusers_runtime.specs import MeshSpec, Placement
from tpu_diffusers_runtime.tasks import SampleRequest

ROOT = Path(__file__).resolve().parent.parent
A14B, TI2V_5B = wan.REFERENCE_MODELS


@pytest.fixture(scope="module")
def sizes():
    return {model: reference_sizes(model) for model in wan.REFERENCE_MODELS}


def meta_transformer(model: str):
    from diffusers import WanTransformer3DModel

    return memory_plan.meta_module(WanTransformer3DModel, wan.REFERENCE_MODELS[model].components["transformer"][2])


@pytest.mark.parametrize("model, share", [(A14B, 0.690), (TI2V_5B, 0.755)])
@pytest.mark.parametrize("tp", [2, 4, 8])
def test_the_wan_tp_plan_resolves_at_the_real_widths_and_leaves_the_cross_head_norms_whole(model, share, tp):
    from diffusers.hooks.tensor_parallel import resolve_tp_shard_specs

    transformer = meta_transformer(model)
    specs = resolve_tp_shard_specs(transformer, wan.tensor_parallel_plan(transformer.config), tp)  # divisible
    params = dict(transformer.named_parameters())
    sharded = sum(params[name].numel() for name, spec in specs.items() if spec.dim is not None)
    assert sharded / sum(p.numel() for p in params.values()) == pytest.approx(share, abs=0.001)
    # q/k (their RMSNorms span all heads) and the norms stay whole; values and outputs are split per head
    assert not any(".to_q." in name or ".to_k." in name or "norm" in name for name in specs)
    heads = transformer.config.num_attention_heads
    assert specs["blocks.0.attn1.to_v.weight"].block_sizes == [128] * heads
    assert specs["blocks.0.attn2.to_out.0.weight"].dim == 1 and specs["blocks.0.attn2.to_out.0.bias"].dim is None


def test_wan_meets_the_checks_before_a_tp_launch(tiny):
    assert "Wan 2.2" in shardable_families()
    notes = check_mesh(MeshSpec(chips=2), tiny("wan22-t2v-a14b"), device_info("cpu"))
    assert notes[0] == "mesh: 1 replica(s) x 2-way tensor parallel over 2 ranks"


def test_the_estimate_at_real_wan_sizes(sizes):
    a14b = sizes[A14B]
    assert a14b.params["transformer"] * 2 == pytest.approx(28.6e9, rel=0.002)  # one expert in bf16
    for (width, height), tokens in (((832, 480), 21 * 30 * 52), ((1280, 720), 21 * 45 * 80)):
        on_one = estimate(a14b, Layout(), width, height, 81, 1)
        assert on_one.denoising == tokens * (12 * 5120 + 2 * 13824) * 2
        assert on_one.weights == 2 * sum(a14b.params.values()) and on_one.total == on_one.weights + max(
            on_one.denoising, on_one.vae)
        # offload: one model at a time; cp splits the tokens; tp splits the planned weights of both experts
        offload = estimate(a14b, Layout(Placement.MODEL_CPU_OFFLOAD, cp=4), width, height, 81, 1)
        assert offload.total == 2 * a14b.params["transformer"] + -(-tokens // 4) * (12 * 5120 + 2 * 13824) * 2
        tp4 = estimate(a14b, Layout(tp=4), width, height, 81, 1)
        assert on_one.weights - tp4.weights == 2 * 2 * (a14b.planned["transformer"] * 3 // 4)
    assert estimate(a14b, Layout(Placement.MODEL_CPU_OFFLOAD), 1280, 720, 81, 1).total / GIB == pytest.approx(
        39.2, abs=0.05)


def test_a_run_that_cannot_fit_is_refused_with_what_would_fit(sizes):
    request = SampleRequest(prompt="a cat", width=1280, height=720, frames=81)
    message = refusal(wan.FAMILY, sizes[A14B], Layout(), request, 32 * GIB, "a v6e chip")
    assert message == (
        "Wan 2.2 at 1280x720 x 81 frames, batch 1, needs ~76.6 GiB per chip (weights resident at once 64.0 GiB, "
        "denoising 12.5 GiB, VAE decode 11.4 GiB) with placement 'device', 1 chip, and a v6e chip has 32.0 GiB (90% "
        "usable): it cannot fit. Try placement 'model_cpu_offload', cp 8 over 8 chips (~28.2 GiB per chip); or a "
        "smaller size. (docs/parallelism.md has a table of what fits each chip type.)")
    at_480p = SampleRequest(prompt="a cat", width=832, height=480, frames=81)
    assert ("Try placement 'model_cpu_offload', cp 4 over 4 chips (~28.0 GiB per chip); or at most 29 frames at this "
            "size with this mesh.") in refusal(wan.FAMILY, sizes[A14B], Layout(Placement.MODEL_CPU_OFFLOAD), at_480p,
                                               32 * GIB, "a v6e chip")
    assert refusal(wan.FAMILY, sizes[A14B], Layout(Placement.MODEL_CPU_OFFLOAD, cp=8), request, 32 * GIB, "") is None


@pytest.mark.parametrize("kind, suggested", [("v4", "cp 2 over 2 chips"), ("v5p", "cp 2 over 2 chips"),
                                             ("v5e", "cp 4 over 4 chips"), ("v6e", "cp 4 over 4 chips"),
                                             ("v7", "cp 2 over 2 chips")])
def test_the_suggestion_is_a_rank_count_the_chip_type_can_launch(sizes, kind, suggested):
    """With 33 GiB per chip (a budget chosen so that 2 chips of offload and cp 2 are the fewest that fit A14B at
    480p), a v5e or v6e host is told 4 chips: TorchTPU 0.2.0 cannot launch 2 ranks there."""
    request = SampleRequest(prompt="a cat", width=832, height=480, frames=81)
    message = refusal(wan.FAMILY, sizes[A14B], Layout(Placement.MODEL_CPU_OFFLOAD), request, 33 * GIB,
                      f"a {kind} chip", world_sizes=launchable_world_sizes(kind))
    assert f"Try placement 'model_cpu_offload', {suggested} (~" in message


@pytest.mark.parametrize("name", ["wan22-t2v-a14b", "wan22-i2v-a14b", "wan22-ti2v-5b"])
def test_the_tiny_wan_pipelines_are_never_refused(tiny, name):
    source = tiny(name)
    handle = PipelineHandle.of(source=source, model_class=inspect_source(source))
    family = wan.FAMILY.with_settings({"expand_timesteps": name == "wan22-ti2v-5b"})
    memory_plan.check_fits(handle, family, SampleRequest(prompt="a cat", width=64, height=64, frames=9))
    sizes = memory_plan.sizes_of_folder(source, family)
    assert estimate(sizes, Layout(), 64, 64, 9, 1, dtype_bytes=4).total < 64 * 2**20


def test_the_parallelism_page_shows_what_fits_each_chip_type():
    table = memory_plan.markdown_table()
    assert table in (ROOT / "docs" / "parallelism.md").read_text(), f"docs/parallelism.md's table is not:\n{table}"


@pytest.mark.parametrize("name", ["flux1-schnell", "sd3", "flux2", "qwenimage", "flux2-klein", "sdxl", "zimage",
                                  "krea2", "flux3"])
def test_an_image_familys_plan_is_computed_from_its_own_memory_model(tiny, name):
    """Every family fills a memory model: an image family's estimate reads its denoiser's widths and its VAE from its
    configs, counts its tokens (one frame of size/(VAE factor x patch) squared) and refuses what cannot fit."""
    source = tiny(name)
    family = family_for(inspect_source(source))
    sizes = memory_plan.sizes_of_folder(source, family)
    memory = family.memory
    assert sizes.hidden > 0 and sizes.ffn > 0 and sizes.vae_width > 0 and sizes.patch[0] == 1
    width, height = 1024, 768
    tokens = (height // (sizes.vae_spatial * sizes.patch[1])) * (width // (sizes.vae_spatial * sizes.patch[2]))
    assert tokens == (width // family.size_multiple) * (height // family.size_multiple) or family.denoiser == "unet"
    need = estimate(sizes, Layout(), width, height, 0, 2)
    assert need.denoising == 2 * tokens * (memory.hidden_tensors * sizes.hidden + memory.ffn_tensors * sizes.ffn) * 2
    assert need.vae == memory.vae_tensors * width * height * sizes.vae_width * 2 + 2 * 3 * width * height * 4
    assert need.total == 2 * sum(sizes.params.values()) + max(need.denoising, need.vae)
    request = SampleRequest(prompt="a cat", width=width, height=height, batch_size=2)
    message = refusal(family, sizes, Layout(), request, need.total // 2, "a small chip")
    assert message.startswith(f"{family.name} at 1024x768, batch 2, needs ~") and "a smaller batch" in message
    assert refusal(family, sizes, Layout(), request, 2 * need.total, "") is None


def test_an_in_context_reference_adds_its_tokens_to_the_estimate():
    """An in-context run's reference video adds its tokens beside the video's (its first `frames` frames, at
    1/reference_downscale of the size): counted in the denoising estimate."""
    import numpy as np

    family = family_for("LTX2Pipeline")
    sizes = memory_plan.reference_sizes("LTX-2.3 (22B)")
    plain = SampleRequest(prompt="a cat", width=832, height=480, frames=81)
    reference = dataclasses.replace(plain, reference_video=np.zeros((97, 8, 8, 3), np.float32))
    assert memory_plan.reference_tokens(sizes, plain, family) == 0
    assert memory_plan.reference_tokens(sizes, reference, family) == memory_plan.latent_tokens(sizes, 832, 480, 81)
    assert memory_plan.reference_tokens(sizes, dataclasses.replace(reference, reference_downscale=2), family) == \
        memory_plan.latent_tokens(sizes, 416, 240, 81)
    alone, beside = (estimate(sizes, Layout(), 832, 480, 81, 1,
                              extra_tokens=memory_plan.reference_tokens(sizes, r, family)) for r in (plain, reference))
    assert beside.denoising == 2 * alone.denoising


def test_reference_to_video_counts_its_pictures_and_videos_at_the_sizes_the_model_encodes_them():
    """MiniMax H3's pictures at a 2048 short edge (its release's), a video's frames resampled to 24 fps and cut to the
    video's frames, on at most its canvas area; sound clips add no video tokens."""
    import numpy as np

    from tpu_diffusers_runtime.references import Reference

    family = family_for("MiniMaxH3ModularPipeline")
    sizes = memory_plan.reference_sizes(H3_BF16)
    picture = Reference("image", frames=np.zeros((1, 1000, 500, 3), np.float32))  # 1:2, short edge 500
    clip = Reference("video", frames=np.zeros((300, 720, 1280, 3), np.float32), fps=30.0)  # 10 s at 30 fps
    voice = Reference("audio", audio=np.zeros((2, 32_000), np.float32), sample_rate=32_000)
    request = SampleRequest(prompt="a cat", width=1344, height=768, frames=124, references=(picture, clip, voice))
    area = (768 * 1344 / (1280 * 720)) ** 0.5
    assert memory_plan.reference_tokens(sizes, request, family) == (
        memory_plan.latent_tokens(sizes, 2048, 4096, 1)
        + memory_plan.latent_tokens(sizes, round(1280 * area), round(720 * area), 124))


H3_BF16, H3_INT8 = minimax_h3.REFERENCE_MODELS
H3_BF16_CONFIG = minimax_h3.REFERENCE_MODELS[H3_BF16].components["transformer"][2]


@pytest.mark.parametrize("tp", [2, 4, 8])
def test_the_minimax_h3_tp_plan_shards_its_values_outputs_and_ffns_at_the_release_widths(tp):
    """The family's plan at the release's config (56 heads x 128, built on the meta device): per head for the values
    and outputs, per SwiGLU half for the FFN's input, in the 50 blocks and the token refiner; q/k, the AdaLN
    projections and the rest whole: 48.4% of the 33.1B parameters, as its docstring says."""
    from diffusers import MiniMaxH3Transformer3DModel
    from diffusers.hooks.tensor_parallel import resolve_tp_shard_specs

    transformer = memory_plan.meta_module(MiniMaxH3Transformer3DModel, H3_BF16_CONFIG)
    assert minimax_h3.FAMILY.tp_plan is minimax_h3.tensor_parallel_plan
    specs = resolve_tp_shard_specs(transformer, minimax_h3.tensor_parallel_plan(transformer.config), tp)  # divisible
    params = dict(transformer.named_parameters())
    sharded = sum(params[name].numel() for name, spec in specs.items() if spec.dim is not None)
    assert sharded / sum(p.numel() for p in params.values()) == pytest.approx(0.484, abs=0.001)
    assert not any(".to_q." in name or ".to_k." in name or "norm" in name or "adaln" in name for name in specs)
    assert specs["transformer_blocks.49.attn.to_v.weight"].block_sizes == [128] * 56
    assert specs["token_refiner.refiner_blocks.1.attn.to_out.0.weight"] == (1, [128] * 56)
    assert specs["transformer_blocks.0.ff.net.0.proj.weight"] == (0, [14336, 14336])  # value half, gate half
    assert specs["transformer_blocks.0.ff.net.2.weight"] == (1, [14336])


def test_a_minimax_h3_run_that_cannot_fit_is_refused_naming_what_to_change():
    """No mesh fits MiniMax H3 on a small chip (its TP plan shards 48% of the transformer, but TP keeps the whole
    pipeline on the chips, the ~62 GiB text encoder whole; context parallelism splits no weight): at its 16:9 canvas
    in bf16 a v5e chip fits no layout and no smaller size (its transformer and text encoder are ~62 GiB each), which
    the refusal says; a v6e chip with int8 weights is told the same; a v5p chip is told model CPU offload on one
    chip (no TP mesh fits it in bf16: ~109 GiB per chip at tp 8)."""
    bf16 = reference_sizes(H3_BF16)
    assert 2 * bf16.params["transformer"] / GIB == pytest.approx(61.7, abs=0.05)  # one partition, as released
    assert memory_plan.latent_tokens(bf16, 1344, 768, 124) == 37 * 24 * 42  # 17n + 5 frames: 5n + 2 latent frames
    assert estimate(bf16, Layout(tp=8), 1344, 768, 124, 1).total / GIB == pytest.approx(109.1, abs=0.05)
    request = SampleRequest(prompt="a cat", width=1344, height=768, frames=124)
    message = refusal(minimax_h3.FAMILY, bf16, Layout(), request, 16 * GIB, "a v5e chip",
                      world_sizes=launchable_world_sizes("v5e"))
    assert message.startswith("MiniMax H3 at 1344x768 x 124 frames, batch 1, needs ~136.9 GiB per chip") and \
        message.endswith("it cannot fit. Try a chip with more memory, or smaller (int8) weights: its text_encoder "
                         "alone is ~62.1 GiB. (docs/parallelism.md has a table of what fits each chip type.)")
    assert "Try a chip with more memory" in refusal(minimax_h3.FAMILY, reference_sizes(H3_INT8), Layout(), request,
                                                    32 * GIB, "a v6e chip", world_sizes=launchable_world_sizes("v6e"))
    assert "Try placement 'model_cpu_offload', 1 chip (~69.7 GiB per chip)" in refusal(
        minimax_h3.FAMILY, bf16, Layout(), request, 95 * GIB, "a v5p chip", world_sizes=launchable_world_sizes("v5p"))


def test_a_tiny_minimax_h3_folder_is_planned_from_its_loaded_partition(tmp_path):
    """The estimate reads the configs of what loads (t2va/fl2va's transformer, never transformer_ref) and the
    transformer's real config keys; a tiny run is never refused."""
    import tiny_models

    folder = tmp_path / "tiny-minimax-h3"
    tiny_models.save(*tiny_models.minimax_h3(), folder)
    handle = PipelineHandle.of(source=str(folder), model_class=inspect_source(str(folder)))
    assert memory_plan.check_fits(handle, minimax_h3.FAMILY, SampleRequest(prompt="a cat", width=32, height=32,
                                                                          frames=124)) == []
    sizes = memory_plan.sizes_of_folder(str(folder), minimax_h3.FAMILY)
    assert set(sizes.params) == {"text_encoder", "transformer", "vae", "audio_vae"}
    assert (sizes.hidden, sizes.ffn, sizes.patch) == (32, 32, (1, 2, 2))  # 2 heads x 16, hidden_size 32
    assert memory_plan.latent_tokens(sizes, 32, 32, 124) == 37
