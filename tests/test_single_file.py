"""Pipelines from ComfyUI-style single weight files (runtime/single_file.py).

The files are written by tools/tiny_single_files.py in the real layouts (BFL, Stability, Comfy-Org) from
tiny diffusers folders; loading them through `load_pipeline` must give exactly the folder's weights.
Images are compared to 2e-5: with identical weights, tensors that were read into fresh memory instead of
memory-mapped change CPU matmul rounding by an ulp (measured: 2e-7 per layer, 4e-6 on the image).
"""
import dataclasses
import os
import shutil
import sys

import pytest
import torch
from safetensors.torch import save_file

import tiny_single_files as tsf
from tpu_diffusers_runtime import features, single_file
from tpu_diffusers_runtime.device import device_info
from tpu_diffusers_runtime.errors import ModelLoadError, UserInputError
from tpu_diffusers_runtime.handle import PipelineHandle
from tpu_diffusers_runtime.loading import load_pipeline
from tpu_diffusers_runtime.pipeline_cache import PipelineCache

CPU = device_info("cpu")
SD3 = "StableDiffusion3Pipeline"
SDXL = "StableDiffusionXLPipeline"


@pytest.fixture(scope="session")
def sf_dir(single_files):
    """The session's single files of every family (tests/conftest.py), also used by the end-to-end tests."""
    return single_files


def folder(sf_dir, name):
    return str(sf_dir[name][0])


def files(sf_dir, name):
    return {kind: str(path) for kind, path in sf_dir[name][1].items()}


def image(pipe):
    return pipe(prompt="a photo of a cat", height=64, width=64, num_inference_steps=2, output_type="np",
                generator=torch.Generator().manual_seed(0), max_sequence_length=16).images


def image_at_default_text_length(pipe):
    """`image` for pipelines without max_sequence_length (Qwen-Image 2.1)."""
    return pipe(prompt="a photo of a cat", height=64, width=64, num_inference_steps=2, output_type="np",
                generator=torch.Generator().manual_seed(0)).images


def assert_same_pipeline(source, pipeline_class, picked, sample=image):
    """Same weights (exactly) and the same image (or what `sample` makes: video frames) as the diffusers folder."""
    from_folder = load_pipeline(PipelineHandle.of(source=source, model_class=pipeline_class), CPU)
    from_files = load_pipeline(PipelineHandle.of(source=source, model_class=pipeline_class, files=picked), CPU)
    for name, _ in picked:
        expected, got = from_folder.components[name].state_dict(), from_files.components[name].state_dict()
        assert sorted(expected) == sorted(got), name
        assert all(torch.equal(expected[k], got[k]) for k in expected), name
        assert type(from_files.components[name]) is type(from_folder.components[name])
    a, b = sample(from_folder), sample(from_files)
    assert abs(a - b).max() < 2e-5


def test_flux1_from_comfy_org_files_matches_the_folder(sf_dir):
    f = files(sf_dir, "flux1-wide")
    assert_same_pipeline(folder(sf_dir, "flux1-wide"), "FluxPipeline", (
        ("transformer", f["transformer"]), ("text_encoder", f["clip_l"]), ("text_encoder_2", f["t5xxl"]),
        ("vae", f["ae"])))


def test_sd35_all_in_one_checkpoint_matches_the_folder(sf_dir):
    ckpt = files(sf_dir, "sd3")["checkpoint"]
    assert single_file.components_in_checkpoint(ckpt) == {
        "transformer": "model.diffusion_model.", "vae": "first_stage_model.",
        "text_encoder": "text_encoders.clip_l.transformer.", "text_encoder_2": "text_encoders.clip_g.transformer.",
        "text_encoder_3": "text_encoders.t5xxl.transformer."}
    assert_same_pipeline(folder(sf_dir, "sd3"), SD3, tuple(
        (name, ckpt) for name in ("transformer", "vae", "text_encoder", "text_encoder_2", "text_encoder_3")))


def test_sd35_checkpoint_without_t5_plus_separate_text_encoders(sf_dir):
    f = files(sf_dir, "sd3")
    assert "text_encoder_3" not in single_file.components_in_checkpoint(f["checkpoint_no_t5"])
    assert_same_pipeline(folder(sf_dir, "sd3"), SD3, (
        ("transformer", f["checkpoint_no_t5"]), ("vae", f["checkpoint_no_t5"]), ("text_encoder", f["clip_l"]),
        ("text_encoder_2", f["clip_g"]), ("text_encoder_3", f["t5xxl"])))


def test_sdxl_all_in_one_checkpoint_matches_the_folder(sf_dir):
    """Stability's SGM UNet and OpenCLIP ViT-bigG layouts, converted by diffusers' own converters."""
    f = files(sf_dir, "sdxl")
    assert single_file.components_in_checkpoint(f["checkpoint"]) == {
        "unet": "model.diffusion_model.", "vae": "first_stage_model.",
        "text_encoder": "conditioner.embedders.0.transformer.", "text_encoder_2": "conditioner.embedders.1.model."}
    assert single_file.model_class_of(f["checkpoint"]) == SDXL
    assert_same_pipeline(folder(sf_dir, "sdxl"), SDXL, tuple(
        (name, f["checkpoint"]) for name in ("unet", "vae", "text_encoder", "text_encoder_2")))
    assert_same_pipeline(folder(sf_dir, "sdxl"), SDXL, (("unet", f["checkpoint"]), ("vae", f["vae"])))


def test_flux2_from_files_matches_the_folder(sf_dir):
    f = files(sf_dir, "flux2")
    assert_same_pipeline(folder(sf_dir, "flux2"), "Flux2Pipeline", (
        ("transformer", f["transformer"]), ("text_encoder", f["text_encoder"]), ("vae", f["vae"])))


def test_flux2_text_only_mistral_file_gives_the_same_image(sf_dir):
    """The vision tower is missing from the file; the pipeline never runs it, the text path is exact."""
    f = files(sf_dir, "flux2")
    source = folder(sf_dir, "flux2")
    ref = load_pipeline(PipelineHandle.of(source=source, model_class="Flux2Pipeline"), CPU)
    pipe = load_pipeline(PipelineHandle.of(source=source, model_class="Flux2Pipeline",
                                        files=[("text_encoder", f["text_encoder_text_only"])]), CPU)
    want, got = ref.text_encoder.state_dict(), pipe.text_encoder.state_dict()
    language = [k for k in want if "language_model" in k]
    assert language and all(torch.equal(want[k], got[k]) for k in language)
    assert abs(image(ref) - image(pipe)).max() < 2e-5


def test_flux2_klein_from_comfy_org_files_matches_the_folder(sf_dir):
    """FLUX.2 [klein] 4B: the BFL-layout transformer (FLUX.2 [dev]'s keys), ComfyUI's Qwen3 file, the FLUX.2 VAE;
    its fp8 file (ComfyUI's newer scaled fp8) loads within fp8's precision."""
    source, f = folder(sf_dir, "flux2-klein-wide"), files(sf_dir, "flux2-klein-wide")
    assert_same_pipeline(source, "Flux2KleinPipeline", (
        ("transformer", f["transformer"]), ("text_encoder", f["text_encoder"]), ("vae", f["vae"])))
    fp8 = load_pipeline(PipelineHandle.of(source=source, model_class="Flux2KleinPipeline",
                                          files=[("transformer", f["transformer_fp8"])]), CPU).transformer.state_dict()
    want = load_pipeline(PipelineHandle.of(source=source, model_class="Flux2KleinPipeline"),
                         CPU).transformer.state_dict()
    assert sorted(fp8) == sorted(want)
    assert all(torch.allclose(fp8[k], want[k], rtol=0.07, atol=want[k].abs().max().item() * 2 ** -9) for k in want)


def test_flux2_klein_files_are_told_from_flux2_dev_and_4b_from_9b_by_the_context_width(sf_dir, tmp_path):
    """The keys are FLUX.2 [dev]'s; the context embedder's input width (3 x the Qwen3 encoder's) tells klein, 4B
    (7680) from 9B (12288); "base" in the name is the undistilled model."""
    f = files(sf_dir, "flux2-klein-wide")
    for name, repo in (("transformer", "black-forest-labs/FLUX.2-klein-4B"),
                       ("transformer_fp8", "black-forest-labs/FLUX.2-klein-4B"),
                       ("transformer_9b", "black-forest-labs/FLUX.2-klein-9B")):
        assert single_file.model_class_of(f[name]) == "Flux2KleinPipeline", name
        assert single_file.default_config_repo(f[name]) == repo, name
    for name, model in (("flux-2-klein-base-4b.safetensors", "transformer"),
                        ("flux-2-klein-base-9b-fp8.safetensors", "transformer_9b")):
        (tmp_path / name).symlink_to(f[model])
    assert single_file.default_config_repo(str(tmp_path / "flux-2-klein-base-4b.safetensors")) \
        == "black-forest-labs/FLUX.2-klein-base-4B"
    assert single_file.default_config_repo(str(tmp_path / "flux-2-klein-base-9b-fp8.safetensors")) \
        == "black-forest-labs/FLUX.2-klein-base-9B"
    assert single_file.model_class_of(files(sf_dir, "flux2")["transformer"]) == "Flux2Pipeline"  # [dev]: other width


def test_qwenimage_from_files_matches_the_folder(sf_dir):
    f = files(sf_dir, "qwenimage")
    assert_same_pipeline(folder(sf_dir, "qwenimage"), "QwenImagePipeline", (
        ("transformer", f["transformer"]), ("text_encoder", f["text_encoder"]), ("vae", f["vae"])))


def test_zimage_from_comfy_org_files_matches_the_folder(sf_dir):
    """z_image_turbo_bf16 in ComfyUI's NextDiT layout (fused qkv, norm_final), qwen_3_4b named as ComfyUI's
    Qwen3_4B ("model.layers...") into the Qwen3Model the repo's model_index names, and FLUX.1's ae."""
    f = files(sf_dir, "zimage")
    keys = single_file.HeaderView(f["transformer"]).keys()
    assert "layers.0.attention.qkv.weight" in keys and "norm_final.weight" in keys
    assert single_file.model_class_of(f["transformer"]) == "ZImagePipeline"
    assert single_file.default_config_repo(f["transformer"]) == "Tongyi-MAI/Z-Image-Turbo"
    assert_same_pipeline(folder(sf_dir, "zimage"), "ZImagePipeline", (
        ("transformer", f["transformer"]), ("text_encoder", f["text_encoder"]), ("vae", f["vae"])))
def test_krea2_from_comfy_org_files_matches_the_folder(sf_dir, tiny):
    """krea2_turbo_fp8_scaled in Krea's original layout and qwen3vl_4b_fp8_scaled in ComfyUI's Qwen3-VL layout
    ("model." language model beside "visual."), both ComfyUI's newer scaled fp8, into the folder's Krea2Transformer2DModel
    and Qwen3VLModel, and Qwen-Image's VAE; "turbo" in the name takes Krea 2 Turbo's configs (is_distilled), and Raw's
    are refused for it."""
    from tpu_diffusers_runtime.file_choice import check_configs_class

    f = files(sf_dir, "krea2")
    with pytest.raises(UserInputError, match="'tiny-krea2' holds a Krea2Pipeline without is_distilled, but "
                                             "'krea2_turbo_fp8_scaled.safetensors' is one with it"):
        check_configs_class(tiny("krea2"), "Krea2Pipeline", os.path.basename(f["transformer"]),
                            single_file.settings_of(f["transformer"]))
    assert "txtfusion.projector.weight" in single_file.HeaderView(f["transformer"]).keys()
    assert single_file.model_class_of(f["transformer"]) == "Krea2Pipeline"
    assert single_file.default_config_repo(f["transformer"]) == "krea/Krea-2-Turbo"
    assert_same_pipeline(folder(sf_dir, "krea2"), "Krea2Pipeline", (
        ("transformer", f["transformer"]), ("text_encoder", f["text_encoder"]), ("vae", f["vae"])))


# ------------------------------------------------------------------------------------------ Wan 2.2 video
WAN = {  # the single_files fixture's Wan 2.2 models: (pipeline class, components from files, configs repo of auto)
    "wan22-t2v-a14b": ("WanPipeline", ("transformer", "transformer_2", "text_encoder", "vae"),
                       "Wan-AI/Wan2.2-T2V-A14B-Diffusers"),
    "wan22-i2v-a14b": ("WanImageToVideoPipeline", ("transformer", "transformer_2", "text_encoder", "vae"),
                       "Wan-AI/Wan2.2-I2V-A14B-Diffusers"),
    "wan22-ti2v-5b": ("WanPipeline", ("transformer", "text_encoder", "vae"), "Wan-AI/Wan2.2-TI2V-5B-Diffusers"),
}


def video(pipe):
    """5 frames at 64x64; image to video (WanImageToVideoPipeline) from a fixed start image."""
    from PIL import Image

    start = {}
    if type(pipe).__name__ == "WanImageToVideoPipeline":
        pixels = torch.Generator().manual_seed(1)
        start["image"] = Image.fromarray((torch.rand(64, 64, 3, generator=pixels) * 255).byte().numpy())
    return pipe(prompt="a cat walks", negative_prompt="", height=64, width=64, num_frames=5, num_inference_steps=2,
                output_type="np", generator=torch.Generator().manual_seed(0), max_sequence_length=16, **start).frames


@pytest.mark.parametrize("name", WAN)
def test_wan22_from_comfy_org_files_gives_the_frames_of_its_folder(sf_dir, name):
    """Both A14B experts (high-noise `transformer`, low-noise `transformer_2`) and TI2V-5B's one model in Wan's
    original layout, umt5_xxl (with its spiece_model tensor), wan_2.1_vae / wan2.2_vae: the folder's weights
    exactly and its frames; the File Loader's plan picks the model class and configs from the model file."""
    from tpu_diffusers_runtime.file_choice import plan

    model_class, components, repo = WAN[name]
    f = files(sf_dir, name)
    picked = {component: f[component] for component in components if component != "transformer"}
    assert plan(f["transformer"], picked, "auto", [])[:2] == (repo, model_class)
    assert_same_pipeline(folder(sf_dir, name), model_class, tuple((c, f[c]) for c in components), sample=video)


def test_wan22_fp8_scaled_files_load_within_fp8_rounding(sf_dir):
    """Comfy-Org's wan2.2_*_14B_fp8_scaled and umt5_xxl_fp8_e4m3fn_scaled (ComfyUI's older scaled fp8) are
    de-scaled into the pipeline: each weight within e4m3's rounding of the folder's, and the video is made."""
    name = "wan22-t2v-a14b"
    source, f = folder(sf_dir, name), files(sf_dir, name)
    assert all("scaled_fp8" in single_file.HeaderView(f[f"{c}_fp8"]) for c in ("transformer", "transformer_2",
                                                                                 "text_encoder"))
    picked = [(c, f[f"{c}_fp8"]) for c in ("transformer", "transformer_2", "text_encoder")] + [("vae", f["vae"])]
    pipe = load_pipeline(PipelineHandle.of(source=source, model_class="WanPipeline", files=picked), CPU)
    ref = load_pipeline(PipelineHandle.of(source=source, model_class="WanPipeline"), CPU)
    for component in ("transformer", "transformer_2", "text_encoder"):
        got, want = pipe.components[component].state_dict(), ref.components[component].state_dict()
        assert sorted(got) == sorted(want), component
        assert all(torch.allclose(got[k], want[k], rtol=0.07, atol=want[k].abs().max().item() * 2 ** -9)
                   for k in want), component
        assert not all(torch.equal(got[k], want[k]) for k in want), component  # read from fp8 indeed
    assert video(pipe).shape == (1, 5, 64, 64, 3)


def test_wan22_files_have_comfyuis_own_key_layout(sf_dir):
    """The tiny Wan files hold exactly the keys and shapes of ComfyUI's own Wan modules built at the folders'
    sizes (comfy/ldm/wan/model.py, vae.py, vae2_2.py, comfy/text_encoders/t5.py), not only what diffusers'
    converters read."""
    import json

    from comfy_host import prepare_comfyui

    sys.path.append(str(prepare_comfyui()))
    from comfy.cli_args import args

    args.cpu = True
    import comfy.ldm.wan.model
    import comfy.ldm.wan.vae
    import comfy.ldm.wan.vae2_2
    import comfy.ops
    import comfy.text_encoders.t5

    def config(name, component):
        return json.loads((sf_dir[name][0] / component / "config.json").read_text())

    def wan_model(name):
        c = config(name, "transformer")
        return comfy.ldm.wan.model.WanModel(
            model_type="t2v", in_dim=c["in_channels"], dim=c["num_attention_heads"] * c["attention_head_dim"],
            ffn_dim=c["ffn_dim"], freq_dim=c["freq_dim"], text_dim=c["text_dim"], out_dim=c["out_channels"],
            num_heads=c["num_attention_heads"], num_layers=c["num_layers"], operations=comfy.ops.disable_weight_init)

    def wan_vae(name):
        c = config(name, "vae")
        if c["is_residual"]:
            return comfy.ldm.wan.vae2_2.WanVAE(dim=c["base_dim"], dec_dim=c["decoder_base_dim"], z_dim=c["z_dim"],
                                               dim_mult=c["dim_mult"], num_res_blocks=c["num_res_blocks"],
                                               temperal_downsample=c["temperal_downsample"])
        return comfy.ldm.wan.vae.WanVAE(dim=c["base_dim"], z_dim=c["z_dim"], dim_mult=c["dim_mult"],
                                        num_res_blocks=c["num_res_blocks"],
                                        temperal_downsample=c["temperal_downsample"])

    def umt5(name):
        c = config(name, "text_encoder")
        t5 = {"num_layers": c["num_layers"], "d_model": c["d_model"], "d_kv": c["d_kv"], "num_heads": c["num_heads"],
              "d_ff": c["d_ff"], "dense_act_fn": "gelu_pytorch_tanh", "is_gated_act": True, "model_type": "umt5",
              "vocab_size": c["vocab_size"]}
        return comfy.text_encoders.t5.T5(t5, torch.float32, "cpu", comfy.ops.disable_weight_init)

    checked = 0
    for name in WAN:
        f = files(sf_dir, name)
        for kind, build in (("transformer", wan_model), ("transformer_2", wan_model), ("vae", wan_vae),
                            ("text_encoder", umt5)):
            if kind not in f:
                continue
            header = single_file.HeaderView(f[kind])
            comfy_keys = {k: tuple(v.shape) for k, v in build(name).state_dict().items()}
            file_keys = {k: header[k].shape for k in header if k != "spiece_model"}
            if kind == "text_encoder":  # ComfyUI's T5 has 32 relative-attention buckets always, the tiny config 8
                file_keys = {k: (32, *v[1:]) if "relative_attention_bias" in k else v for k, v in file_keys.items()}
            assert file_keys == comfy_keys, (name, kind, sorted(set(file_keys) ^ set(comfy_keys))[:5])
            checked += 1
    assert checked == 11  # A14B: both experts, umt5, VAE; TI2V-5B: one model, umt5, VAE
    assert "spiece_model" in single_file.HeaderView(files(sf_dir, "wan22-ti2v-5b")["text_encoder"])


def test_a_wan_transformer_from_a_file_keeps_the_float32_modules_of_from_pretrained(sf_dir):
    """In bf16 a folder's WanTransformer3DModel keeps its time embedder, norms and modulation in float32
    (_keep_in_fp32_modules); from a file it has the same dtypes, so the two compute alike on a chip."""
    name = "wan22-ti2v-5b"
    source, f = folder(sf_dir, name), files(sf_dir, name)
    picked = [("transformer", f["transformer"])]
    got = load_pipeline(PipelineHandle.of(source=source, model_class="WanPipeline", files=picked, dtype="bfloat16"),
                        CPU).transformer.state_dict()
    want = load_pipeline(PipelineHandle.of(source=source, model_class="WanPipeline", dtype="bfloat16"),
                         CPU).transformer.state_dict()
    assert {k: v.dtype for k, v in got.items()} == {k: v.dtype for k, v in want.items()}
    assert {v.dtype for v in want.values()} == {torch.float32, torch.bfloat16}


WAN_T2V, WAN_I2V, WAN_5B = "wan22-t2v-a14b", "wan22-i2v-a14b", "wan22-ti2v-5b"


@pytest.mark.parametrize("model, picks, pattern", [
    ((WAN_5B, "transformer"), {"transformer_2": (WAN_T2V, "transformer_2")},
     r"'wan2.2_ti2v_5B_fp16.safetensors' is Wan 2.2 \(expand_timesteps\), which has one diffusion model: it takes "
     r"no second diffusion model \(transformer_2\); leave it at 'none'"),
    ((WAN_T2V, "transformer"), {}, r"Wan 2.2 from single files also needs transformer_2 "
                                   r"\(wan2.2_t2v_low_noise_14B_fp8_scaled.safetensors\)"),
    ((WAN_I2V, "transformer_fp8"), {}, r"also needs transformer_2 \(wan2.2_i2v_low_noise_14B_fp8_scaled.safetensors\)"),
    ((WAN_T2V, "transformer"), {"transformer_2": (WAN_I2V, "transformer_2")},
     r"'wan2.2_i2v_low_noise_14B_fp16.safetensors' \(Wan2.2-I2V-A14B-Diffusers\) is not of the same model as "
     r"'wan2.2_t2v_high_noise_14B_fp16.safetensors' \(Wan2.2-T2V-A14B-Diffusers\): patch_embedding.weight is "
     r"\[24, 36, 1, 2, 2\] there, \[24, 16, 1, 2, 2\] here. transformer_2 takes the other expert of the model picked: "
     r"wan2.2_t2v_low_noise_14B_fp8_scaled.safetensors"),
    ((WAN_I2V, "transformer"), {"transformer_2": (WAN_T2V, "transformer_2_fp8")},
     r"'wan2.2_t2v_low_noise_14B_fp8_scaled.safetensors' \(Wan2.2-T2V-A14B-Diffusers\) is not of the same model .*"
     r"takes the other expert of the model picked: wan2.2_i2v_low_noise_14B_fp8_scaled.safetensors"),
    ((WAN_T2V, "transformer"), {"transformer_2": (WAN_5B, "transformer")}, r"is not of the same model"),
    ((WAN_T2V, "transformer"), {"transformer_2": (WAN_T2V, "transformer_fp8")},
     r"'wan2.2_t2v_high_noise_14B_fp8_scaled.safetensors' is named 'high_noise', so it is not the file for "
     r"transformer_2 .* goes in the model input"),
    ((WAN_T2V, "transformer_2"), {"transformer_2": (WAN_T2V, "transformer_2")}, r"is picked twice"),
    ((WAN_5B, "transformer"), {"vae": (WAN_T2V, "vae")},
     r"'wan_2.1_vae.safetensors' is a Wan 2.1 / QwenImage VAE, but vae of Wan 2.2 needs a Wan 2.2 VAE \(TI2V-5B\)"),
    ((WAN_T2V, "transformer"), {"text_encoder": ("flux1-dev", "t5xxl")},
     r"'t5xxl_fp16.safetensors' is a T5 text encoder, but text_encoder of Wan 2.2 needs a UMT5 text encoder"),
], ids=["5b-with-model_2", "t2v-without-model_2", "i2v-without-model_2", "t2v-with-i2v-expert", "i2v-with-t2v-expert",
        "t2v-with-5b", "high-noise-as-model_2", "same-file-twice", "5b-with-2.1-vae", "t5-as-umt5"])
def test_wrong_wan_files_are_refused_from_their_headers(sf_dir, model, picks, pattern):
    """What the File Loader refuses when the prompt is queued (plan reads headers only)."""
    from tpu_diffusers_runtime.file_choice import plan

    f = files(sf_dir, model[0])
    picked = {"text_encoder": f["text_encoder"], "vae": f["vae"],
              **({"transformer_2": f["transformer_2"]} if "transformer_2" in f else {})}
    picked.update({component: files(sf_dir, name)[kind] for component, (name, kind) in picks.items()})
    if not picks and model[0] != WAN_5B:
        del picked["transformer_2"]
    with pytest.raises(UserInputError, match=pattern):
        plan(f[model[1]], picked, "auto", [])


def test_a_wan21_file_is_refused_with_what_to_load_instead(sf_dir, tmp_path):
    """Wan 2.1's files have Wan 2.2's keys but other configs (1.3B, CLIP image keys): refused by name when queued."""
    from tpu_diffusers_runtime.file_choice import plan

    f = files(sf_dir, WAN_T2V)
    (tmp_path / "wan2.1_t2v_1.3B_fp16.safetensors").symlink_to(f["transformer"])
    with pytest.raises(UserInputError, match=r"'wan2.1_t2v_1.3B_fp16.safetensors' is named 'wan2.1': Wan 2.1's single "
                                             r"files are not supported yet: load a Wan 2.1 diffusers folder .* with the "
                                             r"TPU Loader\."):
        plan(str(tmp_path / "wan2.1_t2v_1.3B_fp16.safetensors"), {"text_encoder": f["text_encoder"], "vae": f["vae"]},
             "auto", [])


def test_ltx25_diffusion_decoder_vae_file_decodes_as_diffusers_recipe(sf_dir, tmp_path):
    """The template's ltx-2.5-video-vae-bf16 (the conv encoder with LTX-2.5's diffusion decoder in its original names,
    its gates beside the layers they gate, a frame-type embedding and a preview head): its VAE has no conv decoder
    (nothing random runs); its diffusion decoder decodes as diffusers documents (LTX2VideoDiffusionDecodePipeline on
    the pipeline's latents, with the call's generator, as its modular route does): frames and sound equal a folder
    holding the same weights run that way. The folder, a configs-only download, needs no decoder weights; a folder
    itself decodes with the conv VAE, as diffusers' classic pipeline does."""
    import diffusers
    import tiny_models

    from tpu_diffusers_runtime.engine import Engine
    from tpu_diffusers_runtime.file_choice import plan
    from tpu_diffusers_runtime.tasks import SampleRequest

    source = tiny_models.with_diffusion_decoder(shutil.copytree(folder(sf_dir, "ltx25"), tmp_path / "ltx25"))
    f = files(sf_dir, "ltx25")
    vae = tsf.ltx25_diffusion_decoder_vae_file(source, tmp_path)
    _, model_class, picked = plan(f["transformer"], {"text_encoder": f["text_encoder"], "vae": str(vae),
                                                    "audio_vae": f["audio_vae"]}, "auto", [])
    assert dict(picked)["vae"] == str(vae)
    assert load_pipeline(PipelineHandle.of(source=str(source), model_class=model_class, files=picked),
                         CPU).vae.decoder is None
    request = SampleRequest(prompt="a corgi on a beach", width=32, height=32, steps=2, guidance=3.0, seed=7,
                            batch_size=1, frames=9)
    pipe = diffusers.LTX2Pipeline.from_pretrained(str(source), local_files_only=True)
    generator = torch.Generator("cpu").manual_seed(7)
    latents = pipe(prompt=request.prompt, negative_prompt="", height=32, width=32, num_frames=9, frame_rate=24.0,
                   num_inference_steps=2, guidance_scale=3.0, generator=generator, output_type="latent")
    decoder = diffusers.LTX2VideoDiffusionDecoderModel.from_pretrained(str(source), subfolder="diffusion_decoder")
    decode = diffusers.LTX2VideoDiffusionDecodePipeline(diffusion_decoder=decoder, scheduler=pipe.scheduler)
    frames = decode(latents.frames, generator=generator, output_type="pt", denormalize=False).frames[0]
    waveform = pipe.vocoder(pipe.audio_vae.decode(latents.audio, return_dict=False)[0]).float()
    (source / "diffusion_decoder" / "diffusion_pytorch_model.safetensors").unlink()  # a configs-only folder
    engine = Engine(distribute=False)
    made = engine.generate(PipelineHandle.of(source=str(source), model_class=model_class, files=picked), request)
    assert any(note.startswith("video decoded by LTX-2.5's diffusion decoder (in 'ltx-2.5-video-vae-bf16")
               for note in made.info.notes)
    assert (made.images - frames.permute(0, 2, 3, 1)).abs().max() <= 1 / 255
    torch.testing.assert_close(made.audio["waveform"], waveform, atol=1e-4, rtol=0)
    by_folder = engine.generate(PipelineHandle.of(source=folder(sf_dir, "ltx25"), model_class=model_class), request)
    assert not any("diffusion decoder" in note for note in by_folder.info.notes)


def test_ltx25_diffusion_decoder_vae_file_is_refused_where_its_attention_cannot_fit(sf_dir, tmp_path):
    """The diffusion decoder's neighborhood attention runs densely (a tokens x tokens mask): at the template's size
    it cannot fit, refused before loading, naming the conv VAE file."""
    import tiny_models

    from tpu_diffusers_runtime import memory_plan
    from tpu_diffusers_runtime.families import family_for
    from tpu_diffusers_runtime.file_choice import plan
    from tpu_diffusers_runtime.tasks import SampleRequest

    source = tiny_models.with_diffusion_decoder(shutil.copytree(folder(sf_dir, "ltx25"), tmp_path / "ltx25"))
    f = files(sf_dir, "ltx25")
    vae = tsf.ltx25_diffusion_decoder_vae_file(source, tmp_path)
    _, model_class, picked = plan(f["transformer"], {"text_encoder": f["text_encoder"], "vae": str(vae),
                                                    "audio_vae": f["audio_vae"]}, "auto", [])
    handle = PipelineHandle.of(source=str(source), model_class=model_class, files=picked)
    request = SampleRequest(prompt="a corgi", width=1536, height=1024, frames=121)
    with pytest.raises(UserInputError, match=r"'ltx-2.5-video-vae-bf16.safetensors' decodes with LTX-2.5's diffusion "
                                             r"decoder, which at 1536x1024 x 121 frames needs ~.* GiB .* Pick "
                                             r"ltx-2.5-video-vae-conv-bf16.safetensors for vae"):
        memory_plan.check_fits(handle, family_for(model_class), request)
    assert memory_plan.check_fits(handle, family_for(model_class), dataclasses.replace(
        request, width=32, height=32, frames=9)) == []


def test_ltx25_files_need_their_gemma4_encoder_and_audio_vae(sf_dir):
    """LTX-2.5's transformer with LTX-2.3's Gemma 3 file, or without the audio VAE file: refused when queued, naming
    the file it takes."""
    from tpu_diffusers_runtime.file_choice import plan

    f = files(sf_dir, "ltx25")
    with pytest.raises(UserInputError, match=r"is a Gemma 3 text encoder, but text_encoder of LTX-2 needs a Gemma 4 "
                                             r"text encoder"):
        plan(f["transformer"], {"text_encoder": files(sf_dir, "ltx23")["text_encoder"], "vae": f["vae"],
                                "audio_vae": f["audio_vae"]}, "auto", [])
    with pytest.raises(UserInputError, match=r"LTX-2 from single files also needs audio_vae "
                                             r"\(ltx-2.5-audio-vae-bf16.safetensors\), vocoder \(the vocoder in "
                                             r"ltx-2.5-audio-vae-bf16.safetensors\)"):
        plan(f["transformer"], {"text_encoder": f["text_encoder"], "vae": f["vae"]}, "auto", [])


def test_ltx25_from_its_separate_files_matches_the_folder(sf_dir):
    """LTX-2.5 from the files ComfyUI's templates load (tools/tiny_single_files.ltx25_files): the int8 ConvRot
    diffusion model with the connector blocks, the Gemma 4 file carrying the text projection, the conv video VAE, the
    audio VAE carrying the vocoder. The connectors come from two files, the vocoder from the audio VAE's; every
    component holds exactly the folder's weights, frames and sound are the folder's."""
    from tpu_diffusers_runtime.file_choice import plan

    source, f = folder(sf_dir, "ltx25"), files(sf_dir, "ltx25")
    assert single_file.default_config_repo(f["transformer"]) == "Lightricks/LTX-2.5-Diffusers"
    _, model_class, picked = plan(f["transformer"], {"text_encoder": f["text_encoder"], "vae": f["vae"],
                                                    "audio_vae": f["audio_vae"]}, "auto", [])
    assert model_class == "LTX2Pipeline"
    assert dict(picked) == {"transformer": f["transformer"], "text_encoder": f["text_encoder"],
                            "connectors": f["text_encoder"], "vae": f["vae"], "audio_vae": f["audio_vae"],
                            "vocoder": f["audio_vae"]}
    assert_same_pipeline(source, "LTX2Pipeline", picked, video_and_sound)


def test_a_gemma4_file_where_gemma3_goes_is_named_as_what_it_is(tiny, tmp_path):
    """LTX-2.5's Gemma 4 encoder shares Gemma 3's layer norms: its layer scalars tell it apart, in transformers' layout
    and in ComfyUI's (the language model named as a causal LM), so the refusal names it."""
    gemma4 = tsf.folder_weights(tiny("ltx25"), "text_encoder")
    for layout, weights in (("transformers", gemma4), ("comfyui", tsf.gemma3_file_layout(gemma4))):
        path = tmp_path / f"gemma4_{layout}.safetensors"
        save_file(weights, str(path))
        with pytest.raises(UserInputError, match=r"is a Gemma 4 text encoder, but text_encoder of LTX-2 needs a Gemma "
                                                 r"3 text encoder"):
            single_file.check_file_for_slot(str(path), "text_encoder", "LTX2Pipeline")


def test_wan22_configs_of_the_other_wan_pipeline_are_refused(sf_dir, tmp_path):
    """TI2V-5B and T2V A14B are both WanPipelines; expand_timesteps (in model_index.json) tells their configs apart."""
    from tpu_diffusers_runtime.file_choice import plan

    for name in (WAN_T2V, WAN_5B):
        (tmp_path / name).symlink_to(folder(sf_dir, name))
    five_b, t2v = files(sf_dir, WAN_5B), files(sf_dir, WAN_T2V)
    with pytest.raises(UserInputError, match=r"configs: 'wan22-t2v-a14b' holds a WanPipeline without "
                                             r"expand_timesteps, but 'wan2.2_ti2v_5B_fp16.safetensors' is one with it"):
        plan(five_b["transformer"], {"text_encoder": five_b["text_encoder"], "vae": five_b["vae"]}, WAN_T2V,
             [str(tmp_path)])
    with pytest.raises(UserInputError, match=r"holds a WanPipeline with expand_timesteps, but "
                                             r"'wan2.2_t2v_high_noise_14B_fp16.safetensors' is one without it"):
        plan(t2v["transformer"], {k: t2v[k] for k in ("transformer_2", "text_encoder", "vae")}, WAN_5B,
             [str(tmp_path)])
    assert plan(five_b["transformer"], {"vae": five_b["vae"]}, WAN_5B, [str(tmp_path)])[:2] == (
        str(tmp_path / WAN_5B), "WanPipeline")  # its full folder gives the text encoder


# ------------------------------------------------------------------- edit models: the text encoder's vision
EDIT_PLUS = "QwenImageEditPlusPipeline"


def test_the_qwen_text_encoder_file_has_comfy_orgs_vision_layout(sf_dir):
    """ComfyUI's Qwen25_7BVLI (comfy/text_encoders/llama.py) keeps the language model under 'model.' and the
    vision tower under 'visual.' (qwen_vl.py: patch_embed, blocks.N, merger)."""
    keys = single_file.HeaderView(files(sf_dir, "qwenimage-edit-2509")["text_encoder"]).keys()
    for key in ("visual.patch_embed.proj.weight", "visual.blocks.0.attn.qkv.weight", "visual.blocks.0.mlp.gate_proj.weight",
                "visual.merger.ln_q.weight", "visual.merger.mlp.0.weight", "visual.merger.mlp.2.weight",
                "model.embed_tokens.weight", "model.layers.0.self_attn.q_proj.bias"):
        assert key in keys, key
    assert not any(k.startswith(("model.visual.", "model.language_model.")) for k in keys)


def test_the_vision_tower_of_a_qwen_file_loads_equal_to_the_folder_for_an_edit_model(sf_dir):
    source, f = folder(sf_dir, "qwenimage-edit-2509"), files(sf_dir, "qwenimage-edit-2509")
    notes = []
    got = load_pipeline(PipelineHandle.of(source=source, model_class=EDIT_PLUS, files=[("text_encoder", f["text_encoder"])]),
                        CPU, notes=notes).text_encoder.state_dict()
    want = load_pipeline(PipelineHandle.of(source=source, model_class=EDIT_PLUS), CPU).text_encoder.state_dict()
    assert sorted(got) == sorted(want) and all(torch.equal(want[k], got[k]) for k in want)
    assert len([k for k in want if "visual." in k]) > 10 and not notes


def test_a_text_only_qwen_file_is_refused_for_an_edit_model_and_noted_for_text_to_image(sf_dir):
    text_only = files(sf_dir, "qwenimage")["text_encoder_text_only"]
    assert not any("visual." in k for k in single_file.HeaderView(text_only).keys())
    cache = PipelineCache()
    with pytest.raises(ModelLoadError, match=r"'qwen_2.5_vl_7b_text_only.safetensors' has no vision part, but "
                                             r"QwenImageEditPlusPipeline feeds the input images .* edit model needs it"
                                             r".*ComfyUI's qwen_2.5_vl_7b_fp8_scaled.safetensors carries it"):
        cache.get(PipelineHandle.of(source=folder(sf_dir, "qwenimage-edit-2509"), model_class=EDIT_PLUS,
                                    files=[("text_encoder", text_only)]), CPU)
    assert len(cache) == 0
    notes = []
    pipe = load_pipeline(PipelineHandle.of(source=folder(sf_dir, "qwenimage"), model_class="QwenImagePipeline",
                                           files=[("text_encoder", text_only)]), CPU, notes=notes)
    assert any("has no vision weights" in n and "stay random" in n for n in notes), notes
    assert image(pipe).shape == (1, 64, 64, 3)


def test_a_qwen_file_missing_part_of_its_vision_tower_is_refused_for_an_edit_model(sf_dir, tmp_path):
    from safetensors.torch import load_file

    weights = load_file(files(sf_dir, "qwenimage-edit-2509")["text_encoder"])
    del weights["visual.merger.mlp.2.weight"]
    path = tmp_path / "qwen_2.5_vl_7b_fp8_scaled.safetensors"
    save_file(weights, str(path))
    with pytest.raises(ModelLoadError, match=r"has no vision part \(1 vision tensors missing, e.g. "
                                             r"model.visual.merger.mlp.2.weight\)"):
        load_pipeline(PipelineHandle.of(source=folder(sf_dir, "qwenimage-edit-2509"), model_class=EDIT_PLUS,
                                        files=[("text_encoder", str(path))]), CPU)


@pytest.mark.parametrize("version", ["2509", "2511"])
def test_qwen_image_edit_files_match_the_folder(sf_dir, version):
    """2509 is plain fp8 (e4m3fn: 3 mantissa bits), 2511 bf16; 2511's folder sets zero_cond_t."""
    name = f"qwenimage-edit-{version}"
    source, f = folder(sf_dir, name), files(sf_dir, name)
    assert single_file.model_class_of(f["transformer"]) == EDIT_PLUS
    picked = [("transformer", f["transformer"]), ("text_encoder", f["text_encoder"]), ("vae", f["vae"])]
    from_files = load_pipeline(PipelineHandle.of(source=source, model_class=EDIT_PLUS, files=picked), CPU)
    from_folder = load_pipeline(PipelineHandle.of(source=source, model_class=EDIT_PLUS), CPU)
    assert from_files.transformer.config.zero_cond_t == (version == "2511")
    for component, _ in picked:
        want, got = from_folder.components[component].state_dict(), from_files.components[component].state_dict()
        assert sorted(want) == sorted(got), component
        for k in want:
            if component == "transformer":  # the file's precision; unscaled e4m3fn's subnormal step is 2^-9
                assert torch.allclose(got[k], want[k], rtol=0.07, atol=2 ** -10), k
            else:
                assert torch.equal(got[k], want[k]), k


def test_flux1_fill_file_matches_the_folder(sf_dir):
    """BFL's Fill file: BFL layout, bf16, 384 input channels (diffusers tells it by that width: flux-fill)."""
    source, path = folder(sf_dir, "flux1-fill-wide"), files(sf_dir, "flux1-fill-wide")["transformer"]
    assert single_file.model_class_of(path) == "FluxFillPipeline"
    got = load_pipeline(PipelineHandle.of(source=source, model_class="FluxFillPipeline", files=[("transformer", path)]),
                        CPU).transformer.state_dict()
    want = load_pipeline(PipelineHandle.of(source=source, model_class="FluxFillPipeline"), CPU).transformer.state_dict()
    assert sorted(got) == sorted(want) and got["x_embedder.weight"].shape[1] == 384
    assert all(torch.equal(got[k], want[k]) for k in want)


def test_flux1_kontext_file_is_flux1_devs_transformer_in_comfyuis_older_scaled_fp8(sf_dir):
    """From the headers only: reading and de-scaling ~0.5B fp8 weights costs ~20 s here, and what it would
    check is covered (the older scaled fp8 by the T5 file, the BFL converter by flux1-dev.safetensors, whose
    weights the Kontext folder shares)."""
    kontext = single_file.HeaderView(files(sf_dir, "flux1-kontext-wide")["transformer"])
    dev = single_file.HeaderView(files(sf_dir, "flux1-wide")["transformer"])
    assert single_file.model_class_of(kontext) == "FluxKontextPipeline"
    weights = [k for k in kontext if k != "scaled_fp8" and not k.endswith(".scale_weight")]
    assert "scaled_fp8" in kontext and sorted(weights) == sorted(dev)
    assert all(kontext[k].shape == dev[k].shape for k in weights)
    assert sum(k.endswith(".scale_weight") for k in kontext) == sum(len(dev[k].shape) == 2 for k in dev)


def test_one_read_of_a_checkpoint_serves_all_its_components(sf_dir, monkeypatch):
    reads = []
    read_weights = single_file.read_weights
    monkeypatch.setattr(single_file, "read_weights", lambda path, *args: reads.append(path) or read_weights(path, *args))
    ckpt = files(sf_dir, "sd3")["checkpoint"]
    load_pipeline(PipelineHandle.of(source=folder(sf_dir, "sd3"), model_class=SD3,
                                 files=[(n, ckpt) for n in ("transformer", "vae", "text_encoder")]), CPU)
    assert reads == [ckpt]


@pytest.mark.parametrize("key", ["t5xxl_fp8", "transformer_fp8"])
def test_scaled_fp8_files_are_upcast_and_descaled(sf_dir, key):
    """Older (scaled_fp8 + .scale_weight) and newer (.weight_scale + .comfy_quant) ComfyUI fp8 formats."""
    family, plain = ("flux1-dev", "t5xxl") if key == "t5xxl_fp8" else ("flux1-wide", "transformer")
    f = files(sf_dir, family)
    fp8 = single_file.read_weights(f[key], torch.float32)
    full = single_file.read_weights(f[plain], torch.float32)
    assert sorted(fp8) == sorted(full)  # the scale and marker keys are gone
    for k in full:
        assert fp8[k].dtype == torch.float32
        # e4m3 keeps 3 mantissa bits: 1/16 relative error, and values near 0 flush to the scale's step
        assert torch.allclose(fp8[k], full[k], rtol=0.07, atol=full[k].abs().max().item() * 2 ** -9), k
        assert not torch.equal(fp8[k], full[k]) or full[k].dim() != 2


def test_plain_fp8_is_upcast_and_a_checkpoints_scaled_fp8_marker_is_dropped(tmp_path):
    weight = torch.randn(4, 4)
    path = tmp_path / "model.safetensors"
    save_file({"model.diffusion_model.scaled_fp8": torch.empty(0, dtype=torch.float8_e4m3fn),
               "model.diffusion_model.a.weight": (weight / 0.5).to(torch.float8_e4m3fn),
               "model.diffusion_model.a.scale_weight": torch.tensor(0.5),
               "model.diffusion_model.a.scale_input": torch.tensor(1.0),
               "first_stage_model.b.weight": weight.to(torch.float8_e5m2)}, str(path))
    got = single_file.read_weights(str(path), torch.bfloat16)
    assert sorted(got) == ["first_stage_model.b.weight", "model.diffusion_model.a.weight"]
    assert all(t.dtype == torch.bfloat16 for t in got.values())
    assert torch.allclose(got["model.diffusion_model.a.weight"].float(), weight, rtol=0.07, atol=0.02)
    assert torch.allclose(got["first_stage_model.b.weight"].float(), weight, rtol=0.13, atol=0.02)


def test_fp8_text_encoder_loads_into_the_pipeline(sf_dir):
    f = files(sf_dir, "flux1-dev")
    pipe = load_pipeline(PipelineHandle.of(source=folder(sf_dir, "flux1-dev"), model_class="FluxPipeline",
                                        files=[("text_encoder_2", f["t5xxl_fp8"])]), CPU)
    ref = load_pipeline(PipelineHandle.of(source=folder(sf_dir, "flux1-dev"), model_class="FluxPipeline"), CPU)
    got, want = pipe.text_encoder_2.state_dict(), ref.text_encoder_2.state_dict()
    assert all(torch.allclose(got[k], want[k], rtol=0.07, atol=want[k].abs().max().item() * 2 ** -9) for k in want)
    assert image(pipe).shape == (1, 64, 64, 3)


# ------------------------------------------------------------------------------------- detection
def test_family_and_default_config_repo_are_detected_from_the_header(sf_dir):
    assert single_file.model_class_of(files(sf_dir, "flux1-wide")["transformer"]) == "FluxPipeline"
    assert single_file.model_class_of(files(sf_dir, "sd3")["checkpoint"]) == SD3
    assert single_file.model_class_of(files(sf_dir, "flux2")["transformer"]) == "Flux2Pipeline"
    assert single_file.model_class_of(files(sf_dir, "qwenimage")["transformer"]) == "QwenImagePipeline"
    # diffusers' own detection names the repo where it can size the model; else the family's default
    assert single_file.default_config_repo(files(sf_dir, "flux1-wide")["transformer"]) == "black-forest-labs/FLUX.1-dev"
    assert single_file.default_config_repo(files(sf_dir, "flux2")["transformer"]) == "black-forest-labs/FLUX.2-dev"
    assert single_file.default_config_repo(files(sf_dir, "sd3")["checkpoint"]) == "stabilityai/stable-diffusion-3.5-medium"


@pytest.mark.parametrize("name, model_class, repo", [
    ("flux1-kontext-wide", "FluxKontextPipeline", "black-forest-labs/FLUX.1-Kontext-dev"),  # by its name
    ("flux1-fill-wide", "FluxFillPipeline", "black-forest-labs/FLUX.1-Fill-dev"),  # by its keys (384 channels)
    ("qwenimage-edit-2509", "QwenImageEditPlusPipeline", "Qwen/Qwen-Image-Edit-2509"),
    ("qwenimage-edit-2511", "QwenImageEditPlusPipeline", "Qwen/Qwen-Image-Edit-2511"),
])
def test_edit_and_fill_files_load_as_their_model_with_their_own_configs(sf_dir, tmp_path, name, model_class, repo):
    from tpu_diffusers_runtime.file_choice import plan

    model = files(sf_dir, name)["transformer"]
    assert single_file.model_class_of(model) == model_class and single_file.default_config_repo(model) == repo
    flux = files(sf_dir, "flux1-wide")  # Kontext and Fill take FLUX.1-dev's encoders and VAE
    picked = dict(text_encoder=flux["clip_l"], text_encoder_2=flux["t5xxl"], vae=flux["ae"]) if "flux1" in name \
        else {kind: path for kind, path in files(sf_dir, name).items() if kind in ("text_encoder", "vae")}
    # configs auto: the folder in models/diffusers named like the repo, else the repo's config files
    assert plan(model, picked, "auto", [str(tmp_path)])[:2] == (repo, model_class)
    (tmp_path / repo.split("/")[-1]).symlink_to(folder(sf_dir, name))
    source, planned_class, planned = plan(model, picked, "auto", [str(tmp_path)])
    assert (source, planned_class) == (str(tmp_path / repo.split("/")[-1]), model_class)
    assert dict(planned)["transformer"] == model
    # a folder of the base model as configs is refused, naming how the file was told apart
    (tmp_path / "base").symlink_to(folder(sf_dir, "flux1-wide" if "flux1" in name else "qwenimage"))
    with pytest.raises(UserInputError, match=f"loads as a {model_class}"):
        plan(model, picked, "base", [str(tmp_path)])


@pytest.mark.parametrize("name", ["qwen_image_2512_fp8_e4m3fn.safetensors", "qwen_image_2512_bf16.safetensors"])
def test_qwen_image_2512_files_load_as_qwen_image_with_2512s_configs(sf_dir, tmp_path, name):
    """Qwen-Image-2512 has Qwen-Image's class and keys; its name picks Qwen/Qwen-Image-2512's configs, and a
    Qwen-Image folder picked as configs is taken (same class). The bf16 file loads as the folder's weights in bf16."""
    from tpu_diffusers_runtime.file_choice import plan

    qwen = files(sf_dir, "qwenimage")
    model = str(tsf.qwenimage_2512_file(folder(sf_dir, "qwenimage"), tmp_path / "files", name))
    assert single_file.model_class_of(model) == "QwenImagePipeline"
    assert single_file.default_config_repo(model) == "Qwen/Qwen-Image-2512"
    assert single_file.default_config_repo(qwen["transformer"]) == "Qwen/Qwen-Image"
    picked = {kind: qwen[kind] for kind in ("text_encoder", "vae")}
    roots = [str(tmp_path / "diffusers")]
    (tmp_path / "diffusers").mkdir()
    assert plan(model, picked, "auto", roots)[:2] == ("Qwen/Qwen-Image-2512", "QwenImagePipeline")
    (tmp_path / "diffusers" / "Qwen-Image-2512").symlink_to(folder(sf_dir, "qwenimage"))
    (tmp_path / "diffusers" / "Qwen-Image").symlink_to(folder(sf_dir, "qwenimage"))
    assert plan(model, picked, "auto", roots)[0] == str(tmp_path / "diffusers" / "Qwen-Image-2512")
    source, model_class, planned = plan(model, picked, "Qwen-Image", roots)
    assert (source, model_class) == (str(tmp_path / "diffusers" / "Qwen-Image"), "QwenImagePipeline")
    assert dict(planned)["transformer"] == model
    if "bf16" in name:
        got = load_pipeline(PipelineHandle.of(source=source, model_class=model_class, files=[("transformer", model)]),
                            CPU).transformer.state_dict()
        want = load_pipeline(PipelineHandle.of(source=source, model_class=model_class), CPU).transformer.state_dict()
        assert sorted(got) == sorted(want)
        assert all(torch.equal(got[k], want[k].to(torch.bfloat16).to(got[k].dtype)) for k in want)


def test_qwen_image21_from_comfy_org_files_matches_the_folder(sf_dir):
    """Qwen-Image 2.1: ComfyUI's diffusion model (fused gate_up, bf16), the Qwen3-VL text encoder, its VAE."""
    source, f = folder(sf_dir, "qwenimage21"), files(sf_dir, "qwenimage21")
    assert single_file.model_class_of(f["transformer"]) == "QwenImage21Pipeline"
    assert single_file.default_config_repo(f["transformer"]) == "Qwen/Qwen-Image-2.1"
    assert_same_pipeline(source, "QwenImage21Pipeline", (
        ("transformer", f["transformer"]), ("text_encoder", f["text_encoder"]), ("vae", f["vae"])),
        image_at_default_text_length)


def flux3_image(pipe):
    """`image` for FLUX 3 [klein]'s modular pipeline (one prompt per call, its outputs asked for by name)."""
    return pipe(prompt="a photo of a cat", height=64, width=64, num_inference_steps=2, output_type="np",
                generator=torch.Generator().manual_seed(0), output="images")


def test_flux3_from_comfy_org_files_matches_the_folder(sf_dir):
    """FLUX 3 [klein]: the diffusion model in BFL's layout (bf16), the Qwen3-VL text encoder (vision tower included)
    and FLUX.2's VAE into the modular pipeline of a folder that has only a modular_model_index.json; the distilled
    model's file (its flow map's second timestep embedder) is told by diffusers' model type, with its configs."""
    source, f = folder(sf_dir, "flux3"), files(sf_dir, "flux3")
    assert not os.path.exists(os.path.join(source, "model_index.json"))
    assert single_file.model_class_of(f["transformer"]) == "Flux3ModularPipeline"
    assert single_file.default_config_repo(f["transformer"]) == "black-forest-labs/flux-3-image-klein-base"
    distilled = files(sf_dir, "flux3-distilled")["transformer"]
    assert single_file.model_class_of(distilled) == "Flux3DistilledModularPipeline"
    assert single_file.default_config_repo(distilled) == "black-forest-labs/flux-3-image-klein"
    assert_same_pipeline(source, "Flux3ModularPipeline", (
        ("transformer", f["transformer"]), ("text_encoder", f["text_encoder"]), ("vae", f["vae"])), flux3_image)


def video_and_sound(pipe):
    """LTX-2's frames and its sound track, side by side in one array (9 frames of 32x32, two steps)."""
    import numpy as np

    made = pipe(prompt="a corgi on a beach", negative_prompt="", height=32, width=32, num_frames=9, frame_rate=24.0,
                num_inference_steps=2, guidance_scale=3.0, generator=torch.Generator().manual_seed(0), output_type="np")
    return np.concatenate([made.frames.reshape(-1), made.audio.float().numpy().reshape(-1)])


@pytest.mark.parametrize("model, configs_repo", [("ltx2", "Lightricks/LTX-2"), ("ltx23", "diffusers/LTX-2.3-Diffusers")])
def test_ltx2_from_its_all_in_one_checkpoint_and_gemma_file_matches_the_folder(sf_dir, model, configs_repo):
    """LTX-2 and LTX-2.3 from Lightricks' all-in-one checkpoint (ltx-2-19b-dev / ltx-2.3-22b-dev: the diffusion
    model, the text connectors split between the diffusion model and the top-level text projection, the video and
    audio VAEs, the vocoder) and ComfyUI's Gemma 3 file: every component holds exactly the folder's weights; frames and
    sound are the folder's. LTX-2.3's layout (renamed prompt modulation, a projection per modality, gated connectors,
    a fourth decoder stage, the vocoder with bandwidth extension) is told from LTX-2's by its name, with its configs;
    its file is ltx-2.3-22b-dev-fp8 (ComfyUI's scaled fp8 diffusion model, of a folder holding those weights)."""
    source, f = folder(sf_dir, model), files(sf_dir, model)
    checkpoint = f["checkpoint"]
    assert single_file.components_in_checkpoint(checkpoint) == {
        "transformer": "model.diffusion_model.", "vae": "vae.", "connectors": "text_embedding_projection.",
        "audio_vae": "audio_vae.", "vocoder": "vocoder."}
    assert single_file.default_config_repo(checkpoint) == configs_repo
    assert_same_pipeline(source, "LTX2Pipeline", (
        *((name, checkpoint) for name in ("transformer", "connectors", "vae", "audio_vae", "vocoder")),
        ("text_encoder", f["text_encoder"])), video_and_sound)


@pytest.mark.parametrize("family, pipeline_class, configs_repo, sample", [
    ("krea2", "Krea2Pipeline", "krea/Krea-2-Turbo", image_at_default_text_length),
    ("qwenimage21", "QwenImage21Pipeline", "Qwen/Qwen-Image-2.1", image_at_default_text_length),
    ("flux3", "Flux3ModularPipeline", "black-forest-labs/flux-3-image-klein-base", flux3_image)])
def test_an_int8_convrot_diffusion_model_gives_the_folders_image_on_its_dequantized_weights(sf_dir, tmp_path, family,
                                                                                           pipeline_class,
                                                                                           configs_repo, sample):
    """ComfyUI's int8 ConvRot file of the diffusion model (Krea's original layout / Qwen-Image 2.1's fused gate_up)
    with the family's other files: the image of the folder whose transformer holds comfy-kitchen's dequantization
    of the same int8 weights, quantized in diffusers' layout (rows and layers quantize independently, so the
    layouts hold the same int8 data). Kept quantized (resident layers), the image is the same bit for bit."""
    from tpu_diffusers_runtime.resident_weights import ResidentLinear
    from tpu_diffusers_runtime.specs import QuantizedWeights

    source, f = folder(sf_dir, family), files(sf_dir, family)
    path = f["transformer_int8_convrot"]
    assert single_file.model_class_of(path) == pipeline_class
    assert single_file.default_config_repo(path) == configs_repo
    picked = (("transformer", path), ("text_encoder", f["text_encoder"]), ("vae", f["vae"]))
    pipes = {choice: load_pipeline(PipelineHandle.of(source=source, model_class=pipeline_class, files=picked,
                                                     quantized_weights=choice), CPU)
             for choice in (QuantizedWeights.DEQUANTIZE, QuantizedWeights.KEEP_QUANTIZED)}
    reference = load_pipeline(PipelineHandle.of(source=source, model_class=pipeline_class), CPU)
    in_diffusers_layout = tmp_path / "transformer_int8_convrot.safetensors"
    save_file(tsf.comfy_quantized(tsf.folder_weights(source, "transformer"), "int8_convrot", 16),
              str(in_diffusers_layout))
    reference.transformer.load_state_dict(single_file.read_weights(str(in_diffusers_layout),
                                                                   reference.transformer.dtype))
    got, want = pipes[QuantizedWeights.DEQUANTIZE].transformer.state_dict(), reference.transformer.state_dict()
    assert sorted(got) == sorted(want) and all(torch.equal(got[k], want[k]) for k in want)
    dequantized = sample(pipes[QuantizedWeights.DEQUANTIZE])
    assert (sample(reference) == dequantized).all()  # measured: not an ulp apart
    layers = [m for m in pipes[QuantizedWeights.KEEP_QUANTIZED].transformer.modules() if isinstance(m, ResidentLinear)]
    assert layers and any(m.params.convrot for m in layers)
    assert (sample(pipes[QuantizedWeights.KEEP_QUANTIZED]) == dequantized).all()


def test_a_non_diffusion_file_names_the_supported_families(sf_dir):
    with pytest.raises(UserInputError, match=r"clip_l.safetensors.*CLIP text encoder.*Supported: FLUX.1"):
        single_file.model_class_of(files(sf_dir, "sd3")["clip_l"])


@pytest.mark.parametrize("family, file, component, pipeline_class, pattern", [
    ("sd3", "clip_l", "vae", SD3, r"is a CLIP text encoder, but vae .* needs a FLUX.1/SD3 VAE"),
    ("flux1-dev", "ae", "text_encoder", "FluxPipeline", r"is a FLUX.1/SD3 VAE, but text_encoder .* needs a CLIP"),
    ("flux1-dev", "t5xxl", "text_encoder", "FluxPipeline", r"is a T5 text encoder, but text_encoder .* needs a CLIP"),
    ("flux1-wide", "transformer", "transformer", SD3, r"is a FLUX.1 diffusion model, but transformer of SD3/SD3.5"),
    ("sd3", "checkpoint_no_t5", "text_encoder_3", SD3, r"checkpoint without a text_encoder_3"),
    ("qwenimage", "text_encoder", "text_encoder", "Flux2Pipeline", r"Qwen2.5-VL .* needs a Mistral 3"),
    ("flux2-klein-wide", "transformer", "transformer", "Flux2Pipeline",
     r"is a FLUX.2 \[klein\] diffusion model, but transformer of FLUX.2 needs a FLUX.2 diffusion model"),
    ("flux2", "text_encoder", "text_encoder", "Flux2KleinPipeline", r"Mistral 3 .* FLUX.2 \[klein\] needs a Qwen3"),
    ("zimage", "text_encoder", "text_encoder", "QwenImagePipeline", r"is a Qwen3 text encoder, .* needs a Qwen2.5-VL"),
    ("zimage", "transformer", "transformer", "FluxPipeline", r"is a Z-Image diffusion model, but transformer of FLUX"),
    ("krea2", "text_encoder", "text_encoder", "ZImagePipeline", r"is a Qwen3-VL text encoder, .* needs a Qwen3 "),
    ("zimage", "text_encoder", "text_encoder", "Krea2Pipeline", r"is a Qwen3 text encoder, .* needs a Qwen3-VL"),
    ("krea2", "transformer", "transformer", "QwenImagePipeline", r"is a Krea 2 diffusion model, but transformer of Qw"),
    ("flux3", "transformer", "transformer", "Krea2Pipeline", r"is a FLUX 3 \[klein\] diffusion model, but transformer "
                                                             r"of Krea 2 needs a Krea 2 diffusion model"),
    ("krea2", "transformer", "transformer", "Flux3ModularPipeline", r"is a Krea 2 diffusion model, but transformer of "
                                                                    r"FLUX 3 \[klein\] needs a FLUX 3 \[klein\]"),
    ("flux3", "vae", "text_encoder", "Flux3ModularPipeline", r"is a FLUX.2 VAE, but text_encoder of FLUX 3 \[klein\] "
                                                             r"needs a Qwen3-VL"),
    ("wan22-ti2v-5b", "vae", "vae", "WanPipeline", r"is a Wan 2.2 VAE \(TI2V-5B\), but vae of Wan 2.2 needs a Wan 2.1"),
    ("wan22-t2v-a14b", "text_encoder", "text_encoder_2", "FluxPipeline", r"is a UMT5 text encoder \(Wan\), but "
                                                                         r"text_encoder_2 of FLUX.1 needs a T5"),
    ("wan22-t2v-a14b", "transformer", "transformer", "FluxPipeline",
     r"is a Wan diffusion model, but transformer of FLUX"),
    ("qwenimage21", "transformer", "transformer", "QwenImagePipeline",
     r"is a Qwen-Image 2.1 diffusion model, but transformer of QwenImage needs a QwenImage diffusion model"),
    ("qwenimage", "transformer", "transformer", "QwenImage21Pipeline",
     r"is a QwenImage diffusion model, but transformer of Qwen-Image 2.1 needs a Qwen-Image 2.1 diffusion model"),
    ("qwenimage21", "vae", "vae", "FluxPipeline", r"is a Qwen-Image 2.1 VAE, but vae of FLUX.1 needs a FLUX.1/SD3"),
    ("qwenimage21", "text_encoder", "text_encoder", "QwenImagePipeline",
     r"is a Qwen3-VL text encoder, .* needs a Qwen2.5-VL"),
])
def test_a_file_in_the_wrong_slot_is_refused_from_its_header(sf_dir, family, file, component, pipeline_class, pattern):
    with pytest.raises(UserInputError, match=pattern):
        single_file.check_file_for_slot(files(sf_dir, family)[file], component, pipeline_class)


def test_clip_l_where_clip_g_goes_fails_at_load_and_keeps_nothing(sf_dir):
    """Same kind (CLIP), other width: only the load can tell; the cache keeps nothing."""
    cache = PipelineCache()
    handle = PipelineHandle.of(source=folder(sf_dir, "sd3"), model_class=SD3,
                            files=[("text_encoder_2", files(sf_dir, "sd3")["clip_l"])])
    with pytest.raises(ModelLoadError, match="clip_l.safetensors' is not a CLIP text encoder for SD3/SD3.5"):
        cache.get(handle, CPU)
    assert len(cache) == 0 and cache.stats.loads == 0


@pytest.mark.parametrize("change", ["extra", "missing"])
def test_a_transformer_file_with_extra_or_missing_weights_is_refused(sf_dir, tmp_path, change):
    from safetensors.torch import load_file

    weights = load_file(files(sf_dir, "qwenimage")["transformer"])
    if change == "extra":
        weights["transformer_blocks.0.img_mod.1.extra"] = torch.zeros(2)
    else:
        del weights["proj_out.weight"]
    path = tmp_path / "qwen_image.safetensors"
    save_file(weights, str(path))
    cache = PipelineCache()
    with pytest.raises(ModelLoadError, match="is not a QwenImage diffusion model for QwenImage.*1 " + {"extra": "unexpected", "missing": "missing"}[change]):
        cache.get(PipelineHandle.of(source=folder(sf_dir, "qwenimage"), model_class="QwenImagePipeline",
                                 files=[("transformer", str(path))]), CPU)
    assert len(cache) == 0


def test_an_sd3_checkpoint_with_an_unknown_key_is_refused(sf_dir, tmp_path):
    from safetensors.torch import load_file

    weights = load_file(files(sf_dir, "sd3")["checkpoint"])
    weights["model.diffusion_model.joint_blocks.0.x_block.attn.extra.weight"] = torch.zeros(2)
    path = tmp_path / "sd3.5_medium.safetensors"
    save_file(weights, str(path))
    with pytest.raises(ModelLoadError, match="1 unexpected .*joint_blocks.0.x_block.attn.extra.weight"):
        load_pipeline(PipelineHandle.of(source=folder(sf_dir, "sd3"), model_class=SD3,
                                     files=[("transformer", str(path))]), CPU)


# ------------------------------------------------------------------------------ unsupported files
def test_gguf_is_refused_with_what_is_supported(tmp_path, sf_dir):
    path = tmp_path / "flux1-dev-Q4_K_S.gguf"
    path.write_bytes(b"GGUF" + b"\0" * 64)
    for call in (lambda: single_file.read_weights(str(path), torch.float32),
                 lambda: single_file.model_class_of(str(path))):
        with pytest.raises(UserInputError, match="GGUF.*supported are safetensors in bf16/fp16/fp32, or quantized as "
                                                 "ComfyUI writes it"):
            call()
    renamed = tmp_path / "model.safetensors"  # the magic, not the name, tells
    shutil.copy(path, renamed)
    with pytest.raises(UserInputError, match="GGUF"):
        single_file.read_weights(str(renamed), torch.float32)


def test_nf4_is_refused_with_what_is_supported(tmp_path):
    path = tmp_path / "flux1-dev-bnb-nf4.safetensors"
    save_file({"double_blocks.0.img_attn.qkv.weight": torch.zeros(8, dtype=torch.uint8),
               "double_blocks.0.img_attn.qkv.weight.absmax": torch.ones(1),
               "double_blocks.0.img_attn.qkv.weight.quant_map": torch.ones(16)}, str(path))
    with pytest.raises(UserInputError, match="bitsandbytes.*supported are safetensors"):
        single_file.read_weights(str(path), torch.float32)
    with pytest.raises(UserInputError, match="bitsandbytes"):
        single_file.model_class_of(str(path))


@pytest.mark.parametrize("convrot", [False, True], ids=["int8", "int8-convrot"])
def test_comfyuis_int8_is_read_exactly_as_comfy_kitchen_dequantizes_it(sf_dir, tmp_path, convrot):
    """ComfyUI's int8_tensorwise: int8 x a float32 scale per output row; with ConvRot (Hadamard-rotated per group of
    256 inputs, the rotation rebuilt by comfy-kitchen) the same after rotating back. Within a quantization step of
    the float weights (in norm per row), and the pipeline runs on exactly those weights."""
    from safetensors.torch import load_file

    source = folder(sf_dir, "qwenimage")
    reference = tsf.folder_weights(source, "transformer")
    path = tmp_path / f"qwen_image_{'int8_convrot' if convrot else 'int8'}.safetensors"
    save_file(tsf.comfy_int8(reference, convrot=convrot), str(path))
    stored = load_file(str(path))
    got = single_file.read_weights(str(path), torch.float32)
    assert sorted(got) == sorted(reference)
    weights = [k for k in reference if stored[k].dtype == torch.int8]
    assert len(weights) > 20 and all(reference[k].dim() == 2 for k in weights)
    assert any(b'"convrot": true' in bytes(stored[k[: -len("weight")] + "comfy_quant"].tolist()) for k in weights) \
        == convrot
    for k in weights:
        scale = stored[k[: -len(".weight")] + ".weight_scale"]
        assert scale.shape == (reference[k].shape[0], 1)
        if not convrot:
            assert torch.equal(got[k], stored[k].to(torch.float32) * scale), k  # exactly int8 x its row's scale
        # rounding to int8 moves each (rotated) weight by half a step at most, and the rotation keeps each row's
        # norm; the file's weights are quantized from their bf16 values (2^-8 relative)
        bound = scale[:, 0] / 2 * reference[k].shape[1] ** 0.5 + reference[k].norm(dim=1) * 2 ** -8 + 1e-6
        assert (got[k] - reference[k]).norm(dim=1).le(bound).all(), k
    pipe = load_pipeline(PipelineHandle.of(source=source, model_class="QwenImagePipeline",
                                           files=[("transformer", str(path))]), CPU)
    assert all(torch.equal(p, got[n]) for n, p in pipe.transformer.state_dict().items())
    assert image(pipe).shape == (1, 64, 64, 3)


@pytest.mark.parametrize("model_type, words", [
    ("hunyuan-video", "a HunyuanVideo video model"),
])
def test_int8_convrot_files_of_models_tpu_diffusers_lacks_are_refused_when_queued_naming_the_model(tmp_path,
                                                                                                  model_type, words):
    """ComfyUI's int8 ConvRot files are read, but a model TPU Diffusers does not run is refused from the header
    (the File Loader's plan), naming the model as diffusers tells it."""
    from tpu_diffusers_runtime.file_choice import plan

    path = str(tsf.unsupported_model_file(model_type, tmp_path / f"{model_type}_int8_convrot.safetensors"))
    with pytest.raises(UserInputError, match=f"'{os.path.basename(path)}' is not a diffusion model of a supported "
                                             rf"family \(it is {words}, which TPU Diffusers does not run yet\)"):
        plan(path, {}, "auto", [])


def test_truncated_file_is_named_with_re_download(tmp_path, sf_dir):
    path = tmp_path / "ae.safetensors"
    data = open(files(sf_dir, "flux1-dev")["ae"], "rb").read()
    path.write_bytes(data[: len(data) // 2])
    with pytest.raises(ModelLoadError, match="'ae.safetensors' is truncated or corrupt.*re-download"):
        single_file.check_file_for_slot(str(path), "vae", "FluxPipeline")
    cache = PipelineCache()
    with pytest.raises(ModelLoadError, match="truncated"):
        cache.get(PipelineHandle.of(source=folder(sf_dir, "flux1-dev"), model_class="FluxPipeline",
                                 files=[("vae", str(path))]), CPU)
    assert len(cache) == 0


# ------------------------------------------------------------------------------ config sources
def test_offline_hub_id_says_how_to_fetch_only_the_configs():
    with pytest.raises(UserInputError, match=r'hf download someone/some-model --exclude "\*.safetensors" "\*.bin" '
                                             r'"\*.pth" --local-dir ComfyUI/models/diffusers/some-model.*hf auth login'):
        single_file.config_folder("someone/some-model")


def test_a_config_only_folder_names_the_component_that_needs_a_file(sf_dir, tmp_path):
    configs = tmp_path / "sd3-configs"
    shutil.copytree(folder(sf_dir, "sd3"), configs)
    for weights in configs.glob("*/*.safetensors"):
        weights.unlink()
    f = files(sf_dir, "sd3")
    picked = [("transformer", f["checkpoint_no_t5"]), ("vae", f["checkpoint_no_t5"]), ("text_encoder", f["clip_l"]),
              ("text_encoder_2", f["clip_g"])]
    with pytest.raises(UserInputError, match=r"only the config of 'text_encoder_2'.*pick a weights file for text_encoder_2"):
        load_pipeline(PipelineHandle.of(source=str(configs), model_class=SD3, files=picked[:-1]), CPU)
    # SD3's T5 is optional: without a file or weights for it, the pipeline runs without it, as diffusers allows
    without_t5 = load_pipeline(PipelineHandle.of(source=str(configs), model_class=SD3, files=picked), CPU)
    assert without_t5.text_encoder_3 is None and without_t5.tokenizer_3 is None
    with_t5 = load_pipeline(PipelineHandle.of(source=str(configs), model_class=SD3,
                                           files=picked + [("text_encoder_3", f["t5xxl"])]), CPU)
    assert image(without_t5).shape == image(with_t5).shape == (1, 64, 64, 3)
    assert not (image(without_t5) == image(with_t5)).all()


def test_progress_names_each_component_loaded_from_files(sf_dir):
    seen = []
    f = files(sf_dir, "flux2")
    handle = PipelineHandle.of(source=folder(sf_dir, "flux2"), model_class="Flux2Pipeline", files=[("vae", f["vae"])])
    features.realise(PipelineCache(), handle, CPU, lambda done, total, what: seen.append(what))
    assert "loading vae" in seen and seen[-1] == "placed on cpu"
