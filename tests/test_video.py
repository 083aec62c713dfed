"""Video (Wan 2.2): each model's tasks equal plain diffusers for the same seed (seed + i per video), frames out as
ComfyUI's IMAGE batch video after video, and the refusals that need no model (frames, images, sizes)."""

import logging

import numpy as np
import pytest
import torch
from PIL import Image

from tpu_diffusers_runtime import memory_plan
from tpu_diffusers_runtime.engine import Engine
from tpu_diffusers_runtime.errors import UserInputError
from tpu_diffusers_runtime.preview import PreviewSpec
from tpu_diffusers_runtime.families import family_for
from tpu_diffusers_runtime.handle import PipelineHandle
from tpu_diffusers_runtime.sources import model_settings
from tpu_diffusers_runtime.specs import Placement
from tpu_diffusers_runtime.tasks import SampleRequest, prepare

PROMPT = "a corgi running on a beach"
PIXELS = (np.random.default_rng(0).random((48, 80, 3)) * 255).astype(np.uint8)  # another size than the video's
FRAMES = 5


def start_image():
    return PIXELS[None].astype(np.float32) / 255.0  # ComfyUI's IMAGE [1, H, W, 3]


def request(**fields):
    return SampleRequest(**{**dict(prompt=PROMPT, width=64, height=64, steps=3, guidance=3.0, seed=7, batch_size=2,
                                   frames=FRAMES), **fields})


def reference(folder, cls, videos, **kwargs):
    """Plain diffusers: `cls` from the folder (from_pipe for image to video on TI2V-5B), one call per video with
    seed + i, frames as [videos x F, H, W, C]."""
    import diffusers

    pipe = diffusers.DiffusionPipeline.from_pretrained(folder, local_files_only=True)
    if type(pipe).__name__ != cls:
        pipe = getattr(diffusers, cls).from_pipe(pipe)
    frames = [pipe(prompt=PROMPT, height=64, width=64, num_frames=FRAMES, num_inference_steps=3, guidance_scale=3.0,
                   generator=torch.Generator("cpu").manual_seed(7 + i), output_type="pt", **kwargs).frames[0]
              for i in range(videos)]
    return torch.cat(frames).permute(0, 2, 3, 1)


CASES = [  # (tiny model, model class, the diffusers class that runs, with a start image)
    ("wan22-t2v-a14b", "WanPipeline", "WanPipeline", False),
    ("wan22-ti2v-5b", "WanPipeline", "WanPipeline", False),
    ("wan22-ti2v-5b", "WanPipeline", "WanImageToVideoPipeline", True),
    ("wan22-i2v-a14b", "WanImageToVideoPipeline", "WanImageToVideoPipeline", True),
    # Wan 2.1: one transformer; its I2V model encodes the start image with CLIP too
    ("wan21-t2v", "WanPipeline", "WanPipeline", False),
    ("wan21-i2v", "WanImageToVideoPipeline", "WanImageToVideoPipeline", True),
]


@pytest.mark.parametrize("name, model_class, cls, with_image", CASES)
def test_frames_equal_plain_diffusers_video_after_video(tiny, name, model_class, cls, with_image):
    engine = Engine()
    handle = PipelineHandle.of(source=tiny(name), model_class=model_class)
    images = (start_image(),) if with_image else ()
    made = engine.generate(handle, request(images=images))
    assert made.images.shape == (2 * FRAMES, 64, 64, 3) and made.images.dtype == torch.float32
    assert made.info.task == ("image2video" if with_image else "text2video") and made.info.pipeline == cls
    family = family_for(model_class, settings=model_settings(tiny(name)))
    assert made.info.frames == FRAMES and made.info.fps == family.fps and f"{FRAMES} frames at" in made.info.summary()
    assert made.audio is None and made.info.sample_rate == 0 and "fps, no sound" in made.info.summary()  # Wan: none
    start = {"image": Image.fromarray(PIXELS)} if with_image else {}
    torch.testing.assert_close(made.images, reference(tiny(name), cls, 2, **start), atol=0, rtol=0)


def test_the_5b_model_is_told_by_its_settings_before_loading(tiny):
    """TI2V-5B is a WanPipeline with expand_timesteps: Wan 2.2's VAE (16x, so sizes step by 32), 24 fps, Wan22
    previews, and image to video; the A14B T2V model is none of these."""
    five_b = family_for("WanPipeline", settings=model_settings(tiny("wan22-ti2v-5b")))
    a14b = family_for("WanPipeline", settings=model_settings(tiny("wan22-t2v-a14b")))
    assert (five_b.size_multiple, five_b.fps, five_b.comfy_latent_format) == (32, 24.0, "Wan22")
    assert (a14b.size_multiple, a14b.fps, a14b.comfy_latent_format) == (16, 16.0, "Wan21")
    with pytest.raises(UserInputError, match=r"width 48 cannot be used with Wan 2.2: it must be a multiple of 32\. "
                                             r"Nearest valid widths: 32 or 64"):
        prepare("WanPipeline", request(width=48), model_settings(tiny("wan22-ti2v-5b")))
    prepare("WanPipeline", request(width=48), model_settings(tiny("wan22-t2v-a14b")))  # 16 is A14B's step


@pytest.mark.parametrize("fields, message", [
    (dict(frames=8), r"frames 8 cannot be used with Wan 2.2: it must be 4k \+ 1 .* Nearest valid frame counts: 5 or 9"),
    (dict(frames=0), r"Wan 2.2 makes video: sample it with the TPU Video Sampler"),
    (dict(images=(start_image(),)), r"WanPipeline has no image2video pipeline, and an image is connected \(this "
                                    r"model takes no image: text to video only\)"),
    (dict(images=(start_image(), start_image())), r"WanPipeline has no firstlast2video pipeline, and a last_image is "
                                                  r"connected\. It runs: text2video with no image"),
])
def test_bad_video_requests_are_refused_before_anything_loads(tiny, fields, message):
    engine = Engine()
    with pytest.raises(UserInputError, match=message):
        engine.generate(PipelineHandle.of(source=tiny("wan22-t2v-a14b"), model_class="WanPipeline"), request(**fields))
    assert not engine.cache  # nothing was loaded


def test_a_video_too_large_for_the_chip_is_refused_before_loading(tiny, monkeypatch):
    """The per-chip memory plan (runtime/memory_plan.py) runs before loading: a chip too small for the tiny A14B's
    weights refuses the run, says what it would need, and nothing is loaded."""
    monkeypatch.setattr(memory_plan, "device_memory_bytes", lambda device_type: 2**20)
    engine = Engine()
    with pytest.raises(UserInputError, match=r"Wan 2.2 at 64x64 x 9 frames, batch 1, needs .* it cannot fit\. Try"
                                             r".* TPU_DIFFUSERS_MEMORY_PLAN=warn runs it anyway"):
        engine.generate(PipelineHandle.of(source=tiny("wan22-t2v-a14b"), model_class="WanPipeline"),
                        request(frames=9, batch_size=1))
    assert not engine.cache


def test_the_memory_plan_set_to_warn_runs_the_video_anyway_and_says_so(tiny, monkeypatch, caplog):
    """The plan's estimate was never measured on a chip: TPU_DIFFUSERS_MEMORY_PLAN=warn runs what it would refuse,
    with the estimate in the run info and the log."""
    monkeypatch.setattr(memory_plan, "device_memory_bytes", lambda device_type: 2**20)  # a chip far too small
    monkeypatch.setenv("TPU_DIFFUSERS_MEMORY_PLAN", "warn")
    with caplog.at_level(logging.WARNING, logger="tpu_diffusers"):
        result = Engine().generate(PipelineHandle.of(source=tiny("wan22-t2v-a14b"), model_class="WanPipeline"),
                                   request(frames=9, batch_size=1))
    assert result.images.shape == (9, 64, 64, 3)
    [note] = [note for note in result.info.notes if note.startswith("memory plan: ")]
    assert "Wan 2.2 at 64x64 x 9 frames, batch 1, needs" in note and "it cannot fit" in note
    assert note.endswith("Running anyway: TPU_DIFFUSERS_MEMORY_PLAN=warn.")
    assert note in caplog.text


def test_an_image_model_refuses_frames():
    with pytest.raises(UserInputError, match=r"FLUX.1 makes images, not video: sample it with TPU Sampler"):
        prepare("FluxPipeline", request())


def test_i2v_needs_its_start_image():
    with pytest.raises(UserInputError, match=r"WanImageToVideoPipeline has no text2video pipeline, and no image is "
                                             r"connected\. It runs: image2video with a start image"):
        prepare("WanImageToVideoPipeline", request())


def test_model_cpu_offload_runs_both_experts_and_equals_on_the_device(tiny):
    """diffusers' offload sequence moves each expert onto the device only while it denoises (transformer, then
    transformer_2), so the inactive one stays off the chip."""
    source = tiny("wan22-t2v-a14b")
    engine = Engine()
    offloaded = PipelineHandle.of(source=source, model_class="WanPipeline", placement=Placement.MODEL_CPU_OFFLOAD)
    made = engine.generate(offloaded, request(batch_size=1))
    pipe = engine.realise(offloaded)[0].pipe
    assert pipe.model_cpu_offload_seq.split("->").index("transformer_2") == \
        pipe.model_cpu_offload_seq.split("->").index("transformer") + 1
    on_device = Engine().generate(PipelineHandle.of(source=source, model_class="WanPipeline"), request(batch_size=1))
    torch.testing.assert_close(made.images, on_device.images, atol=1e-5, rtol=0)  # offload hooks: float rounding


@pytest.mark.parametrize("name, channels, factor", [("wan22-t2v-a14b", 16, 8), ("wan22-ti2v-5b", 48, 16)])
def test_previews_show_the_first_frame_at_latent_resolution(tiny, name, channels, factor):
    rows = torch.randn(channels, 3, generator=torch.Generator().manual_seed(0)) * 0.2
    spec = PreviewSpec(factors=tuple(tuple(row) for row in rows.tolist()), bias=(0.0, 0.0, 0.0))
    steps = []
    Engine().generate(PipelineHandle.of(source=tiny(name), model_class="WanPipeline"), request(batch_size=1),
                      on_progress=lambda done, total, what, *image: steps.append((what, *image)), preview=spec)
    images = [image for what, *image in steps if what == "sampling"]
    assert len(images) == 3 and all(image[0].shape == (64 // factor, 64 // factor, 3) for image in images)
    assert images[0][0].std() > 0


def test_host_memory_counts_every_frame():
    from tpu_diffusers_runtime.tasks import TASKS, check_host_memory

    task = TASKS["text2video"]
    needed = task.host_bytes(request(width=832, height=480, frames=81, batch_size=1))
    assert needed == 2 * 4 * 3 * 832 * 480 * 81
    with pytest.raises(UserInputError, match=r"batch 1 at 832x480 x 81 frames is too large .* or the frames"):
        check_host_memory(task, request(width=832, height=480, frames=81, batch_size=1), needed - 1)


def test_both_experts_denoise_the_high_noise_one_first(tiny):
    """A14B at 3 steps: the tiny T2V model's boundary (0.875 x 1000) puts timesteps 999 and 923 on `transformer` and
    the last (857) on `transformer_2`, as diffusers' WanPipeline switches."""
    engine = Engine()
    handle = PipelineHandle.of(source=tiny("wan22-t2v-a14b"), model_class="WanPipeline")
    pipe = engine.realise(handle)[0].pipe
    calls = []
    hooks = [expert.register_forward_pre_hook(lambda module, args, kwargs, name=name: calls.append(name),
                                              with_kwargs=True)
             for name, expert in (("transformer", pipe.transformer), ("transformer_2", pipe.transformer_2))]
    try:
        engine.generate(handle, request(batch_size=1, guidance=1.0))  # guidance 1: one call per step
    finally:
        for hook in hooks:
            hook.remove()
    assert calls == ["transformer", "transformer", "transformer_2"]


def test_cancel_stops_a_video_within_a_step_and_the_next_run_succeeds(tiny):
    """Progress counts every step over both experts; a callback that raises (ComfyUI's Cancel) stops the run at
    that step, and the loaded pipeline serves the next run."""
    class Cancelled(Exception):
        pass

    engine = Engine()
    handle = PipelineHandle.of(source=tiny("wan22-t2v-a14b"), model_class="WanPipeline")
    steps = []

    def cancel_at_two(done, total, what, *preview):
        steps.append((done, total))
        if what == "sampling" and done == 2:
            raise Cancelled

    with pytest.raises(Cancelled):
        engine.generate(handle, request(batch_size=1), on_progress=cancel_at_two)
    assert [step for step in steps if step[1] == 3] == [(1, 3), (2, 3)]
    again = engine.generate(handle, request(batch_size=1))
    assert not again.info.loaded and again.images.shape == (FRAMES, 64, 64, 3)


def test_text_then_image_to_video_on_the_5b_model_loads_nothing_again(tiny):
    engine = Engine()
    handle = PipelineHandle.of(source=tiny("wan22-ti2v-5b"), model_class="WanPipeline")
    text = engine.generate(handle, request(batch_size=1))
    image = engine.generate(handle, request(batch_size=1, images=(start_image(),)))
    assert (text.info.task, text.info.loaded) == ("text2video", True)
    assert (image.info.task, image.info.pipeline, image.info.loaded) == ("image2video", "WanImageToVideoPipeline", False)


def test_sound_tracks_are_taken_per_call_and_joined_in_batch_order_as_comfyuis_audio():
    """outputs.SoundTrack on real tensors: each call's waveform (diffusers' `audio`, a tensor [B, C, T] whatever the
    output_type) to CPU float32 with the pipeline's rate (`Family.sound_rate`), the calls' joined video after video;
    tracks of two rates are refused rather than mixed."""
    import dataclasses
    import types

    from tpu_diffusers_runtime.outputs import AUDIO, KINDS, CallResult, joined

    family = dataclasses.replace(family_for("WanPipeline"), sound_rate=lambda pipe: pipe.rate)
    kind = KINDS[AUDIO]
    generator = torch.Generator().manual_seed(1)
    tracks = [torch.rand(1, 2, 100, generator=generator, dtype=torch.float64) for _ in range(3)]
    pipe = types.SimpleNamespace(rate=16_000)
    parts = [kind.take(CallResult(types.SimpleNamespace(audio=track), None, pipe, family)) for track in tracks]
    audio = joined({KINDS["frames"]: [torch.zeros(3, 4, 4, 3)], kind: parts}).audio
    assert audio["sample_rate"] == 16_000 and audio["waveform"].dtype == torch.float32
    assert audio["waveform"].shape == (3, 2, 100) and audio["waveform"].device.type == "cpu"
    torch.testing.assert_close(audio["waveform"], torch.cat(tracks).float(), atol=0, rtol=0)
    with pytest.raises(ValueError, match="different sample rates"):
        kind.join([*parts[:1], dict(parts[1], sample_rate=8_000)])


def test_only_a_family_that_makes_sound_asks_for_a_sound_track():
    import dataclasses

    from tpu_diffusers_runtime.outputs import AUDIO, FRAMES
    from tpu_diffusers_runtime.tasks import TASKS

    wan = family_for("WanPipeline")
    assert not wan.makes_sound
    assert [kind.name for kind in TASKS["text2video"].output_kinds(wan)] == [FRAMES]
    sounding = dataclasses.replace(wan, sound_rate=lambda pipe: 24_000)
    assert [kind.name for kind in TASKS["text2video"].output_kinds(sounding)] == [FRAMES, AUDIO]


@pytest.fixture(scope="module")
def tiny_ltx2(tmp_path_factory):
    """A tiny LTX-2 pipeline (tools/tiny_models.ltx2), saved and loaded as a model folder."""
    import tiny_models

    return tiny_models.save(*tiny_models.ltx2("tiny"), tmp_path_factory.mktemp("models") / "tiny-ltx2")


def test_a_real_sound_track_of_diffusers_ltx2_is_taken_as_comfyuis_audio(tiny_ltx2):
    """SoundTrack on what plain diffusers' LTX2Pipeline returns (output_type="pt": frames [B, F, C, H, W], and the
    waveform a tensor [B, 2, T] beside them) at the rate its vocoder's config says: the track as it is, in float32
    on the CPU, with that rate; two calls (seed, seed + 1) join video after video. The same call twice gives the
    same track (nothing random outside the generator)."""
    import diffusers

    from tpu_diffusers_runtime.outputs import AUDIO, FRAMES, KINDS, CallResult, joined

    pipe = diffusers.DiffusionPipeline.from_pretrained(tiny_ltx2, local_files_only=True)
    assert type(pipe).__name__ == "LTX2Pipeline"
    family = family_for("LTX2Pipeline")  # its sound_rate reads the vocoder's config
    calls = [pipe(prompt=PROMPT, negative_prompt="", height=32, width=32, num_frames=9, frame_rate=24.0,
                  num_inference_steps=2, guidance_scale=3.0, max_sequence_length=16, output_type="pt",
                  generator=torch.Generator("cpu").manual_seed(7 + i)) for i in (0, 1, 0)]
    assert isinstance(calls[0].audio, torch.Tensor) and calls[0].audio.shape[:2] == (1, 2)
    assert torch.equal(calls[0].audio, calls[2].audio) and not torch.equal(calls[0].audio, calls[1].audio)
    parts = {KINDS[FRAMES]: [], KINDS[AUDIO]: []}
    for output in calls[:2]:
        for kind in parts:
            parts[kind].append(kind.take(CallResult(output, None, pipe, family)))
    made = joined(parts)
    assert made.images.shape == (2 * 9, 32, 32, 3)
    assert made.audio["sample_rate"] == pipe.vocoder.config.output_sampling_rate == 16_000
    torch.testing.assert_close(made.audio["waveform"], torch.cat([calls[0].audio, calls[1].audio]).float(),
                               atol=0, rtol=0)
