"""MiniMax H3 through a real server of its own, which sees a tiny MiniMax H3 modular folder: text to video with its
stereo sound into Create Video + Save Video, and reference to video from ComfyUI's Load Image and Load Video (its
frames, rate and sound; Get Video Components' audio as a sound clip) chained through TPU Video Reference nodes. The
frames (Save Image) and the sound (the AUDIO saved as an array by a node of another pack: ComfyUI's Save Audio needs
torchaudio) equal diffusers' modular pipeline run as its users run it (the workflow's components, same seed): frames
within one 8-bit level, sound within 1e-4. The templates' four files in the File Loader (written tiny, in their
layouts) make image to video as the folder holding what they load as. Reference chains the node or the model cannot
take are refused on the node."""

from __future__ import annotations

import itertools

import numpy as np
import pytest
import torch
from PIL import Image

from serving import clear_error, comfy_server, run_info, run_ok

MODEL = "tiny-minimax-h3"
PROMPT = "a cat playing piano, <Picture 1> beside <Picture 2>"
SEED, FRAMES = 11, 124  # 17n + 5: the fewest frames it makes (5 s at 24 fps)
LOADER, SAMPLER, SAVE_FRAMES, SAVE_SOUND, CREATE, SAVE_VIDEO = "1", "3", "4", "5", "6", "7"
PICTURES = {"h3_picture_1.png": (48, 80), "h3_picture_2.png": (40, 24)}  # (height, width)
CLIP, CLIP_FPS, CLIP_FRAMES, CLIP_RATE = "h3_clip.mp4", 30, 20, 32_000  # 16 frames at 24 fps: 13 at least

# Another pack's node: the AUDIO it gets, saved as it is (ComfyUI's Save Audio is missing without torchaudio, and its
# flac and mp4 files round the samples)
SOUND_FILES = itertools.count()
SAVE_AUDIO_ARRAY = """
import os

import numpy as np

import folder_paths


class SaveAudioArray:
    CATEGORY = "testing"
    RETURN_TYPES = ()
    OUTPUT_NODE = True
    FUNCTION = "run"

    @classmethod
    def INPUT_TYPES(cls):
        return {"required": {"audio": ("AUDIO",), "filename": ("STRING", {"default": "sound.npy"})}}

    def run(self, audio, filename):
        os.makedirs(folder_paths.get_output_directory(), exist_ok=True)
        path = os.path.join(folder_paths.get_output_directory(), filename)
        np.save(path, audio["waveform"].float().cpu().numpy())
        return {"ui": {"arrays": [{"filename": filename, "sample_rate": audio["sample_rate"]}]}}


NODE_CLASS_MAPPINGS = {"SaveAudioArray": SaveAudioArray}
"""


def write_inputs(folder) -> None:
    """Two pictures and a 30 fps clip with a stereo sound track at the model's 32 kHz, in the input folder."""
    folder.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(4)
    for name, shape in PICTURES.items():
        Image.fromarray((rng.random((*shape, 3)) * 255).astype(np.uint8)).save(folder / name)
    import av

    with av.open(str(folder / CLIP), "w") as container:
        video = container.add_stream("libx264", rate=CLIP_FPS)
        video.width, video.height, video.pix_fmt = 56, 40, "yuv420p"
        sound = container.add_stream("aac", rate=CLIP_RATE, layout="stereo")
        for _ in range(CLIP_FRAMES):
            frame = av.VideoFrame.from_ndarray((rng.random((40, 56, 3)) * 255).astype(np.uint8), format="rgb24")
            container.mux(video.encode(frame))
        container.mux(video.encode())
        samples = rng.uniform(-0.4, 0.4, (1, 2 * CLIP_RATE // 2)).astype(np.float32)  # 0.5 s, interleaved
        clip = av.AudioFrame.from_ndarray(samples, format="flt", layout="stereo")
        clip.sample_rate = CLIP_RATE
        container.mux(sound.encode(clip))
        container.mux(sound.encode())


def clip_as_comfyui_reads_it(path) -> tuple[np.ndarray, np.ndarray]:
    """The clip's frames (float, 0..1) and sound [channels, samples] as ComfyUI's Load Video decodes them."""
    import av

    with av.open(str(path)) as container:
        frames = np.stack([frame.to_ndarray(format="rgb24") for frame in container.decode(video=0)]) / 255.0
        container.seek(0)
        stream = container.streams.audio[0]
        sound = np.concatenate([frame.to_ndarray() for packet in container.demux(stream)
                                for frame in packet.decode()], axis=1)
    return frames.astype(np.float32), sound.astype(np.float32)


@pytest.fixture(scope="module")
def h3_models(tmp_path_factory):
    import tiny_models

    root = tmp_path_factory.mktemp("h3-models")
    tiny_models.save(*tiny_models.minimax_h3(), root / MODEL)
    return root


@pytest.fixture(scope="module")
def template_files(h3_models, tmp_path_factory):
    """The files ComfyUI's MiniMax H3 templates load, written from the tiny folder in their layouts (the pruned int8
    ConvRot diffusion model, pruned at the full rank; the Qwen3-VL text encoder cut at 50, nvfp4 AWQ; the int8 ConvRot
    video VAE; the fp32 audio VAE), and a configs folder named as `auto` finds it that holds what they load as."""
    import shutil

    import tiny_single_files as tsf
    from test_minimax_h3_text_encoder_file import file_values
    from transformers import Qwen3VLForConditionalGeneration

    root = tmp_path_factory.mktemp("h3-template-files")
    made = {**tsf.minimax_h3_files(h3_models / MODEL, root / "files"),
            **tsf.minimax_h3_text_encoder_files(h3_models / MODEL, root / "files"),
            **tsf.minimax_h3_vae_files(h3_models / MODEL, root / "files")}
    files = {"transformer": made["transformer_pruned"], "text_encoder": made["text_encoder"],
             "vae": made["vae_int8_convrot"], "audio_vae": made["audio_vae"]}
    configs = root / "MiniMax-H3"
    shutil.copytree(h3_models / MODEL, configs)
    tsf.transformer_holding(configs, tsf.minimax_h3_int8_values)  # what the unpruned file it was pruned from loads as
    tsf.component_holding(configs, "vae", tsf.minimax_h3_video_vae_values("int8_convrot"))
    tsf.component_holding(configs, "audio_vae", tsf.minimax_h3_audio_vae_values)
    text_encoder = Qwen3VLForConditionalGeneration.from_pretrained(configs / "text_encoder")
    text_encoder.load_state_dict({**text_encoder.state_dict(), **file_values(files["text_encoder"])})
    text_encoder.save_pretrained(configs / "text_encoder")
    return configs, files


@pytest.fixture(scope="module")
def server(h3_models, template_files, tmp_path_factory):
    base = tmp_path_factory.mktemp("comfy-h3")
    write_inputs(base / "input")  # before start: Load Video lists its files when the server starts
    (base / "custom_nodes").mkdir()
    (base / "custom_nodes" / "save_audio_array.py").write_text(SAVE_AUDIO_ARRAY)
    with comfy_server(base, h3_models, single_files={"minimax_h3": template_files},
                      args=["--preview-method", "none"]) as running:
        yield running


def h3_prompt(**sampler_inputs) -> dict:
    return {
        LOADER: {"class_type": "TPULoader", "inputs": {"model": MODEL, "hub_id": "", "dtype": "auto", "device": "auto"}},
        SAMPLER: {"class_type": "TPUVideoSampler", "inputs": {
            "pipeline": [LOADER, 0], "prompt": PROMPT, "negative_prompt": "", "width": 32, "height": 32,
            "frames": FRAMES, "steps": 3, "guidance": 1.0, "seed": SEED, "batch_size": 1, **sampler_inputs}},
        SAVE_FRAMES: {"class_type": "SaveImage", "inputs": {"images": [SAMPLER, 0], "filename_prefix": "h3_frames"}},
        SAVE_SOUND: {"class_type": "SaveAudioArray", "inputs": {"audio": [SAMPLER, 3],
                                                                "filename": f"h3_sound_{next(SOUND_FILES)}.npy"}},
    }


def chain(prompt: dict, *links: tuple[str, dict]) -> dict:
    """TPU Video Reference nodes 20, 21, ... in order, each adding what `links` gives it (a loader node and its
    inputs), the last one into the sampler's references."""
    before = None
    for i, (loader, inputs) in enumerate(links):
        node, source = str(20 + i), str(30 + i)
        prompt[source] = {"class_type": loader, "inputs": inputs}
        kind, slot = {"LoadImage": ("image", 0), "LoadVideo": ("video", 0), "GetVideoComponents": ("audio", 1)}[loader]
        prompt[node] = {"class_type": "TPUVideoReference", "inputs": {kind: [source, slot],
                                                                      **({"references": before} if before else {})}}
        before = [node, 0]
    prompt[SAMPLER]["inputs"]["references"] = before
    return prompt


def modular_pipeline(folder, workflow: str, **inputs) -> tuple[np.ndarray, np.ndarray]:
    """diffusers' modular pipeline as its users run it: the workflow's components, one call, the same seed; the frames
    as ComfyUI's savers quantize them, the sound [2, samples]."""
    from diffusers import ModularPipeline

    pipe = ModularPipeline.from_pretrained(str(folder), workflow=workflow)
    pipe.load_components(dtype=torch.float32)
    made = pipe(prompt=PROMPT, num_frames=FRAMES, height=32, width=32, num_inference_steps=3,
                generator=torch.Generator("cpu").manual_seed(SEED), output_type="pt",
                output=["videos", "audio", "sampling_rate"], **inputs)
    frames = np.clip(255.0 * made["videos"][0].permute(0, 2, 3, 1).numpy(), 0, 255).astype(np.uint8)
    return frames, made["audio"][0].float().numpy()


def assert_made_as_diffusers(server, entry, expected: tuple[np.ndarray, np.ndarray]) -> None:
    frames, sound = expected
    saved = []
    for item in entry["outputs"][SAVE_FRAMES]["images"]:
        with Image.open(server.output_dir / item.get("subfolder", "") / item["filename"]) as image:
            saved.append(np.asarray(image.convert("RGB")))
    assert len(saved) == FRAMES and max(np.abs(a.astype(int) - b).max() for a, b in zip(saved, frames)) <= 1
    [saved_sound] = entry["outputs"][SAVE_SOUND]["arrays"]
    waveform = np.load(server.output_dir / saved_sound["filename"])
    assert saved_sound["sample_rate"] == 32_000 and waveform.shape == (1, *sound.shape)
    assert np.abs(waveform[0] - sound).max() <= 1e-4


def test_text_to_video_with_its_stereo_sound_into_create_video_and_save_video(server, h3_models):
    prompt = h3_prompt()
    prompt[CREATE] = {"class_type": "CreateVideo", "inputs": {"images": [SAMPLER, 0], "fps": [SAMPLER, 1],
                                                              "audio": [SAMPLER, 3]}}
    prompt[SAVE_VIDEO] = {"class_type": "SaveVideo", "inputs": {"video": [CREATE, 0], "filename_prefix": "h3_video",
                                                                "format": "mp4", "codec": "h264"}}
    entry = run_ok(server, prompt)
    info = run_info(entry)
    assert (info["task"], info["fps"], info["sample_rate"]) == ("text2video", 24, 32_000)
    assert_made_as_diffusers(server, entry, modular_pipeline(h3_models / MODEL, "t2va"))
    import av

    [video] = entry["outputs"][SAVE_VIDEO]["images"]
    with av.open(str(server.output_dir / video.get("subfolder", "") / video["filename"])) as container:
        assert container.streams.video[0].frames == FRAMES and container.streams.audio[0].channels == 2


def test_image_to_video_from_the_templates_files_in_the_file_loader(server, template_files):
    """The shipped workflow's graph (workflows/minimax_h3_i2v_int8_sound_one_chip_files.json): the File Loader with the
    templates' four files and configs auto, a Load Image picture as the first frame: diffusers' fl2va blocks on the
    folder holding what the files load as."""
    configs, files = template_files
    prompt = h3_prompt(image=["30", 0])
    prompt["30"] = {"class_type": "LoadImage", "inputs": {"image": "h3_picture_1.png"}}
    prompt[LOADER] = {"class_type": "TPUFileLoader", "inputs": {
        "model": f"minimax_h3/{files['transformer'].name}", "text_encoder": f"minimax_h3/{files['text_encoder'].name}",
        "text_encoder_2": "none", "text_encoder_3": "none", "vae": f"minimax_h3/{files['vae'].name}",
        "configs": "auto", "dtype": "auto", "device": "auto", "model_2": "none", "quantized_weights": "auto",
        "audio_vae": f"minimax_h3/{files['audio_vae'].name}"}}
    entry = run_ok(server, prompt)
    info = run_info(entry)
    assert info["task"] == "image2video"
    picture = Image.open(server.base_dir / "input" / "h3_picture_1.png").convert("RGB")
    assert_made_as_diffusers(server, entry, modular_pipeline(configs, "fl2va", image=picture))


def test_reference_to_video_with_two_pictures_loads_its_own_transformer_and_says_so(server, h3_models):
    prompt = chain(h3_prompt(), *(("LoadImage", {"image": name}) for name in PICTURES))
    entry = run_ok(server, prompt)
    info = run_info(entry)
    assert info["task"] == "reference2video"
    assert any("loaded ref2va's own transformer_ref" in note for note in info["notes"])
    pictures = [Image.open(server.base_dir / "input" / name).convert("RGB") for name in PICTURES]
    from diffusers.modular_pipelines.minimax_h3 import MiniMaxH3ImageReference

    expected = modular_pipeline(h3_models / MODEL, "ref2va",
                                references=[MiniMaxH3ImageReference(image=picture) for picture in pictures])
    assert_made_as_diffusers(server, entry, expected)


def test_reference_to_video_from_load_video_with_its_sound_and_a_sound_clip(server, h3_models):
    """A picture, a 30 fps clip with its sound (Load Video), then that sound again as a clip of its own (Get Video
    Components' audio): diffusers given the clip as ComfyUI decodes it, at its rates, in that order."""
    from diffusers.modular_pipelines.minimax_h3 import (MiniMaxH3AudioReference, MiniMaxH3ImageReference,
                                                        MiniMaxH3VideoReference)

    prompt = chain(h3_prompt(), ("LoadImage", {"image": "h3_picture_1.png"}), ("LoadVideo", {"file": CLIP}),
                   ("GetVideoComponents", {"video": ["31", 0]}))
    entry = run_ok(server, prompt)
    assert run_info(entry)["task"] == "reference2video"
    frames, sound = clip_as_comfyui_reads_it(server.base_dir / "input" / CLIP)
    picture = Image.open(server.base_dir / "input" / "h3_picture_1.png").convert("RGB")
    expected = modular_pipeline(h3_models / MODEL, "ref2va", references=[
        MiniMaxH3ImageReference(image=picture),
        MiniMaxH3VideoReference(frames=frames, fps=float(CLIP_FPS), audio=torch.tensor(sound), sample_rate=CLIP_RATE),
        MiniMaxH3AudioReference(audio=torch.tensor(sound), sample_rate=CLIP_RATE)])
    assert_made_as_diffusers(server, entry, expected)


def test_reference_chains_it_cannot_take_are_refused_on_the_node(server):
    empty = h3_prompt()
    empty["20"] = {"class_type": "TPUVideoReference", "inputs": {}}
    empty[SAMPLER]["inputs"]["references"] = ["20", 0]
    clear_error(server, empty, "20", r"connect image, video or audio", when="rejected")
    both = chain(h3_prompt(), ("LoadImage", {"image": "h3_picture_1.png"}))
    both["41"] = {"class_type": "LoadVideo", "inputs": {"file": CLIP}}
    both["20"]["inputs"]["video"] = ["41", 0]
    clear_error(server, both, "20", r"one kind of reference per node", when="rejected")
    sound_only = chain(h3_prompt(), ("LoadVideo", {"file": CLIP}), ("GetVideoComponents", {"video": ["30", 0]}))
    sound_only["21"]["inputs"].pop("references")  # the clip's sound alone
    clear_error(server, sound_only, SAMPLER, r"sound references only beside a picture or a video", when="failed")
    with_image = chain(h3_prompt(image=["30", 0]), ("LoadImage", {"image": "h3_picture_1.png"}))
    clear_error(server, with_image, SAMPLER, r"references with image: a reference to video run takes its pictures",
                when="rejected")
    assert run_ok(server, chain(h3_prompt(seed=SEED + 1), ("LoadImage", {"image": "h3_picture_2.png"})))
