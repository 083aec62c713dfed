"""Single files from ComfyUI's model folders (TPU File Loader) and LoRAs (TPU LoRA) through a real
ComfyUI server: each family from its files gives the image of its diffusers folder, LoRA strength 0
gives the base image and removing a LoRA gives it back bit for bit, switching LoRAs in compiled mode
compiles nothing, and wrong files are refused on the node that picked them.
"""

import json

import numpy as np
import pytest
from PIL import Image

import tiny_loras
import tiny_single_files
from serving import LOADER, MODE, SAMPLER, comfy_server, outcome, run_info, run_ok, sampler_prompt, with_compile

UNKNOWN_FORMAT_FILE = "z_image_turbo_svdq.safetensors"
LTX25_FILE = "ltx-2.5-22b-distilled-transformer-comfy-int8-convrot.safetensors"
FILE_LOADER_INPUTS = ("model", "text_encoder", "text_encoder_2", "text_encoder_3", "vae", "configs")
LORA_MODEL = "tiny-flux1-schnell"
# the files of workflows/qwen_image_2512_lightning_files_offload.json, by their names there
QWEN_2512_FILE = "qwen_image_2512_fp8_e4m3fn.safetensors"
QWEN_2512_LIGHTNING = "Qwen-Image-2512-Lightning-4steps-V1.0-fp32.safetensors"
# the 4-step LoRAs ComfyUI's Wan 2.2 T2V template turns on, by their names there (high noise, low noise)
WAN_T2V_LIGHTX2V = ("wan2.2_t2v_lightx2v_4steps_lora_v1.1_high_noise.safetensors",
                    "wan2.2_t2v_lightx2v_4steps_lora_v1.1_low_noise.safetensors")
# family (subfolder of the single_files fixture) -> (configs folder, the File Loader's picks)
FAMILIES = {
    "flux1": ("flux1-wide", ("flux1-wide/flux1-dev.safetensors", "flux1-wide/clip_l.safetensors",
                             "flux1-wide/t5xxl_fp16.safetensors", "none", "flux1-wide/ae.safetensors")),
    "sd3": ("tiny-sd3", ("sd3/sd3.5_medium.safetensors", "none", "none", "none", "none")),
    "sd3-separate-encoders": ("tiny-sd3", ("sd3/sd3.5_medium_no_t5.safetensors", "sd3/clip_l.safetensors",
                                           "sd3/clip_g.safetensors", "sd3/t5xxl_fp16.safetensors", "none")),
    "flux2": ("tiny-flux2", ("flux2/flux2_dev.safetensors", "flux2/mistral_3_small_flux2.safetensors", "none", "none",
                             "flux2/flux2-vae.safetensors")),
    "qwenimage": ("qwenimage", ("qwenimage/qwen_image.safetensors", "qwenimage/qwen_2.5_vl_7b_fp8_scaled.safetensors",
                                "none", "none", "qwenimage/qwen_image_vae.safetensors")),
    "zimage": ("zimage", ("zimage/z_image_turbo_bf16.safetensors", "zimage/qwen_3_4b.safetensors", "none", "none",
                          "zimage/ae.safetensors")),
    "qwenimage21": ("qwenimage21", ("qwenimage21/qwen_image_2.1_bf16.safetensors",
                                    "qwenimage21/qwen3vl_8b_bf16.safetensors", "none", "none",
                                    "qwenimage21/qwen_image_2.1_vae_bf16.safetensors")),
    "krea2": ("krea2", ("krea2/krea2_turbo_fp8_scaled.safetensors", "krea2/qwen3vl_4b_fp8_scaled.safetensors", "none",
                        "none", "krea2/qwen_image_vae.safetensors")),
    "flux3": ("flux3", ("flux3/flux3-image-klein-base-bf16.safetensors", "flux3/qwen3vl_4b.safetensors", "none",
                        "none", "flux3/flux2-vae.safetensors")),
}
# the files of workflows/flux3_klein_base_edit_files_offload.json, by their names there
FLUX3_TEMPLATE_FILES = ("flux3/flux3-image-klein-base-int8-convrot.safetensors",
                        "flux3/qwen3vl_4b_int8_convrot.safetensors", "none", "none", "flux3/flux2-vae.safetensors")


@pytest.fixture(scope="module")
def files_server(tiny_dir, single_files, tmp_path_factory):
    base = tmp_path_factory.mktemp("comfy-files")
    loras = base / "models" / "loras"
    folder = tiny_dir / LORA_MODEL
    tiny_loras.build(folder, loras / "style_a.safetensors", "diffusers", seed=0)
    tiny_loras.build(folder, loras / "style_b.safetensors", "diffusers", seed=1)
    tiny_loras.build(folder, loras / "kohya_style.safetensors", "kohya", seed=2)
    tiny_loras.build(tiny_dir / "tiny-sd3", loras / "an_sd3_lora.safetensors", "diffusers", seed=3)
    qwenimage = single_files["qwenimage"][0]
    tiny_loras.build(qwenimage, loras / QWEN_2512_LIGHTNING, "lightx2v", seed=4)
    for seed, (name, expert) in enumerate(zip(WAN_T2V_LIGHTX2V, ("transformer", "transformer_2")), start=5):
        tiny_loras.build(tiny_dir / "tiny-wan22-t2v-a14b", loras / name, "lightx2v", seed=seed, expert=expert)
    tiny_single_files.qwenimage_2512_file(qwenimage, base / "models" / "diffusion_models", QWEN_2512_FILE)
    (base / "models" / "diffusers").mkdir(parents=True, exist_ok=True)
    (base / "models" / "diffusers" / "Qwen-Image-2512").symlink_to(qwenimage)  # configs auto: named like the repo
    (loras / "cut_short.safetensors").write_bytes((loras / "style_a.safetensors").read_bytes()[:300])
    broken = base / "models" / "diffusion_models" / "broken"
    broken.mkdir(parents=True)
    (broken / "flux1-dev-Q4_K_S.gguf").write_bytes(b"GGUF" + bytes(64))
    cut = single_files["flux2"][1]["transformer"]
    (broken / "cut_short.safetensors").write_bytes(cut.read_bytes()[:2000])
    tiny_single_files.unsupported_model_file("hunyuan-video", broken / "hunyuan-video-int8_convrot.safetensors")
    quantized = tiny_single_files.zimage_quantized_files(single_files["zimage"][0], base / "models")
    unknown_format(quantized["int8"]["transformer"], broken / UNKNOWN_FORMAT_FILE)
    wrong_slot = base / "models" / "vae" / "broken"
    wrong_slot.mkdir(parents=True)
    (wrong_slot / "clip_l.safetensors").symlink_to(single_files["flux1-wide"][1]["clip_l"])
    with comfy_server(base, tiny_dir, single_files=single_files) as running:
        yield running


def unknown_format(source, target) -> None:
    """A copy of a quantized file whose layers claim a format ComfyUI's comfy-kitchen does not know."""
    import torch
    from safetensors.torch import load_file, save_file

    marker = torch.tensor(list(json.dumps({"format": "svdquant_w4a4"}).encode()), dtype=torch.uint8)
    save_file({k: marker.clone() if k.endswith(".comfy_quant") else v for k, v in load_file(str(source)).items()},
              str(target))


def files_prompt(configs: str, picks: tuple, **sampler_inputs) -> dict:
    prompt = sampler_prompt(**sampler_inputs)
    prompt[LOADER] = {"class_type": "TPUFileLoader", "inputs": {
        **dict(zip(FILE_LOADER_INPUTS, (*picks, configs))), "dtype": "auto", "device": "auto"}}
    return prompt


def with_loras(prompt: dict, *loras: tuple) -> dict:
    """TPU LoRA nodes "11", "12", ... chained between the loader and the Mode Selector: (name, strength[, expert])."""
    upstream = prompt[MODE]["inputs"]["pipeline"]
    for index, (name, strength, *expert) in enumerate(loras):
        node = str(11 + index)
        prompt[node] = {"class_type": "TPULora", "inputs": {"pipeline": upstream, "lora_name": name,
                                                            "strength": strength, **dict(zip(["expert"], expert))}}
        upstream = [node, 0]
    prompt[MODE]["inputs"]["pipeline"] = upstream
    return prompt


def refused_on(server, prompt: dict, node: str) -> str:
    """The prompt is refused when queued, on `node`; returns the message."""
    how, where, text, _ = outcome(server, prompt)
    assert (how, where) == ("rejected", node), (how, where, text)
    return text


def pixels(server, entry) -> np.ndarray:
    [path] = server.output_images(entry)
    return np.asarray(Image.open(path), dtype=np.int16)


@pytest.mark.parametrize("family", FAMILIES)
def test_a_family_from_single_files_gives_the_image_of_its_folder(files_server, family):
    configs, picks = FAMILIES[family]
    same = dict(model=configs, seed=7, width=64, height=64, steps=2, guidance=3.5)
    from_folder = pixels(files_server, run_ok(files_server, sampler_prompt(**same)))
    entry = run_ok(files_server, files_prompt(configs, picks, **same))
    # identical weights; reading into fresh memory instead of a memory map may move CPU matmul rounding by
    # an ulp (the runtime tests measure 4e-6 on the image): at most one 8-bit level here
    assert np.abs(pixels(files_server, entry) - from_folder).max() <= 1
    assert run_info(entry)["loaded"]


def test_flux3_klein_from_its_int8_convrot_template_files_runs(files_server):
    """FLUX 3 [klein]'s template files (int8 ConvRot diffusion model and Qwen3-VL, FLUX.2's VAE) with its configs
    through the File Loader (quantized_weights auto): a real image, nothing refused.
    (test_single_file.py compares the int8 ConvRot file's image with the folder's dequantized weights.)"""
    entry = run_ok(files_server, files_prompt("flux3", FLUX3_TEMPLATE_FILES, seed=7, width=64, height=48, steps=2,
                                              guidance=3.5, prompt_upsampling=False))
    info = run_info(entry)
    assert info["pipeline"] == "Flux3ModularPipeline" and info["loaded"]
    assert np.std(pixels(files_server, entry)) > 1


def test_an_sdxl_checkpoint_gives_the_image_of_plain_diffusers_from_single_file(files_server, single_files):
    """sd_xl_base_1.0.safetensors from models/checkpoints (SGM UNet, OpenCLIP bigG) through the File Loader: the
    image plain diffusers' StableDiffusionXLPipeline.from_single_file makes for the seed, saved as ComfyUI does."""
    import torch
    from diffusers import StableDiffusionXLPipeline

    configs, checkpoint = single_files["sdxl"][0], single_files["sdxl"][1]["checkpoint"]
    same = dict(seed=9, width=64, height=64, steps=3, guidance=5.0)
    entry = run_ok(files_server, files_prompt("tiny-sdxl", ("sdxl/sd_xl_base_1.0.safetensors", "none", "none", "none",
                                                            "none"), negative_prompt="blurry", **same))
    assert run_info(entry)["pipeline"] == "StableDiffusionXLPipeline"
    pipe = StableDiffusionXLPipeline.from_single_file(str(checkpoint), config=str(configs), local_files_only=True)
    text = sampler_prompt()[SAMPLER]["inputs"]["prompt"]
    with torch.no_grad():
        plain = pipe(prompt=text, negative_prompt="blurry", height=64, width=64, num_inference_steps=3,
                     guidance_scale=5.0, generator=torch.Generator("cpu").manual_seed(9), output_type="np").images[0]
    expected = np.clip(plain * 255.0, 0, 255).astype(np.int16)  # SaveImage's 8 bits
    assert np.abs(pixels(files_server, entry) - expected).max() <= 1


def test_qwen_image_2512_lightning_from_files_gives_plain_diffusers_image_with_the_lora_fused(files_server,
                                                                                                single_files):
    """The graph of workflows/qwen_image_2512_lightning_files_offload.json (File Loader with configs auto, the
    Lightning LoRA in lightx2v's layout at strength 1, Mode Selector eager + model_cpu_offload, 4 steps, guidance
    1): the image plain diffusers makes from the same files (the fp8 transformer through from_single_file, the
    Qwen-Image folder's text encoder and VAE, which the other two files hold) with load_lora_weights + fuse_lora."""
    import torch
    from diffusers import QwenImagePipeline, QwenImageTransformer2DModel

    picks = (QWEN_2512_FILE, "qwenimage/qwen_2.5_vl_7b_fp8_scaled.safetensors", "none", "none",
             "qwenimage/qwen_image_vae.safetensors")
    same = dict(seed=42, width=64, height=64, steps=4, guidance=1.0)
    prompt = with_loras(files_prompt("auto", picks, placement="model_cpu_offload", **same), (QWEN_2512_LIGHTNING, 1.0))
    entry = run_ok(files_server, prompt)
    info = run_info(entry)
    assert info["pipeline"] == "QwenImagePipeline" and info["loaded"], info
    assert any(note.startswith(f"LoRA: {QWEN_2512_LIGHTNING} @ 1 (fused") for note in info["notes"]), info["notes"]
    folder, models = single_files["qwenimage"][0], files_server.base_dir / "models"
    transformer = QwenImageTransformer2DModel.from_single_file(
        str(models / "diffusion_models" / QWEN_2512_FILE), config=str(folder), subfolder="transformer",
        torch_dtype=torch.float32, local_files_only=True)
    pipe = QwenImagePipeline.from_pretrained(folder, transformer=transformer, local_files_only=True)
    text = sampler_prompt()[SAMPLER]["inputs"]["prompt"]

    def plain_image():
        with torch.no_grad():
            image = pipe(prompt=text, height=64, width=64, num_inference_steps=4, true_cfg_scale=1.0,
                         generator=torch.Generator("cpu").manual_seed(42), output_type="np").images[0]
        return np.clip(image * 255.0, 0, 255).astype(np.int16)  # SaveImage's 8 bits

    without_lora = plain_image()
    pipe.load_lora_weights(str(models / "loras" / QWEN_2512_LIGHTNING))
    pipe.fuse_lora()
    saved = pixels(files_server, entry)
    assert np.abs(saved - plain_image()).max() <= 1
    assert np.abs(saved - without_lora).max() > 1, "the tiny LoRA must change the image beyond the tolerance"


def test_wan_t2v_with_the_lightx2v_loras_on_its_two_experts_gives_plain_diffusers_frames(files_server, tiny_dir):
    """ComfyUI's Wan 2.2 T2V 4-step template's LoRAs through two TPU LoRA nodes, the high_noise file with expert
    high_noise and the low_noise file with expert low_noise, into the TPU Video Sampler (5 frames, 3 steps: the
    last below the tiny model's boundary, on transformer_2): the frames Save Image writes are plain diffusers'
    with load_lora_weights / load_lora_weights(..., load_into_transformer_2=True) + fuse_lora."""
    import torch
    from diffusers import WanPipeline

    prompt = sampler_prompt(model="tiny-wan22-t2v-a14b")
    text = prompt[SAMPLER]["inputs"]["prompt"]
    prompt[SAMPLER] = {"class_type": "TPUVideoSampler", "inputs": {
        "pipeline": prompt[SAMPLER]["inputs"]["pipeline"], "prompt": text, "negative_prompt": "", "width": 64,
        "height": 64, "frames": 5, "steps": 3, "guidance": 1.0, "seed": 21, "batch_size": 1}}
    high, low = WAN_T2V_LIGHTX2V
    entry = run_ok(files_server, with_loras(prompt, (high, 1.0, "high_noise"), (low, 1.0, "low_noise")))
    info = run_info(entry)
    assert info["pipeline"] == "WanPipeline" and info["frames"] == 5, info
    assert [note for note in info["notes"] if note.startswith("LoRA")] == [
        f"LoRA: {high} @ 1 (fused, 20 layers, high_noise: transformer)",
        f"LoRA: {low} @ 1 (fused, 20 layers, low_noise: transformer_2)"], info["notes"]
    saved = np.stack([np.asarray(Image.open(path), dtype=np.int16) for path in files_server.output_images(entry)])
    pipe = WanPipeline.from_pretrained(tiny_dir / "tiny-wan22-t2v-a14b", local_files_only=True)

    def plain_frames():
        with torch.no_grad():
            frames = pipe(prompt=text, negative_prompt="", height=64, width=64, num_frames=5, num_inference_steps=3,
                          guidance_scale=1.0, generator=torch.Generator("cpu").manual_seed(21),
                          output_type="np").frames[0]
        return np.clip(frames * 255.0, 0, 255).astype(np.int16)  # SaveImage's 8 bits

    without_loras = plain_frames()
    loras = files_server.base_dir / "models" / "loras"
    pipe.load_lora_weights(str(loras / high), adapter_name="high")
    pipe.load_lora_weights(str(loras / low), adapter_name="low", load_into_transformer_2=True)
    pipe.fuse_lora(components=["transformer", "transformer_2"])
    assert saved.shape == (5, 64, 64, 3)
    assert np.abs(saved - plain_frames()).max() <= 1
    assert np.abs(saved - without_loras).max() > 1, "the tiny LoRAs must change the frames beyond the tolerance"


def test_wan22_t2v_a14b_from_its_two_expert_files_gives_the_frames_of_plain_diffusers(files_server, single_files):
    """Comfy-Org's Wan 2.2 T2V A14B files through the File Loader (high-noise expert in model, low-noise in
    model_2, umt5_xxl, wan_2.1_vae) and the TPU Video Sampler: the frames plain diffusers makes from the same files
    (its from_single_file for the experts and the VAE, the folder's UMT5, which the umt5 file holds), saved as
    ComfyUI does. 3 steps: the last one is the low-noise expert's (boundary 0.875 at flow shift 12)."""
    import torch
    from diffusers import AutoencoderKLWan, WanPipeline, WanTransformer3DModel

    name = "wan22-t2v-a14b"
    picks = (f"{name}/wan2.2_t2v_high_noise_14B_fp16.safetensors", f"{name}/umt5_xxl_fp16.safetensors", "none",
             "none", f"{name}/wan_2.1_vae.safetensors")
    prompt = files_prompt(name, picks)
    prompt[LOADER]["inputs"]["model_2"] = f"{name}/wan2.2_t2v_low_noise_14B_fp16.safetensors"
    text = "a corgi runs on a beach"
    prompt[SAMPLER] = {"class_type": "TPUVideoSampler", "inputs": {
        "pipeline": prompt[SAMPLER]["inputs"]["pipeline"], "prompt": text, "negative_prompt": "blurry", "width": 64,
        "height": 64, "frames": 5, "steps": 3, "guidance": 4.0, "seed": 21, "batch_size": 1}}
    entry = run_ok(files_server, prompt)
    info = run_info(entry)
    assert info["pipeline"] == "WanPipeline" and info["frames"] == 5, info
    saved = np.stack([np.asarray(Image.open(p), dtype=np.int16) for p in sorted(files_server.output_images(entry))])
    folder, made = single_files[name]
    experts = {component: WanTransformer3DModel.from_single_file(str(made[component]), config=str(folder),
                                                                 subfolder="transformer", local_files_only=True)
               for component in ("transformer", "transformer_2")}
    vae = AutoencoderKLWan.from_single_file(str(made["vae"]), config=str(folder), subfolder="vae",
                                            local_files_only=True)
    pipe = WanPipeline.from_pretrained(folder, vae=vae, **experts, local_files_only=True)
    with torch.no_grad():
        plain = pipe(prompt=text, negative_prompt="blurry", height=64, width=64, num_frames=5, num_inference_steps=3,
                     guidance_scale=4.0, generator=torch.Generator("cpu").manual_seed(21), output_type="np").frames[0]
    assert saved.shape == (5, 64, 64, 3)
    assert np.abs(saved - np.clip(plain * 255.0, 0, 255).astype(np.int16)).max() <= 1  # SaveImage's 8 bits


@pytest.mark.parametrize("configs, picks, audio_vae", [
    ("tiny-ltx2", ("ltx2/ltx-2-19b-dev.safetensors", "ltx2/gemma_3_12B_it.safetensors", "none", "none", "none"),
     "none"),
    ("ltx23", ("ltx23/ltx-2.3-22b-dev-fp8.safetensors", "ltx23/gemma_3_12B_it.safetensors", "none", "none", "none"),
     "none"),
    ("ltx25", (f"ltx25/{LTX25_FILE}", "ltx25/gemma4-12b-with-proj-ltx-2.5.safetensors", "none", "none",
               "ltx25/ltx-2.5-video-vae-conv-bf16.safetensors"), "ltx25/ltx-2.5-audio-vae-bf16.safetensors"),
], ids=["ltx2", "ltx23", "ltx25"])
def test_ltx2_from_its_files_gives_the_frames_and_sound_of_its_folder(files_server, configs, picks, audio_vae):
    """ComfyUI's LTX-2, LTX-2.3 and LTX-2.5 files through the File Loader into the TPU Video Sampler, its frames and
    AUDIO into Create Video + Save Video: the all-in-one checkpoint in checkpoints/ (LTX-2.3's in scaled fp8) with
    Gemma 3 in text_encoders/; LTX-2.5's int8 ConvRot transformer in diffusion_models/, its Gemma 4 file (with the text
    projection), its conv VAE and its audio VAE (with the vocoder, in the audio_vae input). The saved frames are those
    of the same prompt from the diffusers folder (TPU Loader; LTX-2.3's and 2.5's hold their quantized files' weights),
    and the run has the folder's sound track."""
    import av

    def frames_and_sound(prompt):
        sampler = prompt[SAMPLER]["inputs"]
        prompt[SAMPLER] = {"class_type": "TPUVideoSampler", "inputs": {
            "pipeline": sampler["pipeline"], "prompt": "a corgi runs on a beach", "negative_prompt": "", "width": 32,
            "height": 32, "frames": 9, "steps": 2, "guidance": 3.0, "seed": 5, "batch_size": 1}}
        prompt["11"] = {"class_type": "CreateVideo", "inputs": {"images": [SAMPLER, 0], "fps": [SAMPLER, 1],
                                                                "audio": [SAMPLER, 3]}}
        prompt["12"] = {"class_type": "SaveVideo", "inputs": {"video": ["11", 0], "filename_prefix": "ltx2_files",
                                                              "format": "mp4", "codec": "h264"}}
        entry = run_ok(files_server, prompt)
        saved = np.stack([np.asarray(Image.open(p), dtype=np.int16) for p in sorted(files_server.output_images(entry))
                          if p.suffix == ".png"])
        return entry, saved

    folder_entry, from_folder = frames_and_sound(sampler_prompt(model=configs))
    prompt = files_prompt(configs, picks)
    prompt[LOADER]["inputs"]["audio_vae"] = audio_vae
    entry, from_files = frames_and_sound(prompt)
    info = run_info(entry)
    assert info["pipeline"] == "LTX2Pipeline" and info["loaded"], info
    assert from_files.shape == (9, 32, 32, 3) and np.abs(from_files - from_folder).max() <= 1
    assert info["audio_seconds"] == run_info(folder_entry)["audio_seconds"] > 0
    [video] = [files_server.output_dir / item.get("subfolder", "") / item["filename"]
               for item in entry["outputs"]["12"]["images"]]
    with av.open(str(video)) as container:
        assert container.streams.audio and len(list(container.decode(container.streams.video[0]))) == 9


@pytest.mark.parametrize("model, model_2, message", [
    ("wan22-ti2v-5b/wan2.2_ti2v_5B_fp16.safetensors", "wan22-t2v-a14b/wan2.2_t2v_low_noise_14B_fp16.safetensors",
     "which has one diffusion model"),
    ("wan22-t2v-a14b/wan2.2_t2v_high_noise_14B_fp16.safetensors", "none",
     "also needs transformer_2 (wan2.2_t2v_low_noise_14B_fp8_scaled.safetensors)"),
], ids=["5b-with-model_2", "a14b-without-model_2"])
def test_a_wrong_second_wan_model_is_refused_on_the_file_loader_when_queued(files_server, model, model_2, message):
    folder = model.split("/")[0]
    prompt = files_prompt("auto", (model, f"{folder}/umt5_xxl_fp16.safetensors", "none", "none",
                                   f"{folder}/{'wan2.2_vae' if '5B' in model else 'wan_2.1_vae'}.safetensors"))
    prompt[LOADER]["inputs"]["model_2"] = model_2
    assert message in refused_on(files_server, prompt, LOADER)


def test_a_second_run_from_the_same_files_loads_nothing(files_server):
    configs, picks = FAMILIES["flux2"]
    run_ok(files_server, files_prompt(configs, picks))
    assert not run_info(run_ok(files_server, files_prompt(configs, picks)))["loaded"]


def test_lora_strength_zero_is_the_base_image_and_removing_a_lora_restores_it(files_server):
    same = dict(model=LORA_MODEL, seed=11, steps=2)
    base = pixels(files_server, run_ok(files_server, sampler_prompt(**same)))
    at_zero = pixels(files_server, run_ok(files_server, with_loras(sampler_prompt(**same), ("style_a.safetensors", 0))))
    assert np.array_equal(at_zero, base)
    styled = run_ok(files_server, with_loras(sampler_prompt(**same), ("style_a.safetensors", 1.0),
                                             ("kohya_style.safetensors", 0.7)))
    assert not np.array_equal(pixels(files_server, styled), base)
    assert not run_info(styled)["loaded"], "a LoRA reloads nothing"
    assert any(note.startswith("LoRA") for note in run_info(styled)["notes"]), run_info(styled)["notes"]
    assert np.array_equal(pixels(files_server, run_ok(files_server, sampler_prompt(**same))), base)


def test_switching_loras_on_a_compiled_pipeline_compiles_nothing(files_server):
    def compiled(*loras):
        prompt = with_compile(sampler_prompt(model=LORA_MODEL, mode="compiled", steps=2), files_server)
        return run_info(run_ok(files_server, with_loras(prompt, *loras), timeout=900))

    assert compiled(("style_a.safetensors", 1.0))["compiled_now"]
    for loras in ([("style_a.safetensors", 0.5)], [("style_b.safetensors", 1.0)], [],
                  [("style_a.safetensors", 1.0), ("style_b.safetensors", 0.3)]):
        info = compiled(*loras)
        assert info["compiled_now"] is False, (loras, info["notes"])
        assert not info["loaded"]


@pytest.mark.parametrize("picks, field, message", [
    (("broken/flux1-dev-Q4_K_S.gguf", "none", "none", "none", "none"), "model", "GGUF"),
    (("broken/cut_short.safetensors", "none", "none", "none", "none"), "model", "truncated"),
    (("flux1-wide/flux1-dev.safetensors", "flux1-wide/clip_l.safetensors", "flux1-wide/t5xxl_fp16.safetensors",
      "none", "broken/clip_l.safetensors"), "vae", "vae"),
    (("flux1-wide/flux1-dev.safetensors", "sd3/clip_g.safetensors", "flux1-wide/t5xxl_fp16.safetensors",
      "none", "flux1-wide/ae.safetensors"), "text_encoder", "text_encoder"),
    (("flux1-wide/flux1-dev.safetensors", "flux1-wide/clip_l.safetensors", "none", "none",
      "flux1-wide/ae.safetensors", "auto"), "text_encoder_2", "text_encoder_2 (t5xxl"),
    (("broken/hunyuan-video-int8_convrot.safetensors", "none", "none", "none", "none"), "model",
     "it is a HunyuanVideo video model, which TPU Diffusers does not run yet"),
], ids=["gguf", "truncated", "text-encoder-as-vae", "clip-g-as-clip-l", "missing-t5-with-config-only-source",
        "int8-convrot"])
def test_a_wrong_file_is_refused_on_the_file_loader(files_server, picks, field, message):
    """Refused when queued (headers), or when the loader runs (shapes against the configs): on the loader.
    A file left at none is taken from a full diffusers folder picked as configs, so 'missing' needs auto."""
    picks, configs = (picks[:5], picks[5]) if len(picks) == 6 else (picks, "flux1-wide")
    how, node, text, _ = outcome(files_server, files_prompt(configs, picks))
    assert how in ("rejected", "failed") and node == LOADER and message in text, (how, node, text)


@pytest.mark.parametrize("picks, message", [
    (("krea2/krea2_turbo_fp8_scaled.safetensors", "zimage/qwen_3_4b.safetensors", "none", "none",
      "krea2/qwen_image_vae.safetensors"), "is a Qwen3 text encoder, but text_encoder of Krea 2 needs a Qwen3-VL"),
    (("zimage/z_image_turbo_bf16.safetensors", "krea2/qwen3vl_4b_fp8_scaled.safetensors", "none", "none",
      "krea2/qwen_image_vae.safetensors"), "Z-Image"),
    (("flux3/flux3-image-klein-base-bf16.safetensors", "krea2/qwen3vl_4b_fp8_scaled.safetensors", "none", "none",
      "krea2/qwen_image_vae.safetensors"), "FLUX 3 [klein]"),
], ids=["qwen3-text-encoder", "z-image-model", "flux3-model"])
def test_a_file_of_another_family_is_refused_on_the_file_loader_when_queued(files_server, picks, message):
    """Krea 2's configs with a Z-Image file: refused from the headers when the prompt is queued."""
    details = refused_on(files_server, files_prompt("krea2", picks), LOADER)
    assert message in details, details


@pytest.mark.parametrize("picks, configs, message", [
    ((f"ltx25/{LTX25_FILE}", "ltx2/gemma_3_12B_it.safetensors", "none", "none",
      "ltx25/ltx-2.5-video-vae-conv-bf16.safetensors"), "auto",
     "is a Gemma 3 text encoder, but text_encoder of LTX-2 needs a Gemma 4 text encoder"),
    (("ltx2/ltx-2-19b-dev.safetensors", "zimage/qwen_3_4b.safetensors", "none", "none", "none"), "tiny-ltx2",
     "is a Qwen3 text encoder, but text_encoder of LTX-2 needs a Gemma 3 text encoder"),
    (("ltx2/ltx-2-19b-dev.safetensors", "none", "none", "none", "none"), "auto",
     "LTX-2 from single files also needs text_encoder (gemma_3_12B_it_fp4_mixed.safetensors)"),
], ids=["gemma3-for-ltx25", "qwen3-for-gemma", "no-text-encoder"])
def test_a_wrong_ltx2_file_is_refused_on_the_file_loader_when_queued(files_server, picks, configs, message):
    """LTX-2.3's Gemma 3 file with LTX-2.5's transformer, a text encoder of another kind, a checkpoint without its Gemma
    file (with configs auto: a full diffusers folder as configs would give its own text encoder): refused from the
    headers when the prompt is queued, saying what to pick."""
    details = refused_on(files_server, files_prompt(configs, picks), LOADER)
    assert message in details, details


def test_configs_of_another_family_are_refused_on_the_file_loader(files_server):
    details = refused_on(files_server, files_prompt("tiny-sd3", FAMILIES["flux2"][1]), LOADER)
    assert "configs" in details and "StableDiffusion3Pipeline" in details, details


@pytest.mark.parametrize("lora, message", [("cut_short.safetensors", "corrupt")])
def test_a_damaged_lora_is_refused_on_its_node_when_queued(files_server, lora, message):
    details = refused_on(files_server, with_loras(sampler_prompt(model=LORA_MODEL), (lora, 1.0)), "11")
    assert message in details, details


def test_a_lora_of_another_family_fails_on_its_node_and_the_base_is_unchanged(files_server):
    same = dict(model=LORA_MODEL, seed=13, steps=2)
    base = pixels(files_server, run_ok(files_server, sampler_prompt(**same)))
    how, node, text, _ = outcome(files_server, with_loras(sampler_prompt(**same), ("an_sd3_lora.safetensors", 1.0)))
    assert (how, node) == ("failed", "11") and "another model" in text, (how, node, text)
    assert np.array_equal(pixels(files_server, run_ok(files_server, sampler_prompt(**same))), base)


# --- image inputs from files: Comfy-Org's edit and fill files by their template names

def with_load_images(prompt: dict, base, pictures: dict[str, np.ndarray], mask_from: str | None = None) -> dict:
    """Load Image nodes ("21", "22", ...) for `pictures` ({Sampler input: pixels}, written to the server's input
    folder) linked into the Sampler, and the MASK of the one feeding `mask_from` into its mask."""
    folder = base / "input"
    folder.mkdir(exist_ok=True)
    nodes = {}
    for index, (name, array) in enumerate(pictures.items()):
        node, file = str(21 + index), f"files_{name}.png"
        Image.fromarray(array).save(folder / file)
        prompt[node] = {"class_type": "LoadImage", "inputs": {"image": file}}
        prompt[SAMPLER]["inputs"][name] = nodes[name] = [node, 0]
    if mask_from:
        prompt[SAMPLER]["inputs"]["mask"] = [nodes[mask_from][0], 1]
    return prompt


def picture(seed: int, alpha_hole: bool = False) -> np.ndarray:
    pixels = (np.random.default_rng(seed).random((64, 64, 3)) * 255).astype(np.uint8)
    if not alpha_hole:
        return pixels
    alpha = np.full((64, 64), 255, np.uint8)
    alpha[16:48, 16:48] = 0  # Load Image's mask: 1 there, repaint
    return np.dstack([pixels, alpha])


def test_flux1_fill_from_its_file_inpaints_like_its_folder(files_server):
    """flux1-fill-dev.safetensors (told by its 384 input channels) with FLUX.1-dev's clip_l, t5xxl and ae: the
    Load Image picture and its alpha mask give the image of the Fill folder."""
    same = dict(seed=5, width=64, height=64, steps=2, guidance=30.0)
    pictures = {"image": picture(1, alpha_hole=True)}
    from_folder = run_ok(files_server, with_load_images(sampler_prompt(model="flux1-fill-wide", **same),
                                                        files_server.base_dir, pictures, mask_from="image"))
    picks = ("flux1-fill-wide/flux1-fill-dev.safetensors", *FAMILIES["flux1"][1][1:])
    entry = run_ok(files_server, with_load_images(files_prompt("flux1-fill-wide", picks, **same), files_server.base_dir,
                                                  pictures, mask_from="image"))
    info = run_info(entry)
    assert (info["task"], info["pipeline"]) == ("inpaint", "FluxFillPipeline"), info
    assert np.abs(pixels(files_server, entry) - pixels(files_server, from_folder)).max() <= 1


def test_qwen_image_edit_2509_from_its_files_edits_two_references_with_its_vision_tower(files_server):
    """qwen_image_edit_2509_fp8_e4m3fn.safetensors (told by its name; configs: the folder named like
    Qwen/Qwen-Image-Edit-2509) with the Qwen2.5-VL file, vision tower included: two Load Image references,
    size 0 = the first one's; a second run loads nothing."""
    picks = ("qwenimage-edit-2509/qwen_image_edit_2509_fp8_e4m3fn.safetensors",
             "qwenimage-edit-2509/qwen_2.5_vl_7b_fp8_scaled.safetensors", "none", "none",
             "qwenimage-edit-2509/qwen_image_vae.safetensors")
    pictures = {"image": picture(2), "image_2": picture(3)}
    prompt = with_load_images(files_prompt("qwenimage-edit-2509", picks, width=0, height=0, steps=1, guidance=1.0),
                              files_server.base_dir, pictures)
    info = run_info(run_ok(files_server, prompt))
    assert (info["task"], info["pipeline"], info["loaded"]) == ("edit", "QwenImageEditPlusPipeline", True), info
    assert not any("vision" in note for note in info["notes"]), info["notes"]  # loaded, not left random
    prompt[SAMPLER]["inputs"]["seed"] += 1
    entry = run_ok(files_server, prompt)
    assert not run_info(entry)["loaded"] and pixels(files_server, entry).shape == (64, 64, 3)


def dequantized_by_comfy_kitchen(path) -> dict:
    """A quantized file's state dict as comfy-kitchen's eager functions dequantize it (float32)."""
    import torch
    from safetensors.torch import load_file
    from test_quant_formats import eager_dequantized

    raw = load_file(str(path))
    layers = {k[: -len(".comfy_quant")] for k in raw if k.endswith(".comfy_quant")}
    return {k: eager_dequantized(raw, k[: -len(".weight")], torch.float32) if k[: -len(".weight")] in layers
            else raw[k].float() for k in raw if k.rsplit(".", 1)[0] not in layers or k.rsplit(".", 1)[1] in
            ("weight", "bias")}


@pytest.mark.parametrize("kind", tiny_single_files.QUANT_KINDS)
def test_each_quantized_format_gives_plain_diffusers_image_on_its_dequantized_weights(files_server, single_files,
                                                                                     kind):
    """Z-Image's diffusion model from models/diffusion_models and its text encoder from models/text_encoders, both
    in one of ComfyUI's quantized formats (some layers bf16, as in ComfyUI's mixed files), through the File Loader:
    the image plain diffusers' ZImagePipeline makes on comfy-kitchen's eager dequantization of the same files."""
    import torch
    from diffusers import ZImagePipeline, ZImageTransformer2DModel
    from transformers import Qwen3Model

    folder = single_files["zimage"][0]
    files = {"transformer": f"z_image_turbo_{kind}.safetensors", "text_encoder": f"qwen_3_4b_{kind}.safetensors"}
    same = dict(seed=21, width=64, height=64, steps=2, guidance=0.0)
    entry = run_ok(files_server, files_prompt("zimage", (files["transformer"], files["text_encoder"], "none", "none",
                                                         "zimage/ae.safetensors"), **same))
    assert run_info(entry)["loaded"]
    models = files_server.base_dir / "models"
    transformer = ZImageTransformer2DModel.from_single_file(
        dequantized_by_comfy_kitchen(models / "diffusion_models" / files["transformer"]), config=str(folder),
        subfolder="transformer", torch_dtype=torch.float32, local_files_only=True)
    text_encoder = Qwen3Model.from_pretrained(folder / "text_encoder", torch_dtype=torch.float32)
    text_encoder.load_state_dict({k.removeprefix("model."): v for k, v in dequantized_by_comfy_kitchen(
        models / "text_encoders" / files["text_encoder"]).items()}, strict=True)
    pipe = ZImagePipeline.from_pretrained(folder, transformer=transformer, text_encoder=text_encoder,
                                          torch_dtype=torch.float32, local_files_only=True)
    with torch.no_grad():
        plain = pipe(prompt=sampler_prompt()[SAMPLER]["inputs"]["prompt"], height=64, width=64, num_inference_steps=2,
                     guidance_scale=0.0, generator=torch.Generator("cpu").manual_seed(21), output_type="np").images[0]
    expected = np.clip(plain * 255.0, 0, 255).astype(np.int16)  # SaveImage's 8 bits
    assert np.abs(pixels(files_server, entry) - expected).max() <= 1


def test_a_format_comfy_kitchen_does_not_know_is_refused_on_the_file_loader_and_the_next_prompt_runs(files_server):
    picks = ("z_image_turbo_int8.safetensors", "qwen_3_4b_int8.safetensors", "none", "none", "zimage/ae.safetensors")
    text = refused_on(files_server, files_prompt("zimage", (f"broken/{UNKNOWN_FORMAT_FILE}", *picks[1:])), LOADER)
    assert f"'{UNKNOWN_FORMAT_FILE}' is " in text and "quantized as 'svdquant_w4a4'" in text and "Pick a bf16" in text
    run_ok(files_server, files_prompt("zimage", picks, seed=3, steps=1))
