"""LoRAs on loaded pipelines (runtime/lora.py): fused into the cached base pipeline's weights, switched without
a reload or a recompile, and the base restored bit for bit. Tiny LoRAs come from tools/tiny_loras.py."""

import dataclasses
import os
import re

import pytest
import torch
from safetensors.torch import save_file

import tiny_loras
from tpu_diffusers_runtime.features import compilation, lora as lora_module
from tpu_diffusers_runtime.engine import Engine
from tpu_diffusers_runtime.errors import LoraUnloadError, UserInputError
from tpu_diffusers_runtime.families import family_for
from tpu_diffusers_runtime.handle import PipelineHandle
from tpu_diffusers_runtime.loading import inspect_source, load_pipeline
from tpu_diffusers_runtime.features.lora import LoraState, apply_loras, check_lora_file, check_lora_fits
from tpu_diffusers_runtime.modes import outside_inference_mode
from tpu_diffusers_runtime.device import resolve_device
from tpu_diffusers_runtime.tasks import SampleRequest, run_pipeline
from tpu_diffusers_runtime.specs import CompileSpec, ExecutionMode, LoraSpec, MeshSpec, Placement

COMPILED_VS_EAGER_ATOL = 2e-3  # as in test_compile.py: inductor reorders float32 reductions
CHANGED = 1e-3  # a LoRA that changes the image changes some pixel by more than this


@pytest.fixture(scope="session")
def loras(tiny_dir, tmp_path_factory):
    """name -> LoRA file: '<family>' and '<family>-b' (diffusers format, two seeds), 'flux1-kohya' (with a CLIP
    layer), 'flux1-comfyui' (BFL names), 'qwenimage-lightx2v' (the Lightning LoRAs' layout), 'zimage'
    (ai-toolkit's diffusion_model. layout), 'krea2' (Krea's names under diffusion_model.), 'ltx2-comfyui'
    (Lightricks' diffusion_model. layout), 'wan-high' / 'wan-low'
    (lightx2v's Wan 2.2 4-step layout, one per expert of the tiny T2V A14B), built once."""
    root = tmp_path_factory.mktemp("loras")
    files = {}
    for family in ("flux1-schnell", "sd3", "flux2", "qwenimage", "flux2-klein", "qwenimage21", "flux3", "ltx2"):
        files[family] = tiny_loras.build(tiny_dir / f"tiny-{family}", root / f"{family}.safetensors", seed=1)
    files["flux1-schnell-b"] = tiny_loras.build(tiny_dir / "tiny-flux1-schnell", root / "flux1-b.safetensors", seed=2)
    files["zimage"] = tiny_loras.build(tiny_dir / "tiny-zimage", root / "zimage.safetensors", "comfyui", seed=1)
    files["krea2"] = tiny_loras.build(tiny_dir / "tiny-krea2", root / "krea2.safetensors", "comfyui", seed=1)
    files["ltx2-comfyui"] = tiny_loras.build(tiny_dir / "tiny-ltx2", root / "ltx2-comfyui.safetensors", "comfyui",
                                             seed=2)
    for fmt in ("kohya", "comfyui"):
        files[f"flux1-{fmt}"] = tiny_loras.build(tiny_dir / "tiny-flux1-schnell", root / f"flux1-{fmt}.safetensors",
                                                 fmt, seed=3)
    files["qwenimage-lightx2v"] = tiny_loras.build(tiny_dir / "tiny-qwenimage", root / "qwenimage-lightx2v.safetensors",
                                                   "lightx2v", seed=4)
    files["sdxl-kohya"] = tiny_loras.build(tiny_dir / "tiny-sdxl", root / "sdxl-kohya.safetensors", "kohya", seed=4)
    for seed, (name, expert) in enumerate((("wan-high", "transformer"), ("wan-low", "transformer_2")), start=5):
        files[name] = tiny_loras.build(tiny_dir / "tiny-wan22-t2v-a14b", root / f"{name}.safetensors", "lightx2v",
                                       seed=seed, expert=expert)
    return {name: str(path) for name, path in files.items()}


def handle(tiny, name="flux1-schnell", **fields):
    source = tiny(name)
    return PipelineHandle.of(source=source, model_class=inspect_source(source), **fields)


def request(**overrides):
    return SampleRequest(**{**dict(prompt="a cat sitting on a red chair", width=64, height=64, steps=2, seed=3),
                            **overrides})


def with_loras(base_handle, *loras):
    return base_handle.replace(loras=tuple(LoraSpec(*spec) for spec in loras))


def differs(a, b) -> bool:
    return (a - b).abs().max().item() > CHANGED


def test_strength_zero_is_the_base_strength_one_changes_it_and_none_restores_it_bit_for_bit(tiny, loras):
    engine = Engine()
    base_handle = handle(tiny)
    base = engine.generate(base_handle, request()).images
    zero = engine.generate(with_loras(base_handle, (loras["flux1-schnell"], 0.0)), request())
    assert torch.equal(zero.images, base)
    assert "LoRA: flux1-schnell.safetensors @ 0 (strength 0: not applied)" in zero.info.notes
    one = engine.generate(with_loras(base_handle, (loras["flux1-schnell"], 1.0)), request())
    assert differs(one.images, base)
    assert "LoRA: flux1-schnell.safetensors @ 1 (fused, 7 layers)" in one.info.notes
    entry = engine.realise(with_loras(base_handle, (loras["flux1-schnell"], 1.0)))[0]
    assert not any(True for _ in lora_module._lora_layers(entry.pipe))  # fused: no peft layer left, no per-step cost
    again = engine.generate(with_loras(base_handle, (loras["flux1-schnell"], 1.0)), request())  # nothing to do
    assert torch.equal(again.images, one.images)
    none = engine.generate(base_handle, request())
    assert torch.equal(none.images, base) and not any(n.startswith("LoRA") for n in none.info.notes)
    assert engine.cache.stats.loads == 1  # one base pipeline, never reloaded


def test_the_same_loras_again_load_nothing(tiny, loras):
    engine = Engine()
    lora_handle = with_loras(handle(tiny), (loras["flux1-schnell"], 0.7))
    entry = engine.realise(lora_handle)[0]
    assert entry.states["lora"].applied == lora_handle.loras

    def must_not_load(*_args, **_kwargs):
        raise AssertionError("the LoRA was loaded again")

    entry.pipe.load_lora_weights = must_not_load
    with outside_inference_mode():
        assert apply_loras(entry.pipe, lora_handle.loras, entry.states["lora"]) == \
            ["LoRA: flux1-schnell.safetensors @ 0.7 (fused, 7 layers)"]


@pytest.mark.parametrize("name", ["sd3", "flux2", "qwenimage", "flux2-klein", "zimage", "qwenimage21", "krea2",
                                  "flux3"])
def test_every_family_takes_its_lora_and_gives_the_base_back(tiny, loras, name):
    engine = Engine()
    base_handle = handle(tiny, name)
    base = engine.generate(base_handle, request()).images
    with_lora = engine.generate(with_loras(base_handle, (loras[name], 1.0)), request())
    assert differs(with_lora.images, base) and any("fused" in n for n in with_lora.info.notes)
    assert torch.equal(engine.generate(base_handle, request()).images, base)


def test_fused_strengths_match_peft_unfused_adapters(tiny, loras):
    """Fusing is only a faster way to run the same LoRA: the fused pipeline gives the image of diffusers' own
    unfused adapters with the same weights (set_adapters), for a chain of two LoRAs at other strengths."""
    engine = Engine()
    base_handle = handle(tiny)
    chain = (loras["flux1-schnell"], 0.5), (loras["flux1-schnell-b"], -0.8)
    fused = engine.generate(with_loras(base_handle, *chain), request()).images

    device = resolve_device(base_handle.device)
    with outside_inference_mode():
        pipe = load_pipeline(base_handle, device)
        for index, (path, _) in enumerate(chain):
            pipe.load_lora_weights(path, adapter_name=f"a{index}")
        pipe.set_adapters(["a0", "a1"], [strength for _, strength in chain])
        unfused = run_pipeline(pipe, family_for("FluxPipeline"), request()).images
    torch.testing.assert_close(fused, unfused, atol=1e-5, rtol=0)


def test_a_chain_of_two_and_a_changed_strength(tiny, loras):
    engine = Engine()
    base_handle = handle(tiny)
    a, b = loras["flux1-schnell"], loras["flux1-schnell-b"]
    base = engine.generate(base_handle, request()).images
    only_a = engine.generate(with_loras(base_handle, (a, 1.0)), request()).images
    chain = engine.generate(with_loras(base_handle, (a, 1.0), (b, 1.0)), request())
    assert differs(chain.images, only_a) and differs(chain.images, base)
    assert chain.info.notes[-2:] == ("LoRA: flux1-schnell.safetensors @ 1 (fused, 7 layers)",
                                     "LoRA: flux1-b.safetensors @ 1 (fused, 7 layers)")
    reversed_chain = engine.generate(with_loras(base_handle, (b, 1.0), (a, 1.0)), request()).images
    torch.testing.assert_close(reversed_chain, chain.images, atol=1e-5, rtol=0)  # fused deltas add up
    half = engine.generate(with_loras(base_handle, (a, 0.5)), request()).images
    assert differs(half, only_a) and differs(half, base)
    assert torch.equal(engine.generate(with_loras(base_handle, (a, 1.0)), request()).images, only_a)
    assert torch.equal(engine.generate(base_handle, request()).images, base)
    assert engine.cache.stats.loads == 1


@pytest.mark.parametrize("fmt, layers", [("kohya", 10), ("comfyui", 6)])
def test_kohya_and_comfyui_loras_load_and_change_the_image(tiny, loras, fmt, layers):
    """BFL layer names, converted by diffusers: a double block's fused qkv splits into to_q/to_k/to_v; the kohya
    file also has CLIP's first attention (lora_te1_), which lands in the text encoder."""
    engine = Engine()
    base_handle = handle(tiny)
    base = engine.generate(base_handle, request()).images
    result = engine.generate(with_loras(base_handle, (loras[f"flux1-{fmt}"], 1.0)), request())
    assert differs(result.images, base)
    assert f"LoRA: flux1-{fmt}.safetensors @ 1 (fused, {layers} layers)" in result.info.notes
    state = engine.realise(with_loras(base_handle, (loras[f"flux1-{fmt}"], 1.0)))[0].states["lora"]
    assert any(key.startswith("transformer.transformer_blocks.0.attn.to_k.") for key in state.backups)
    assert any(key.startswith("text_encoder.") for key in state.backups) == (fmt == "kohya")
    assert torch.equal(engine.generate(base_handle, request()).images, base)


@pytest.mark.parametrize("strength", [1.0, 0.6])
def test_a_lightx2v_lightning_lora_gives_the_image_of_diffusers_own_load_and_fuse(tiny, loras, strength):
    """lightx2v's layout (the Qwen-Image-2512 and Qwen-Image-Edit-2509 Lightning LoRAs: no prefix, lora_down/lora_up,
    alpha = rank / 8), read by diffusers' own QwenImage converter: every layer of the file is fused, and the image is
    plain diffusers' load_lora_weights + fuse_lora of the same file at that strength."""
    engine = Engine()
    base_handle = handle(tiny, "qwenimage")
    path = loras["qwenimage-lightx2v"]
    result = engine.generate(with_loras(base_handle, (path, strength)), request())
    layers = len(tiny_loras.LIGHTX2V_LINEARS) * 2  # the tiny transformer's two blocks
    assert f"LoRA: qwenimage-lightx2v.safetensors @ {strength:g} (fused, {layers} layers)" in result.info.notes
    with outside_inference_mode():
        pipe = load_pipeline(base_handle, resolve_device(base_handle.device))
        pipe.load_lora_weights(path)
        pipe.fuse_lora(lora_scale=strength)
        pipe.unload_lora_weights()
        plain = run_pipeline(pipe, family_for("QwenImagePipeline"), request()).images
    torch.testing.assert_close(result.images, plain, atol=1e-5, rtol=0)
    assert differs(result.images, engine.generate(base_handle, request()).images)


def test_an_sdxl_kohya_lora_fuses_into_the_unet_and_both_text_encoders_as_plain_diffusers_does(tiny, loras):
    """kohya's SGM block names and lora_te1_/lora_te2_ layers, converted by diffusers' own load_lora_weights:
    the fused pipeline gives the image of plain diffusers with that LoRA fused at the same strength."""
    import diffusers

    engine = Engine()
    base_handle = handle(tiny, "sdxl")
    base = engine.generate(base_handle, request()).images
    result = engine.generate(with_loras(base_handle, (loras["sdxl-kohya"], 0.8)), request())
    assert "LoRA: sdxl-kohya.safetensors @ 0.8 (fused, 12 layers)" in result.info.notes
    state = engine.realise(with_loras(base_handle, (loras["sdxl-kohya"], 0.8)))[0].states["lora"]
    assert {key.split(".")[0] for key in state.backups} == {"unet", "text_encoder", "text_encoder_2"}
    assert any(".down_blocks.1.attentions.0.transformer_blocks.0.attn2.to_k." in key for key in state.backups)
    with outside_inference_mode():
        pipe = diffusers.StableDiffusionXLPipeline.from_pretrained(tiny("sdxl"), local_files_only=True)
        pipe.load_lora_weights(loras["sdxl-kohya"])
        pipe.fuse_lora(lora_scale=0.8)
        plain = run_pipeline(pipe, family_for("StableDiffusionXLPipeline"), request()).images
    assert differs(result.images, base)
    torch.testing.assert_close(result.images, plain, atol=1e-5, rtol=0)
    assert torch.equal(engine.generate(base_handle, request()).images, base)


# the tiny T2V A14B's 3 steps run at timesteps 999, 960 (high-noise expert) and 857 (below its boundary 875: low)
WAN_REQUEST = dict(frames=5, guidance=1.0, steps=3)


def test_wan_lightx2v_loras_on_the_two_experts_give_plain_diffusers_frames_and_the_base_back(tiny, loras):
    """ComfyUI's Wan 2.2 4-step templates: lightx2v's high_noise LoRA on `transformer`, its low_noise LoRA on
    `transformer_2`. The frames are those of plain diffusers' load_lora_weights / load_lora_weights(...,
    load_into_transformer_2=True) + fuse_lora; each LoRA on its own changes them (so each lands in its expert),
    and no LoRA gives the base frames back bit for bit."""
    engine = Engine()
    base_handle = handle(tiny, "wan22-t2v-a14b")
    video = request(**WAN_REQUEST)
    base = engine.generate(base_handle, video).images
    pair = ((loras["wan-high"], 1.0, "high_noise"), (loras["wan-low"], 0.7, "low_noise"))
    result = engine.generate(with_loras(base_handle, *pair), video)
    layers = len(tiny_loras.WAN_LIGHTX2V_LINEARS) * 2  # the tiny experts' two blocks
    assert result.info.notes[-2:] == (f"LoRA: wan-high.safetensors @ 1 (fused, {layers} layers, high_noise: "
                                      "transformer)",
                                      f"LoRA: wan-low.safetensors @ 0.7 (fused, {layers} layers, low_noise: "
                                      "transformer_2)")
    state = engine.realise(with_loras(base_handle, *pair))[0].states["lora"]
    assert {key.split(".")[0] for key in state.backups} == {"transformer", "transformer_2"}
    with outside_inference_mode():
        pipe = load_pipeline(base_handle, resolve_device(base_handle.device))
        pipe.load_lora_weights(loras["wan-high"], adapter_name="high")
        pipe.load_lora_weights(loras["wan-low"], adapter_name="low", load_into_transformer_2=True)
        pipe.set_adapters(["high", "low"], [1.0, 0.7])
        pipe.fuse_lora(components=["transformer", "transformer_2"], adapter_names=["high", "low"])
        pipe.unload_lora_weights()
        plain = run_pipeline(pipe, family_for("WanPipeline"), video).images
    torch.testing.assert_close(result.images, plain, atol=1e-5, rtol=0)
    alone = {lora[2]: engine.generate(with_loras(base_handle, lora), video).images for lora in pair}
    assert all(differs(images, base) for images in alone.values())
    both = engine.generate(with_loras(base_handle, (loras["wan-high"], 1.0, "both")), video)
    assert both.info.notes[-1].endswith(f"(fused, {2 * layers} layers, both: transformer + transformer_2)")
    assert differs(both.images, alone["high_noise"])  # the low-noise expert's step changed too
    assert torch.equal(engine.generate(base_handle, video).images, base)
    assert engine.cache.stats.loads == 1


LTX2_REQUEST = dict(width=32, height=32, frames=9, guidance=3.0, steps=2)


@pytest.mark.parametrize("name, strength", [("ltx2", 1.0), ("ltx2-comfyui", 0.6)])
def test_ltx2_loras_give_plain_diffusers_frames_and_sound_and_the_base_back(tiny, loras, name, strength):
    """A LoRA on the LTX-2 transformer (its video, audio and audio-video attentions), in diffusers' layout and in
    Lightricks' / ComfyUI's (diffusion_model. names, which diffusers' LTX-2 loader converts): the frames and the sound
    track are those of plain diffusers' load_lora_weights + fuse_lora at the same strength, and differ from the base's;
    no LoRA gives the base back bit for bit."""
    engine = Engine()
    base_handle = handle(tiny, "ltx2")
    video = request(**LTX2_REQUEST)
    base = engine.generate(base_handle, video)
    result = engine.generate(with_loras(base_handle, (loras[name], strength)), video)
    assert "fused" in result.info.notes[-1]
    with outside_inference_mode():
        pipe = load_pipeline(base_handle, resolve_device(base_handle.device))
        pipe.load_lora_weights(loras[name], adapter_name="lora")
        pipe.set_adapters(["lora"], [strength])
        pipe.fuse_lora(components=["transformer"], adapter_names=["lora"])
        pipe.unload_lora_weights()
        plain = run_pipeline(pipe, family_for("LTX2Pipeline"), video)
    assert (result.images - plain.images).abs().max() <= 1 / 255
    torch.testing.assert_close(result.audio["waveform"], plain.audio["waveform"], atol=1e-4, rtol=0)
    assert differs(result.images, base.images) and differs(result.audio["waveform"], base.audio["waveform"])
    again = engine.generate(base_handle, video)
    assert torch.equal(again.images, base.images) and torch.equal(again.audio["waveform"], base.audio["waveform"])
    assert engine.cache.stats.loads == 1


def test_a_lora_for_a_second_expert_is_refused_on_a_one_transformer_model(tiny, loras):
    """low_noise and both ask for transformer_2: Wan 2.2 TI2V-5B and every image family have none. Refused from the
    configs alone (the node's check) and when fusing, with what to set; the base is left as it was."""
    def refusal(lora, model_class):
        return re.escape(f"LoRA '{os.path.basename(lora.path)}' is set to expert '{lora.expert}', which needs a "
                         f"second transformer (transformer_2, the low-noise expert of Wan 2.2 A14B), but this "
                         f"{model_class} has only one. Set the LoRA's expert to high_noise")

    low, flux_both = LoraSpec(loras["wan-low"], 1.0, "low_noise"), LoraSpec(loras["flux1-schnell"], 1.0, "both")
    check_lora_fits("WanPipeline", tiny("wan22-t2v-a14b"), low)
    check_lora_fits("WanPipeline", tiny("wan22-t2v-a14b"), LoraSpec(loras["wan-high"], 1.0, "both"))
    with pytest.raises(UserInputError, match=refusal(low, "WanPipeline")):
        check_lora_fits("WanPipeline", tiny("wan22-ti2v-5b"), low)
    with pytest.raises(UserInputError, match=refusal(flux_both, "FluxPipeline")):
        check_lora_fits("FluxPipeline", tiny("flux1-schnell"), flux_both)
    engine = Engine()
    five_b = handle(tiny, "wan22-ti2v-5b")
    video = request(**WAN_REQUEST, width=32, height=32)
    base = engine.generate(five_b, video).images
    with pytest.raises(UserInputError, match=refusal(low, "WanPipeline")):
        engine.generate(five_b.replace(loras=(low,)), video)
    assert torch.equal(engine.generate(five_b, video).images, base)


def test_a_lora_for_another_family_is_refused_and_the_base_is_left_bit_for_bit(tiny, loras):
    engine = Engine()
    base_handle = handle(tiny)
    base = engine.generate(base_handle, request()).images
    only_a = engine.generate(with_loras(base_handle, (loras["flux1-schnell"], 1.0)), request()).images
    with pytest.raises(UserInputError, match=r"LoRA 'sd3.safetensors' does not fit this FluxPipeline: .* it is a "
                                             r"LoRA for another model. Pick one made for this model, or remove it"):
        engine.generate(with_loras(base_handle, (loras["flux1-schnell"], 1.0), (loras["sd3"], 1.0)), request())
    entry = engine.realise(base_handle)[0]
    assert not any(True for _ in lora_module._lora_layers(entry.pipe))
    assert torch.equal(engine.generate(base_handle, request()).images, base)
    assert torch.equal(engine.generate(with_loras(base_handle, (loras["flux1-schnell"], 1.0)), request()).images,
                       only_a)


def test_a_lora_whose_layers_have_other_widths_is_refused_before_diffusers_widens_the_model(tiny, loras, tmp_path):
    """diffusers widens a FLUX.1 layer for a wider LoRA (control LoRAs); that would change the base model."""
    wide = tmp_path / "wide.safetensors"
    save_file({"transformer.x_embedder.lora_A.weight": torch.randn(4, 128),
               "transformer.x_embedder.lora_B.weight": torch.randn(32, 4)}, str(wide))
    engine = Engine()
    base_handle = handle(tiny)
    base = engine.generate(base_handle, request()).images
    with pytest.raises(UserInputError, match=r"'wide.safetensors' does not fit .*transformer.x_embedder is 64->32 "
                                             r"here, 128->32 in the LoRA"):
        engine.generate(with_loras(base_handle, (str(wide), 1.0)), request())
    assert engine.realise(base_handle)[0].pipe.transformer.x_embedder.in_features == 64
    assert torch.equal(engine.generate(base_handle, request()).images, base)


def test_corrupt_and_wrong_files_are_refused_with_what_to_do_and_the_base_is_unchanged(tiny, loras, tmp_path):
    data = open(loras["flux1-schnell"], "rb").read()
    cut_header = tmp_path / "cut_header.safetensors"
    cut_header.write_bytes(data[:100])
    header_length = int.from_bytes(data[:8], "little")
    cut_data = tmp_path / "cut_data.safetensors"  # the header is whole, the tensors are not
    cut_data.write_bytes(data[:8 + header_length + 16])
    pickle = tmp_path / "old.ckpt"
    pickle.write_bytes(data)
    full_model = tmp_path / "model.safetensors"
    save_file({"transformer_blocks.0.attn.to_q.weight": torch.zeros(2, 2)}, str(full_model))
    cases = {cut_header: "is not a readable safetensors file, it is truncated or corrupt .*download it again",
             cut_data: "truncated or corrupt .*download it again",
             pickle: "is not a .safetensors file; only safetensors LoRAs are loaded",
             full_model: "holds no LoRA weights .*is it a full model",
             tmp_path / "gone.safetensors": "does not exist"}
    engine = Engine()
    base_handle = handle(tiny)
    base = engine.generate(base_handle, request()).images
    for path, message in cases.items():
        with pytest.raises(UserInputError, match=message):
            engine.generate(with_loras(base_handle, (loras["flux1-schnell"], 1.0), (str(path), 1.0)), request())
        assert torch.equal(engine.generate(base_handle, request()).images, base), path
    for path in (cut_header, pickle, full_model):
        with pytest.raises(UserInputError):
            check_lora_file(str(path))  # queue time, headers only
    check_lora_file(loras["flux1-kohya"])


def test_the_lora_node_check_refuses_another_family_from_the_configs_alone(tiny, loras):
    """check_lora_fits (the TPU LoRA node's check) builds the models on the meta device: no weights loaded."""
    for name in ("flux1-schnell", "sd3", "flux2", "qwenimage", "flux2-klein", "zimage", "qwenimage21", "krea2",
                 "flux3"):
        check_lora_fits(inspect_source(tiny(name)), tiny(name), LoraSpec(loras[name]))
    check_lora_fits("FluxPipeline", tiny("flux1-schnell"), LoraSpec(loras["flux1-kohya"]))
    for model in ("qwenimage", "qwenimage-edit-plus"):  # Qwen-Image-2512 and Edit-2509 take the Lightning layout
        check_lora_fits(inspect_source(tiny(model)), tiny(model), LoraSpec(loras["qwenimage-lightx2v"]))
    check_lora_fits("StableDiffusionXLPipeline", tiny("sdxl"), LoraSpec(loras["sdxl-kohya"]))
    with pytest.raises(UserInputError, match="LoRA 'sdxl-kohya.safetensors' .* FluxPipeline .*is it a LoRA for "):
        check_lora_fits("FluxPipeline", tiny("flux1-schnell"), LoraSpec(loras["sdxl-kohya"]))
    with pytest.raises(UserInputError, match="LoRA 'sd3.safetensors' does not fit this FluxPipeline"):
        check_lora_fits("FluxPipeline", tiny("flux1-schnell"), LoraSpec(loras["sd3"]))
    with pytest.raises(UserInputError, match="LoRA 'flux1-schnell.safetensors' does not fit this QwenImagePipeline"):
        check_lora_fits("QwenImagePipeline", tiny("qwenimage"), LoraSpec(loras["flux1-schnell"]))


def test_model_cpu_offload_keeps_its_hooks_and_device(tiny, loras):
    device_handle = handle(tiny)
    offload_handle = handle(tiny, placement=Placement.MODEL_CPU_OFFLOAD)
    lora = (loras["flux1-kohya"], 0.9)
    on_device = Engine().generate(with_loras(device_handle, lora), request()).images
    engine = Engine()
    base = engine.generate(offload_handle, request()).images
    offloaded = engine.generate(with_loras(offload_handle, lora), request()).images
    torch.testing.assert_close(offloaded, on_device, atol=1e-5, rtol=0)
    assert differs(offloaded, base)
    pipe = engine.realise(with_loras(offload_handle, lora))[0].pipe
    assert pipe._all_hooks and pipe._execution_device.type == "cpu"
    assert hasattr(pipe.transformer, "_hf_hook")
    assert torch.equal(engine.generate(offload_handle, request()).images, base)


def test_lora_switch_compiles_nothing(tiny, loras):
    """One compile; then LoRA A, kohya B, B at another strength and no LoRA change weight values in place:
    dynamo compiles no graph, and no LoRA means the compiled base image bit for bit."""
    engine = Engine()
    compiled = handle(tiny, mode=ExecutionMode.COMPILED, compile=CompileSpec())
    first = engine.generate(compiled, request())
    assert first.info.compiled_now is True
    switches = {"A": ((loras["flux1-schnell"], 1.0),), "B": ((loras["flux1-kohya"], 1.0),),
                "B at 0.4": ((loras["flux1-kohya"], 0.4),), "none": ()}
    images = {}
    for name, chain in switches.items():
        with compilation.watch_compiles() as activity:
            result = engine.generate(with_loras(compiled, *chain), request())
        assert (activity.graphs, result.info.compiled_now) == (0, False), name
        images[name] = result.images
    assert torch.equal(images["none"], first.images)
    assert differs(images["A"], first.images) and differs(images["B"], images["B at 0.4"])
    eager = Engine().generate(with_loras(handle(tiny), (loras["flux1-schnell"], 1.0)), request()).images
    torch.testing.assert_close(images["A"], eager, atol=COMPILED_VS_EAGER_ATOL, rtol=0)
    assert engine.cache.stats.loads == 1


def test_lora_switch_under_model_offload_compiles_nothing(tiny, loras):
    """Model CPU offload compiles the repeated blocks; the offload hooks come off and back on around the LoRA
    work, and the compiled blocks keep their graphs."""
    engine = Engine()
    compiled = handle(tiny, mode=ExecutionMode.COMPILED, placement=Placement.MODEL_CPU_OFFLOAD,
                      compile=CompileSpec())
    first = engine.generate(compiled, request())
    assert first.info.compiled_now is True and engine.realise(compiled)[0].states["compilation"].scope == "repeated_blocks"
    images = {}
    for name, chain in {"A": ((loras["flux1-schnell"], 1.0),), "none": ()}.items():
        with compilation.watch_compiles() as activity:
            result = engine.generate(with_loras(compiled, *chain), request())
        assert (activity.graphs, result.info.compiled_now) == (0, False), name
        images[name] = result.images
    assert differs(images["A"], first.images) and torch.equal(images["none"], first.images)
    assert hasattr(engine.realise(compiled)[0].pipe.transformer, "_hf_hook")


def test_loras_with_a_tp_mesh_are_refused_before_anything_launches(tiny, loras, monkeypatch):
    engine = Engine()
    monkeypatch.setattr(engine.workers, "get", lambda *a, **k: pytest.fail("a worker group was launched"))
    mesh_handle = with_loras(handle(tiny, mesh=MeshSpec(chips=2)), (loras["flux1-schnell"], 1.0))
    with pytest.raises(UserInputError, match="LoRAs are not supported with tensor parallelism \\(tp above 1\\) "
                                             "yet: the sharded transformer's weights are DTensors"):
        engine.generate(mesh_handle, request())
    assert len(engine.cache) == 0


def test_a_fresh_state_applies_and_restores_on_a_bare_pipeline(tiny, loras):
    """apply_loras on its own (no engine): the backups hold the base values, and restoring empties `changed`."""
    base_handle = handle(tiny)
    with outside_inference_mode():
        pipe = load_pipeline(base_handle, resolve_device("cpu"))
        before = {name: p.detach().clone() for name, p in pipe.transformer.named_parameters()}
        state = LoraState()
        apply_loras(pipe, (LoraSpec(loras["flux1-schnell"], 1.0),), state)
        after = dict(pipe.transformer.named_parameters())
        changed = {name for name in before if not torch.equal(before[name], after[name])}
        backed_up = {key.removeprefix("transformer.") for key in state.changed}
        assert changed == {name for name in backed_up if name.endswith(".weight")} and len(changed) == 7
        assert backed_up - changed == {name for name in backed_up if name.endswith(".bias")}  # whole layers
        assert all(torch.equal(base, before[key.removeprefix("transformer.")]) for key, (_, base)
                   in state.backups.items())
        assert apply_loras(pipe, (), state) == [] and not state.changed
        assert all(torch.equal(before[name], p) for name, p in pipe.transformer.named_parameters())


def test_a_lora_whose_layers_cannot_be_removed_after_an_error_drops_the_pipeline(tiny, loras, monkeypatch):
    """Should diffusers fail to remove the LoRA layers after another error, the pipeline (maybe still holding
    peft layers) is not reused: it is dropped, and the next run loads the base again and gives its image."""
    engine = Engine()
    base = engine.generate(handle(tiny), request()).images

    def fails(*_args, **_kwargs):
        raise RuntimeError("fusing failed")

    def cannot_unload(_pipe):
        raise RuntimeError("peft layer left")

    with monkeypatch.context() as patched:
        patched.setattr(lora_module, "_fuse", fails)
        patched.setattr(lora_module, "_unload", cannot_unload)
        with pytest.raises(LoraUnloadError, match="fusing failed; removing the LoRA layers afterwards "
                                                              "failed too .*peft layer left.*loads it again"):
            engine.generate(with_loras(handle(tiny), (loras["flux1-schnell"], 1.0)), request())
    assert len(engine.cache) == 0
    again = engine.generate(handle(tiny), request())
    assert again.info.loaded and torch.equal(again.images, base)
