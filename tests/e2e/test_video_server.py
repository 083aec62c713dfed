"""Video through the real server: the TPU Video Sampler's frames go into ComfyUI's own video nodes (Save Animated
WEBP, lossless, whose frames are read back exactly; Create Video + Save Video with the sampler's fps) and Save
Image, and equal plain diffusers for the same prompt and seed (video i with seed + i), quantized as ComfyUI's
savers do (clip(255 * x, 0, 255) as uint8). Image to video, and first/last frame to video, take ComfyUI's Load
Image. Bad video inputs are refused on the node."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from PIL import Image, ImageSequence

from serving import clear_error, run_info, run_ok

PROMPT = "a corgi running on a beach"
SEED = 31
FRAMES = 5
LOADER, SAMPLER, SAVE, LOAD_IMAGE, CREATE, LOAD_LAST = "1", "3", "4", "10", "11", "12"
START, LAST = "tpu_video_start.png", "tpu_video_last.png"


def video_prompt(model: str, save: str = "SaveImage", image: bool = False, last_image: bool = False,
                 **sampler_inputs) -> dict:
    prompt = {
        LOADER: {"class_type": "TPULoader", "inputs": {"model": model, "hub_id": "", "dtype": "auto", "device": "auto"}},
        SAMPLER: {"class_type": "TPUVideoSampler", "inputs": {
            "pipeline": [LOADER, 0], "prompt": PROMPT, "negative_prompt": "", "width": 64, "height": 64,
            "frames": FRAMES, "steps": 3, "guidance": 3.0, "seed": SEED, "batch_size": 1, **sampler_inputs}},
    }
    if image:
        prompt[LOAD_IMAGE] = {"class_type": "LoadImage", "inputs": {"image": START}}
        prompt[SAMPLER]["inputs"]["image"] = [LOAD_IMAGE, 0]
    if last_image:
        prompt[LOAD_LAST] = {"class_type": "LoadImage", "inputs": {"image": LAST}}
        prompt[SAMPLER]["inputs"]["last_image"] = [LOAD_LAST, 0]
    if save == "SaveAnimatedWEBP":
        prompt[SAVE] = {"class_type": "SaveAnimatedWEBP", "inputs": {
            "images": [SAMPLER, 0], "filename_prefix": f"{model}_video", "fps": 16.0, "lossless": True,
            "quality": 100, "method": "default"}}
    elif save == "SaveVideo":
        prompt[CREATE] = {"class_type": "CreateVideo", "inputs": {"images": [SAMPLER, 0], "fps": [SAMPLER, 1]}}
        prompt[SAVE] = {"class_type": "SaveVideo", "inputs": {
            "video": [CREATE, 0], "filename_prefix": f"{model}_video", "format": "mp4", "codec": "h264"}}
    else:
        prompt[SAVE] = {"class_type": "SaveImage", "inputs": {"images": [SAMPLER, 0], "filename_prefix": model}}
    return prompt


def input_picture(server, name: str, seed: int, shape: tuple[int, int, int]) -> Image.Image:
    """A random PNG in the server's input folder; returns it as Load Image gives it to the pack (RGB)."""
    folder = server.base_dir / "input"
    folder.mkdir(exist_ok=True)
    Image.fromarray((np.random.default_rng(seed).random(shape) * 255).astype(np.uint8)).save(folder / name)
    with Image.open(folder / name) as image:
        return image.convert("RGB")


@pytest.fixture(scope="module")
def start_image(server) -> Image.Image:
    return input_picture(server, START, 5, (48, 80, 3))


@pytest.fixture(scope="module")
def last_image(server) -> Image.Image:
    return input_picture(server, LAST, 6, (40, 24, 3))


def plain_diffusers(tiny, model: str, cls: str, videos: int = 1, **kwargs) -> list[np.ndarray]:
    """Plain diffusers' frames for the same call (from_pipe for TI2V-5B's image to video; kwargs: the images, or
    other call values), video after video, quantized as ComfyUI's savers do."""
    import diffusers

    pipe = diffusers.DiffusionPipeline.from_pretrained(tiny(model), local_files_only=True)
    if type(pipe).__name__ != cls:
        pipe = getattr(diffusers, cls).from_pipe(pipe)
    call = dict(prompt=PROMPT, height=64, width=64, num_frames=FRAMES, num_inference_steps=3, guidance_scale=3.0,
                output_type="pt")
    frames = []
    for i in range(videos):
        video = pipe(**{**call, **kwargs}, generator=torch.Generator("cpu").manual_seed(SEED + i)).frames[0]
        frames += list(np.clip(255.0 * video.permute(0, 2, 3, 1).numpy(), 0, 255).astype(np.uint8))
    return frames


def assert_equal_frames(ours: list[np.ndarray], theirs: list[np.ndarray], levels: int = 0) -> None:
    """Equal, or within `levels` 8-bit levels (LTX-2's frames: one)."""
    assert len(ours) == len(theirs), (len(ours), len(theirs))
    for i, (a, b) in enumerate(zip(ours, theirs)):
        most = np.abs(a.astype(int) - b).max()
        assert most <= levels, f"frame {i} differs from plain diffusers (by up to {most})"


def webp_frames(path) -> list[np.ndarray]:
    with Image.open(path) as image:
        return [np.asarray(frame.convert("RGB")) for frame in ImageSequence.Iterator(image)]


def test_text_to_video_into_save_animated_webp_equals_plain_diffusers(server, tiny):
    """Wan 2.2 T2V A14B (both experts) -> ComfyUI's Save Animated WEBP (lossless): every frame as diffusers'."""
    entry = run_ok(server, video_prompt("tiny-wan22-t2v-a14b", save="SaveAnimatedWEBP"))
    info = run_info(entry)
    assert (info["task"], info["pipeline"], info["frames"], info["fps"]) == ("text2video", "WanPipeline", FRAMES, 16)
    [webp] = server.output_images(entry)
    assert webp.suffix == ".webp"
    assert_equal_frames(webp_frames(webp), plain_diffusers(tiny, "wan22-t2v-a14b", "WanPipeline"))


def test_image_to_video_from_load_image_equals_plain_diffusers(server, tiny, start_image):
    """Wan 2.2 I2V A14B with Load Image's picture as the first frame (diffusers resizes it to 64x64); a batch of
    two videos comes out as 2 x frames images, video i with seed + i."""
    entry = run_ok(server, video_prompt("tiny-wan22-i2v-a14b", image=True, batch_size=2))
    assert (run_info(entry)["task"], run_info(entry)["pipeline"]) == ("image2video", "WanImageToVideoPipeline")
    assert_equal_frames(saved_frames(server, entry), plain_diffusers(tiny, "wan22-i2v-a14b", "WanImageToVideoPipeline",
                                                                     videos=2, image=start_image))


def test_the_5b_models_image_to_video_equals_plain_diffusers(server, tiny, start_image):
    """Wan 2.2 TI2V-5B with a start image runs diffusers' WanImageToVideoPipeline (from_pipe on the loaded model)."""
    entry = run_ok(server, video_prompt("tiny-wan22-ti2v-5b", image=True))
    info = run_info(entry)
    assert (info["task"], info["pipeline"], info["fps"]) == ("image2video", "WanImageToVideoPipeline", 24)
    assert_equal_frames(saved_frames(server, entry), plain_diffusers(tiny, "wan22-ti2v-5b", "WanImageToVideoPipeline",
                                                                     image=start_image))


def saved_frames(server, entry) -> list[np.ndarray]:
    """The frames Save Image wrote, in order."""
    frames = []
    for path in server.output_images(entry):
        with Image.open(path) as image:
            frames.append(np.asarray(image.convert("RGB")))
    return frames


def test_the_samplers_fps_feeds_create_video_and_save_video(server):
    """TI2V-5B (24 fps) -> Create Video (fps linked from the sampler) -> Save Video: an mp4 of the frames."""
    import av

    entry = run_ok(server, video_prompt("tiny-wan22-ti2v-5b", save="SaveVideo"))
    assert run_info(entry)["fps"] == 24
    [saved] = [server.output_dir / item.get("subfolder", "") / item["filename"]
               for output in entry["outputs"].values() for item in output.get("images", [])]
    with av.open(str(saved)) as container:
        stream = container.streams.video[0]
        frames = list(container.decode(stream))
        assert (len(frames), stream.average_rate, stream.width, stream.height) == (FRAMES, 24, 64, 64)


@pytest.mark.parametrize("inputs, when, patterns", [
    # refused when queued, on the node, with no model
    (dict(frames=8), "rejected", (r"frames 8 cannot be used", r"4k \+ 1", r"5 or 9")),
    (dict(frames=1029), "rejected", (r"frames 1029 is outside 1\.\.1025",)),
    (dict(frames=81, prompt="  "), "rejected", (r"prompt is empty",)),
    (dict(width=100), "rejected", (r"width 100 cannot be used", r"multiple of 16")),
    # refused before anything is allocated (run time, before loading): the frames alone need ~411 GB here
    (dict(width=4096, height=4096, frames=1021), "failed", (r"x 1021 frames is too large for this machine's memory",
                                                            r"or the frames")),
])
def test_bad_video_inputs_are_refused_clearly(server, inputs, when, patterns, then_a_good_prompt_succeeds):
    clear_error(server, video_prompt("tiny-wan22-t2v-a14b", **inputs), SAMPLER, *patterns, when=when)


def test_an_image_into_text_to_video_only_is_refused_on_the_sampler(server, start_image, then_a_good_prompt_succeeds):
    clear_error(server, video_prompt("tiny-wan22-t2v-a14b", image=True), SAMPLER,
                r"has no image2video pipeline", r"text to video only")


def test_a_video_model_on_the_image_sampler_says_which_sampler(server, workflow, then_a_good_prompt_succeeds):
    prompt = workflow()
    prompt[LOADER]["inputs"]["model"] = "tiny-wan22-t2v-a14b"
    prompt[SAMPLER]["inputs"].update(width=64, height=64, steps=1)
    clear_error(server, prompt, SAMPLER, r"makes video: sample it with the TPU Video Sampler")


def test_a_model_without_sound_blocks_the_audio_output_with_a_clear_message_and_the_frames_still_save(server, tiny):
    """Wan 2.2 makes no sound: the Video Sampler's AUDIO (appended after frames, fps and info) is ComfyUI's
    execution blocker, so a Create Video given it is stopped with the message (and the Save Video after it, silently,
    as ComfyUI blocks what follows), and no video with silence is written, while Save Image of the same run's frames
    saves plain diffusers' frames. (Save Audio and Preview Audio are the same kind of AUDIO input; ComfyUI 0.3.75
    loads them only with torchaudio, which the test environment does not install.)"""
    prompt = video_prompt("tiny-wan22-t2v-a14b")
    prompt[CREATE] = {"class_type": "CreateVideo", "inputs": {"images": [SAMPLER, 0], "fps": [SAMPLER, 1],
                                                              "audio": [SAMPLER, 3]}}
    prompt["21"] = {"class_type": "SaveVideo", "inputs": {"video": [CREATE, 0], "filename_prefix": "no_sound",
                                                          "format": "mp4", "codec": "h264"}}
    with server.events() as events:
        prompt_id = server.queue(prompt, client_id=events.client_id)
        events.wait_for(lambda m: m["type"] in ("execution_success", "execution_interrupted")
                        and m["data"].get("prompt_id") == prompt_id, timeout=600)
        blocked = [m["data"] for m in events.seen if m["type"] == "execution_error"]
    entry = server.wait(prompt_id)
    assert [error["node_id"] for error in blocked] == [CREATE]
    for error in blocked:
        assert error["exception_type"] == "ExecutionBlocked"
        assert "Execution Blocked: this video model (WanPipeline) makes no sound" in error["exception_message"]
    assert set(entry["outputs"]) == {SAMPLER, SAVE}  # nothing saved of the audio, nor a video with silence
    assert (run_info(entry)["sample_rate"], run_info(entry)["audio_seconds"]) == (0, 0.0)
    assert_equal_frames(saved_frames(server, entry), plain_diffusers(tiny, "wan22-t2v-a14b", "WanPipeline"))


def test_ltx2_text_to_video_with_its_sound_into_create_video_and_save_video(server, tiny):
    """LTX-2 through the real server: the frames Save Image writes equal plain diffusers' LTX2Pipeline for the same
    seed (within one 8-bit level), and the AUDIO output, linked with the frames and fps into Create Video + Save
    Video, gives an mp4 with an audio stream as long as diffusers' sound track (within two AAC frames of padding)."""
    import av
    import diffusers

    prompt = video_prompt("tiny-ltx2", save="SaveVideo", width=32, height=32, frames=9, steps=2)
    prompt[CREATE]["inputs"]["audio"] = [SAMPLER, 3]
    prompt["22"] = {"class_type": "SaveImage", "inputs": {"images": [SAMPLER, 0], "filename_prefix": "ltx2_frames"}}
    entry = run_ok(server, prompt)
    info = run_info(entry)
    assert (info["fps"], info["sample_rate"]) == (24, 16_000)
    pipe = diffusers.DiffusionPipeline.from_pretrained(tiny("ltx2"), local_files_only=True)
    theirs = pipe(prompt=PROMPT, negative_prompt="", height=32, width=32, num_frames=9, frame_rate=24.0,
                  num_inference_steps=2, guidance_scale=3.0, generator=torch.Generator("cpu").manual_seed(SEED),
                  output_type="pt")
    expected = np.clip(255.0 * theirs.frames[0].permute(0, 2, 3, 1).numpy(), 0, 255).astype(np.uint8)
    frames = []
    for item in entry["outputs"]["22"]["images"]:
        with Image.open(server.output_dir / item.get("subfolder", "") / item["filename"]) as image:
            frames.append(np.asarray(image.convert("RGB")))
    assert len(frames) == 9 and max(np.abs(a.astype(int) - b).max() for a, b in zip(frames, expected)) <= 1
    seconds = theirs.audio.shape[-1] / pipe.vocoder.config.output_sampling_rate
    assert info["audio_seconds"] == pytest.approx(seconds, abs=1e-3)
    [saved] = [server.output_dir / item.get("subfolder", "") / item["filename"]
               for item in entry["outputs"][SAVE]["images"]]
    with av.open(str(saved)) as container:
        assert len(list(container.decode(container.streams.video[0]))) == 9
    with av.open(str(saved)) as container:
        stream = container.streams.audio[0]
        decoded = list(container.decode(stream))
        rate = decoded[0].sample_rate
        assert abs(sum(frame.samples for frame in decoded) / rate - seconds) <= 2 * 1024 / rate


def test_ltx2_with_a_sigmas_schedule_from_comfyuis_scheduler_node_runs_it_as_given(server, tiny):
    """ComfyUI's KarrasScheduler (a SIGMAS output ending at 0) into the LTX-2 Video Sampler's sigmas, at guidance 1 as a
    distilled model runs: the frames of plain diffusers given those sigmas on a scheduler that keeps them as they are
    (diffusers' distilled recipe); the sampler's steps widget is not used (the schedule's three steps are)."""
    import diffusers

    prompt = video_prompt("tiny-ltx2", width=32, height=32, frames=9, steps=5, guidance=1.0)
    prompt["30"] = {"class_type": "KarrasScheduler", "inputs": {"steps": 3, "sigma_max": 1.0, "sigma_min": 0.3,
                                                                "rho": 7.0}}
    prompt[SAMPLER]["inputs"]["sigmas"] = ["30", 0]
    entry = run_ok(server, prompt)
    ramp = torch.linspace(0, 1, 3)
    sigmas = ((1.0 ** (1 / 7.0) + ramp * (0.3 ** (1 / 7.0) - 1.0 ** (1 / 7.0))) ** 7.0).tolist()
    pipe = diffusers.DiffusionPipeline.from_pretrained(tiny("ltx2"), local_files_only=True)
    pipe.scheduler = diffusers.FlowMatchEulerDiscreteScheduler.from_config(
        pipe.scheduler.config, use_dynamic_shifting=False, shift_terminal=None)
    video = pipe(prompt=PROMPT, negative_prompt="", height=32, width=32, num_frames=9, frame_rate=24.0,
                 num_inference_steps=3, sigmas=sigmas, guidance_scale=1.0, output_type="pt",
                 generator=torch.Generator("cpu").manual_seed(SEED)).frames[0]
    expected = list(np.clip(255.0 * video.permute(0, 2, 3, 1).numpy(), 0, 255).astype(np.uint8))
    assert_equal_frames(saved_frames(server, entry), expected, levels=1)


def test_ltx2_first_and_last_frame_from_two_load_images_equal_plain_diffusers(server, tiny, start_image, last_image):
    """Two Load Image nodes into the LTX-2 Video Sampler's image and last_image: diffusers' LTX2ConditionPipeline
    (from_pipe on the loaded model) with the first frame at latent index 0 and the last at -1, as diffusers documents;
    the frames Save Image writes equal plain diffusers' within one 8-bit level."""
    from diffusers.pipelines.ltx2.pipeline_ltx2_condition import LTX2VideoCondition

    entry = run_ok(server, video_prompt("tiny-ltx2", image=True, last_image=True, width=32, height=32, frames=9,
                                        steps=2))
    info = run_info(entry)
    assert (info["task"], info["pipeline"], info["frames"]) == ("firstlast2video", "LTX2ConditionPipeline", 9)
    conditions = [LTX2VideoCondition(frames=start_image, index=0), LTX2VideoCondition(frames=last_image, index=-1)]
    assert_equal_frames(saved_frames(server, entry),
                        plain_diffusers(tiny, "ltx2", "LTX2ConditionPipeline", height=32, width=32, num_frames=9,
                                        num_inference_steps=2, conditions=conditions), levels=1)


def test_ltx2_in_context_video_from_a_reference_batch_equals_plain_diffusers(server, tiny, start_image):
    """A reference video as ComfyUI makes an IMAGE batch (Load Image -> RepeatImageBatch, 9 frames) into the Video
    Sampler's reference_video: diffusers' LTX2InContextPipeline (from_pipe) with it as the reference condition; the
    frames Save Image writes equal plain diffusers' within one 8-bit level."""
    from diffusers.pipelines.ltx2.pipeline_ltx2_ic_lora import LTX2ReferenceCondition

    prompt = video_prompt("tiny-ltx2", width=32, height=32, frames=9, steps=2)
    prompt[LOAD_IMAGE] = {"class_type": "LoadImage", "inputs": {"image": START}}
    prompt["31"] = {"class_type": "RepeatImageBatch", "inputs": {"image": [LOAD_IMAGE, 0], "amount": 9}}
    prompt[SAMPLER]["inputs"]["reference_video"] = ["31", 0]
    entry = run_ok(server, prompt)
    assert (run_info(entry)["task"], run_info(entry)["pipeline"]) == ("incontext2video", "LTX2InContextPipeline")
    reference = [LTX2ReferenceCondition(frames=[start_image] * 9)]
    assert_equal_frames(saved_frames(server, entry),
                        plain_diffusers(tiny, "ltx2", "LTX2InContextPipeline", height=32, width=32, num_frames=9,
                                        num_inference_steps=2, reference_conditions=reference), levels=1)


@pytest.mark.parametrize("model, image, when, patterns", [
    # refused when queued, on the node, with no model: the last frame needs the first
    ("tiny-ltx2", False, "rejected", (r"last_image is connected but image is not",)),
    # refused when the run is planned, before loading: Wan has no first/last frame to video
    ("tiny-wan22-ti2v-5b", True, "failed", (r"WanPipeline has no firstlast2video pipeline, and a last_image is "
                                            r"connected", r"It runs: text2video with no image .*; image2video with a "
                                                          r"start image")),
])
def test_a_last_image_is_refused_clearly_without_image_or_on_a_model_without_the_task(
        server, start_image, last_image, model, image, when, patterns, then_a_good_prompt_succeeds):
    clear_error(server, video_prompt(model, image=image, last_image=True), SAMPLER, *patterns, when=when)


def test_ltx2_with_the_latent_upscale_model_runs_two_stages_as_diffusers_recipe(server, tiny):
    """TPU Latent Upscale Model (a diffusers upscaler folder in models/latent_upscale_models) -> the Video Sampler's
    upscaler: at 64x64 stage 1 runs at 32x32 (2 steps), its latents are upscaled x2 and refined in 3 steps; the frames
    Save Image writes equal diffusers' documented two-stage recipe in plain diffusers (within one 8-bit level)."""
    from ltx2_two_stages import two_stages

    entry = run_ok(server, with_upscaler(server, video_prompt("tiny-ltx2", width=64, height=64, frames=9, steps=2)))
    folder = server.base_dir / "models" / "latent_upscale_models" / "tiny-ltx2-upscaler"
    frames, _ = two_stages(tiny("ltx2"), str(folder), PROMPT, SEED, 1, 64, 64, 9, 2, 3.0)
    expected = np.clip(255.0 * frames.numpy(), 0, 255).astype(np.uint8)
    saved = saved_frames(server, entry)
    assert len(saved) == 9 and max(np.abs(a.astype(int) - b).max() for a, b in zip(saved, expected)) <= 1


UPSCALER = "30"


def with_upscaler(server, prompt: dict, name: str = "tiny-ltx2-upscaler") -> dict:
    """A TPU Latent Upscale Model (node 30) on `name` in models/latent_upscale_models (the tiny LTX-2 upscaler folder,
    built there once) into the Video Sampler's upscaler."""
    import tiny_models

    folder = server.base_dir / "models" / "latent_upscale_models" / "tiny-ltx2-upscaler"
    if not folder.exists():
        tiny_models.ltx2_upsampler(folder)
    prompt[UPSCALER] = {"class_type": "TPULatentUpscaleModel", "inputs": {"upscaler": name}}
    prompt[SAMPLER]["inputs"]["upscaler"] = [UPSCALER, 0]
    return prompt


def test_a_file_that_is_no_latent_upscaler_is_refused_on_its_node_and_wan_refuses_an_upscaler(
        server, then_a_good_prompt_succeeds):
    from safetensors.torch import save_file

    other = server.base_dir / "models" / "latent_upscale_models" / "not_an_upscaler.safetensors"
    save_file({"weight": torch.zeros(1)}, str(other))
    clear_error(server, with_upscaler(server, video_prompt("tiny-ltx2", width=64, height=64, frames=9), other.name),
                UPSCALER, r"'not_an_upscaler.safetensors' is not a latent upscaler", when="rejected")
    clear_error(server, with_upscaler(server, video_prompt("tiny-wan22-t2v-a14b")), SAMPLER,
                r"Wan 2.2 has no two-stage generation with a latent upscaler", r"disconnect the upscaler",
                when="failed")
