"""LTX-2 (and LTX-2.3's and LTX-2.5's parts) through the engine: text to video, image to video and first/last frame to video with
sound, each equal to plain diffusers' LTX2Pipeline / LTX2ImageToVideoPipeline / LTX2ConditionPipeline from the same
folder for the same seed (seed + i per video), the frames and the sound track (AUDIO, at the vocoder's rate); its 8k + 1 frame rule, and a
last image it cannot take, refused before anything loads. With a latent upscaler, its two-stage generation (half
size, x2 latent upscale, refine) equals diffusers' documented recipe."""

import numpy as np
import pytest
import torch
from PIL import Image

import ltx2_two_stages

from tpu_diffusers_runtime.engine import Engine
from tpu_diffusers_runtime.errors import UserInputError
from tpu_diffusers_runtime.families import family_for
from tpu_diffusers_runtime.handle import PipelineHandle
from tpu_diffusers_runtime.tasks import SampleRequest

PROMPT = "a corgi barking on a beach"
PIXELS = (np.random.default_rng(0).random((48, 80, 3)) * 255).astype(np.uint8)  # another size than the video's
# two last frames: video i ends on item i % 2
LAST = (np.random.default_rng(1).random((2, 40, 24, 3)) * 255).astype(np.uint8)
FRAMES = 9  # 8k + 1


@pytest.fixture(scope="module")
def tiny_ltx2(tmp_path_factory):
    import tiny_models

    folder = tmp_path_factory.mktemp("models") / "tiny-ltx2"
    tiny_models.build("ltx2", folder)
    return str(folder)


@pytest.fixture(scope="module", params=["ltx23", "ltx25"])
def tiny_later_ltx(request, tmp_path_factory):
    """LTX-2.3's parts (tools/tiny_models.py ltx23: gated attention, prompt modulation, perturbed attention, a
    projection per modality, a 4-stage VAE, the vocoder with bandwidth extension) and LTX-2.5's for the classic
    pipeline (ltx25: a Gemma 4 text encoder, a video FFN without bias, the keyframe position embedding)."""
    import tiny_models

    folder = tmp_path_factory.mktemp("models") / f"tiny-{request.param}"
    tiny_models.build(request.param, folder)
    return str(folder)


def request(**fields):
    return SampleRequest(**{**dict(prompt=PROMPT, width=32, height=32, steps=2, guidance=3.0, seed=7, batch_size=2,
                                   frames=FRAMES), **fields})


def reference(folder, cls, videos, inputs=lambda i: {}):
    """Plain diffusers: `cls` from the folder (from_pipe for the image tasks), one call per video with seed + i and
    inputs(i) (its images), at the pipeline's default guidances but the video CFG, and frame_rate = the family's fps."""
    import diffusers

    pipe = diffusers.DiffusionPipeline.from_pretrained(folder, local_files_only=True)
    if type(pipe).__name__ != cls:
        pipe = getattr(diffusers, cls).from_pipe(pipe)
    calls = [pipe(prompt=PROMPT, negative_prompt="", height=32, width=32, num_frames=FRAMES, frame_rate=24.0,
                  num_inference_steps=2, guidance_scale=3.0, generator=torch.Generator("cpu").manual_seed(7 + i),
                  output_type="pt", **inputs(i)) for i in range(videos)]
    frames = torch.cat([call.frames[0] for call in calls]).permute(0, 2, 3, 1)
    return frames, torch.cat([call.audio for call in calls]).float(), pipe.vocoder.config.output_sampling_rate


def first_last(i):
    """diffusers' documented first/last frame conditions (index: a latent frame, -1 the last) for video i."""
    from diffusers.pipelines.ltx2.pipeline_ltx2_condition import LTX2VideoCondition

    return {"conditions": [LTX2VideoCondition(frames=Image.fromarray(PIXELS), index=0),
                           LTX2VideoCondition(frames=Image.fromarray(LAST[i % 2]), index=-1)]}


TASKS = {  # task: (its diffusers class, the Sampler's images, plain diffusers' inputs for video i)
    "text2video": ("LTX2Pipeline", (), lambda i: {}),
    "image2video": ("LTX2ImageToVideoPipeline", (PIXELS[None],), lambda i: {"image": Image.fromarray(PIXELS)}),
    "firstlast2video": ("LTX2ConditionPipeline", (PIXELS[None], LAST), first_last),
}


@pytest.fixture(scope="module")
def engine():
    """One engine for the tasks, as ComfyUI keeps one: each task after the first runs on the model already loaded (a
    pipeline made with from_pipe after other pipelines of the same components have run)."""
    return Engine(distribute=False)


@pytest.mark.parametrize("task", TASKS)
def test_frames_and_sound_equal_plain_diffusers_video_after_video(tiny_ltx2, engine, task):
    cls, images, inputs = TASKS[task]
    made = engine.generate(PipelineHandle.of(source=tiny_ltx2, model_class="LTX2Pipeline"),
                           request(images=tuple(image.astype(np.float32) / 255.0 for image in images)))
    assert made.info.task == task and made.info.pipeline == cls
    assert made.images.shape == (2 * FRAMES, 32, 32, 3) and made.info.fps == 24.0
    frames, waveform, rate = reference(tiny_ltx2, cls, 2, inputs)
    assert (made.images - frames).abs().max() <= 1 / 255  # within one 8-bit level
    assert made.audio["sample_rate"] == rate == 16_000 and made.info.sample_rate == rate
    assert made.audio["waveform"].shape == waveform.shape and waveform.shape[:2] == (2, 2)
    torch.testing.assert_close(made.audio["waveform"], waveform, atol=1e-4, rtol=0)


@pytest.mark.parametrize("task", TASKS)
def test_ltx23_and_ltx25_frames_and_sound_equal_plain_diffusers(tiny_later_ltx, engine, task):
    """LTX-2.3's and LTX-2.5's parts, each task, one video: the frames (LTX-2.5's start images re-encoded at its own
    CRF, which diffusers picks from the Gemma 4 encoder), and the 2x bandwidth-extended sound (32 kHz here)."""
    cls, images, inputs = TASKS[task]
    made = engine.generate(PipelineHandle.of(source=tiny_later_ltx, model_class="LTX2Pipeline"),
                           request(batch_size=1, images=tuple(image.astype(np.float32) / 255.0 for image in images)))
    assert made.info.task == task and made.info.pipeline == cls
    frames, waveform, rate = reference(tiny_later_ltx, cls, 1, inputs)
    assert (made.images - frames).abs().max() <= 1 / 255
    assert made.audio["sample_rate"] == rate == 32_000
    assert made.audio["waveform"].shape == waveform.shape and waveform.shape[:2] == (1, 2)
    torch.testing.assert_close(made.audio["waveform"], waveform, atol=1e-4, rtol=0)


def test_frames_off_the_8k_plus_1_rule_are_refused_before_loading(tmp_path):
    """13 frames is 4k + 1 (the Video Sampler's queue-time rule, which any video model may take) but not 8k + 1:
    refused when the run is planned, naming the rule and the nearest counts, with no model folder to load at all;
    Wan takes 5 (4k + 1) at queue time and in its own rule."""
    from tpu_diffusers_runtime import input_checks
    from tpu_diffusers_runtime.tasks import prepare

    ltx2, wan = family_for("LTX2Pipeline"), family_for("WanPipeline")
    assert input_checks.video_frame_factor() == 4
    assert input_checks.frames_problem(13) is None and input_checks.frames_problem(5) is None
    assert input_checks.frames_problem(5, wan) is None and input_checks.frames_problem(9, ltx2) is None
    with pytest.raises(UserInputError, match=r"frames 13 cannot be used with LTX-2: it must be 8k \+ 1.*: 9 or 17"):
        prepare("LTX2Pipeline", request(frames=13))
    missing = PipelineHandle.of(source=str(tmp_path / "no-such-folder"), model_class="LTX2Pipeline")
    with pytest.raises(UserInputError, match=r"8k \+ 1"):
        Engine(distribute=False).generate(missing, request(frames=13))


def test_a_last_image_needs_the_first_and_a_model_with_first_last_frame_to_video():
    """The Video Sampler refuses last_image without image (when queued, and again when it runs); both images run
    LTX2ConditionPipeline on either model class, and a model without that task (Wan 2.2 TI2V-5B) refuses them when the
    run is planned, naming what it runs."""
    from tpu_diffusers_runtime.input_checks import last_image_problem
    from tpu_diffusers_runtime.tasks import prepare

    assert last_image_problem(True, True) is None and last_image_problem(True, False) is None
    assert last_image_problem(False, True).startswith("last_image is connected but image is not")
    both = request(images=(PIXELS[None] / 255.0, LAST / 255.0))
    for model_class in ("LTX2Pipeline", "LTX2ImageToVideoPipeline"):
        _, task, pipeline, _ = prepare(model_class, both)
        assert (task.name, pipeline.cls) == ("firstlast2video", "LTX2ConditionPipeline")
    with pytest.raises(UserInputError, match=r"Wan 2.2 WanPipeline has no firstlast2video pipeline, and a last_image "
                                             r"is connected\. It runs: text2video with no image \(WanPipeline\); "
                                             r"image2video with a start image \(WanImageToVideoPipeline\)\. Connect "
                                             r"or disconnect the Sampler's image, last_image, reference_video and "
                                             r"references inputs to match\."):
        prepare("WanPipeline", both, {"expand_timesteps": True})


def test_its_plan_reads_its_own_configs_and_the_tiny_model_is_never_refused(tiny_ltx2):
    """The memory model reads LTX-2's transformer (hidden = heads x head width, FFN 4x) and its video VAE's factors
    (the tiny one 2x spatial and temporal, as diffusers computes them from the config)."""
    from tpu_diffusers_runtime import memory_plan

    family = family_for("LTX2Pipeline")
    handle = PipelineHandle.of(source=tiny_ltx2, model_class="LTX2Pipeline")
    memory_plan.check_fits(handle, family, request())
    sizes = memory_plan.sizes_of_folder(tiny_ltx2, family)
    assert (sizes.hidden, sizes.ffn, sizes.patch) == (16, 64, (1, 1, 1))
    assert (sizes.vae_spatial, sizes.vae_temporal, sizes.vae_width, sizes.vae_patch) == (2, 2, 8, 1)


def test_previews_unpack_the_first_latent_frame(tiny_ltx2):
    """The step latents are packed tokens [B, frames x h x w, C]: the preview grid is frame 0 as [B, C, h, w], what
    the pipeline's own _unpack_latents gives."""
    import diffusers

    pipe = diffusers.DiffusionPipeline.from_pretrained(tiny_ltx2, local_files_only=True)
    packed = torch.randn(1, 5 * 16 * 16, 4)  # 9 frames at 32x32: 5 latent frames of 16x16 (the tiny VAE's 2x)
    grid = family_for("LTX2Pipeline").latent_grid(pipe, packed, 32, 32)
    assert grid.shape == (1, 4, 16, 16)
    torch.testing.assert_close(grid, packed.reshape(1, 5, 16, 16, 4)[:, 0].permute(0, 3, 1, 2))


def test_each_step_sends_a_preview_of_the_first_frame(tiny_ltx2):
    """Through the engine: one preview per step, of the first latent frame at latent resolution (the tiny VAE's 2x:
    16x16 for 32x32), following the denoising."""
    from tpu_diffusers_runtime.preview import PreviewSpec

    rows = torch.randn(4, 3, generator=torch.Generator().manual_seed(0)) * 0.2  # the tiny VAE's 4 channels
    calls = []
    Engine(distribute=False).generate(
        PipelineHandle.of(source=tiny_ltx2, model_class="LTX2Pipeline"), request(batch_size=1, steps=3),
        on_progress=lambda done, total, what, *image: calls.append((done, what, *image)),
        preview=PreviewSpec(factors=tuple(tuple(row) for row in rows.tolist()), bias=(0.1, -0.1, 0.0)))
    images = [image for done, what, image in (c for c in calls if c[1] == "sampling" and len(c) == 3)]
    assert len(images) == 3 and all(image.shape == (16, 16, 3) for image in images)
    assert images[0].std() > 0 and not np.array_equal(images[0], images[-1])


@pytest.fixture(scope="module")
def tiny_upscaler(tmp_path_factory):
    import tiny_models

    return str(tiny_models.ltx2_upsampler(tmp_path_factory.mktemp("models") / "tiny-ltx2-upscaler"))


def test_two_stages_with_an_upscaler_equal_diffusers_recipe_video_after_video(tiny_ltx2, tiny_upscaler):
    """64x64 with an upscaler: stage 1 at 32x32 (2 steps), x2 latent upscale, the 3-step refine; frames and sound equal
    diffusers' documented recipe in plain diffusers (tests/ltx2_two_stages.py) for seed + i. Progress counts both
    stages' steps of both videos, and each step has a preview of its stage's first frame (16x16 latents, then
    32x32)."""
    from tpu_diffusers_runtime.preview import PreviewSpec

    calls = []
    made = Engine(distribute=False).generate(
        PipelineHandle.of(source=tiny_ltx2, model_class="LTX2Pipeline"),
        request(width=64, height=64, upscaler=tiny_upscaler),
        on_progress=lambda done, total, what, *image: calls.append((done, total, what, *image)),
        preview=PreviewSpec(factors=((0.1, 0.2, 0.3),) * 4))
    frames, waveform = ltx2_two_stages.two_stages(tiny_ltx2, tiny_upscaler, PROMPT, 7, 2, 64, 64, FRAMES, 2, 3.0)
    assert "two stages: 32x32, latents upscaled x2 (tiny-ltx2-upscaler), 3 refine steps at 64x64" in made.info.notes
    assert made.images.shape == (2 * FRAMES, 64, 64, 3) == frames.shape
    assert (made.images - frames).abs().max() <= 1 / 255
    torch.testing.assert_close(made.audio["waveform"], waveform, atol=1e-4, rtol=0)
    sampling = [call for call in calls if call[2] == "sampling"]
    assert [(done, total) for done, total, *_ in sampling] == [(done, 10) for done in range(1, 11)]
    assert [call[3].shape[:2] for call in sampling] == [(16, 16)] * 2 + [(32, 32)] * 3 + [(16, 16)] * 2 + [(32, 32)] * 3


def test_a_refine_lora_applies_to_the_refine_stage_only_as_diffusers_recipe(tiny_ltx2, tiny_upscaler, tmp_path):
    """A LoRA with expert 'refine' (the templates' distilled LoRA): the first stage runs without it, the refine with it
    fused, as diffusers' recipe with the LoRA fused before stage 2; frames and sound equal. The run after it is the
    first stage's again: without the LoRA, the base run is unchanged bit for bit."""
    import tiny_loras
    from tpu_diffusers_runtime.specs import LoraSpec

    lora = str(tiny_loras.build(tiny_ltx2, tmp_path / "distilled.safetensors", seed=1))
    engine = Engine(distribute=False)
    base = PipelineHandle.of(source=tiny_ltx2, model_class="LTX2Pipeline")
    asked = request(width=64, height=64, upscaler=tiny_upscaler, batch_size=1)
    before = engine.generate(base, asked)
    made = engine.generate(base.replace(loras=(LoraSpec(path=lora, strength=0.8, expert="refine"),)), asked)
    frames, waveform = ltx2_two_stages.two_stages(tiny_ltx2, tiny_upscaler, PROMPT, 7, 1, 64, 64, FRAMES, 2, 3.0,
                                                  refine_lora=(lora, 0.8))
    assert "LoRA: distilled.safetensors @ 0.8 (the refine stage only)" in made.info.notes
    assert (made.images - frames).abs().max() <= 1 / 255
    torch.testing.assert_close(made.audio["waveform"], waveform, atol=1e-4, rtol=0)
    assert (made.images - before.images).abs().max() > 1e-3
    after = engine.generate(base, asked)
    assert torch.equal(after.images, before.images) and torch.equal(after.audio["waveform"], before.audio["waveform"])


def test_a_refine_lora_is_refused_without_a_refine_stage(tiny_ltx2, tmp_path):
    """'refine' needs a two-stage run: refused without an upscaler (before loading) and on a model without two stages
    (the LoRA node's check), saying what to set."""
    import tiny_loras
    from tpu_diffusers_runtime.features.lora import check_lora_fits
    from tpu_diffusers_runtime.plan import plan_request
    from tpu_diffusers_runtime.specs import LoraSpec

    lora = LoraSpec(path=str(tiny_loras.build(tiny_ltx2, tmp_path / "distilled.safetensors", seed=1)), strength=1.0,
                    expert="refine")
    handle = PipelineHandle.of(source=tiny_ltx2, model_class="LTX2Pipeline", loras=(lora,))
    with pytest.raises(UserInputError, match=r"'distilled.safetensors' is set to expert 'refine'.* this run has no "
                                             r"latent upscaler: connect one"):
        plan_request(handle, request())
    with pytest.raises(UserInputError, match=r"a FluxPipeline has not \(models with one: LTX-2\). Set its expert to "
                                             r"high_noise"):
        check_lora_fits("FluxPipeline", tiny_ltx2, lora)  # refused before any configs are read


def test_a_single_upscaler_file_runs_as_its_folder_and_under_offload(tiny_ltx2, tiny_upscaler, tmp_path):
    """The folder's weights file alone (the original layout's keys are diffusers' own): its config read off the
    shapes, the same video; and the same under model CPU offload."""
    import shutil

    single = tmp_path / "ltx-2.3-spatial-upscaler-x2-tiny.safetensors"
    shutil.copy(f"{tiny_upscaler}/diffusion_pytorch_model.safetensors", single)
    engine, handle = Engine(distribute=False), PipelineHandle.of(source=tiny_ltx2, model_class="LTX2Pipeline")
    from_file = engine.generate(handle, request(width=64, height=64, batch_size=1, upscaler=str(single)))
    from_folder = engine.generate(handle, request(width=64, height=64, batch_size=1, upscaler=tiny_upscaler))
    assert torch.equal(from_file.images, from_folder.images)
    # under model CPU offload (the upscaler on the device beside the VAE the offload hooks move): the same video
    offloaded = Engine(distribute=False).generate(
        PipelineHandle.of(source=tiny_ltx2, model_class="LTX2Pipeline", placement="model_cpu_offload"),
        request(width=64, height=64, batch_size=1, upscaler=tiny_upscaler))
    torch.testing.assert_close(offloaded.images, from_folder.images, atol=1e-5, rtol=0)


def test_upscaler_refusals_come_before_anything_loads(tiny_ltx2, tiny_upscaler, tmp_path):
    """A model without a two-stage generation, a size that is not a multiple of twice the size step (the nearest
    ones named), and a file that is not a latent upscaler: refused when the run is planned, with no model folder."""
    from safetensors.torch import save_file

    from tpu_diffusers_runtime.tasks import prepare

    with pytest.raises(UserInputError, match=r"Wan 2.2 has no two-stage generation.*models that do: LTX-2.*disconnect"):
        prepare("WanPipeline", request(frames=5, upscaler=tiny_upscaler))
    with pytest.raises(UserInputError, match=r"width 96 cannot be used with a latent upscaler.*multiple of 64 "
                                             r"\(2 x 32\): 64 or 128"):
        prepare("LTX2Pipeline", request(width=96, height=64, upscaler=tiny_upscaler))
    other = tmp_path / "not-an-upscaler.safetensors"
    save_file({"initial_conv.weight": torch.zeros(1)}, other)
    missing = PipelineHandle.of(source=str(tmp_path / "no-such-folder"), model_class="LTX2Pipeline")
    with pytest.raises(UserInputError, match=r"'not-an-upscaler.safetensors' is not a latent upscaler.*"
                                             r"post_upsample_res_blocks.0.conv1.weight.*ltx-2.3-spatial-upscaler-x2"):
        Engine(distribute=False).generate(missing, request(width=64, height=64, upscaler=str(other)))
    with pytest.raises(UserInputError, match=r"is not a latent upscaler folder.*latent_upsampler/"):
        prepare("LTX2Pipeline", request(width=64, height=64, upscaler=tiny_ltx2))


def test_the_refine_steps_are_the_distilled_schedule():
    from diffusers.pipelines.ltx2.utils import STAGE_2_DISTILLED_SIGMA_VALUES

    assert family_for("LTX2Pipeline").two_stage.refine_steps == len(STAGE_2_DISTILLED_SIGMA_VALUES)


def test_two_replicas_in_worker_processes_run_the_upscaler_and_a_sigmas_schedule_as_one_process(tiny_ltx2,
                                                                                                tiny_upscaler):
    """The upscaler's path and a sigmas schedule travel in the request to each worker rank (2 replicas on CPU ranks, a
    video each, seed + its start), which loads the upscaler beside its pipeline: the videos equal diffusers' recipe
    for a distilled checkpoint (its first stage on the distilled sigmas at guidance 1) for seed + i."""
    from diffusers.pipelines.ltx2.utils import DISTILLED_SIGMA_VALUES

    from tpu_diffusers_runtime.specs import MeshSpec

    engine = Engine()
    try:
        made = engine.generate(
            PipelineHandle.of(source=tiny_ltx2, model_class="LTX2Pipeline", mesh=MeshSpec(chips=2, replicas=2)),
            request(width=64, height=64, upscaler=tiny_upscaler, steps=len(DISTILLED_SIGMA_VALUES), guidance=1.0,
                    sigmas=tuple(DISTILLED_SIGMA_VALUES)))
    finally:
        engine.unload()
    assert made.info.replica_images == (1, 1)
    frames, waveform = ltx2_two_stages.two_stages(tiny_ltx2, tiny_upscaler, PROMPT, 7, 2, 64, 64, FRAMES,
                                                  len(DISTILLED_SIGMA_VALUES), 1.0, DISTILLED_SIGMA_VALUES)
    assert (made.images - frames).abs().max() <= 1 / 255
    torch.testing.assert_close(made.audio["waveform"], waveform, atol=1e-4, rtol=0)


def test_upscaler_folders_are_listed_and_a_pipeline_folder_gives_its_subfolders(tiny_ltx2, tiny_upscaler, tmp_path):
    """The node's list: upscaler folders at any depth (an upscaler folder itself, a pipeline folder holding one in
    latent_upsampler/, as Lightricks/LTX-2's), not other model folders; the pipeline folder loads its subfolder's."""
    import shutil

    from tpu_diffusers_runtime import upscalers

    shutil.copytree(tiny_upscaler, tmp_path / "upscalers" / "x2" / "tiny")
    shutil.copytree(tiny_upscaler, tmp_path / "diffusers" / "LTX-2" / "latent_upsampler")
    (tmp_path / "diffusers" / "LTX-2" / "model_index.json").write_text('{"_class_name": "LTX2Pipeline"}')
    shutil.copytree(f"{tiny_ltx2}/vae", tmp_path / "diffusers" / "other" / "vae")
    roots = [str(tmp_path / "upscalers"), str(tmp_path / "diffusers")]
    assert upscalers.list_folders(roots) == ["LTX-2", "x2/tiny"]
    two_stage = family_for("LTX2Pipeline").two_stage
    loaded = upscalers.load(str(tmp_path / "diffusers" / "LTX-2"), two_stage, torch.float32, "cpu")
    assert type(loaded).__name__ == "LTX2LatentUpsamplerModel" and loaded.config.in_channels == 4


def distilled_reference(folder, sigmas, guidance):
    """Plain diffusers' distilled-checkpoint recipe (docs api/pipelines/ltx2, "Distilled checkpoint generation") on one
    video: the schedule as `sigmas`, on a scheduler that uses them as given (no dynamic shift), at `guidance`."""
    import diffusers

    pipe = diffusers.DiffusionPipeline.from_pretrained(folder, local_files_only=True)
    pipe.scheduler = diffusers.FlowMatchEulerDiscreteScheduler.from_config(
        pipe.scheduler.config, use_dynamic_shifting=False, shift_terminal=None)
    made = pipe(prompt=PROMPT, negative_prompt="", height=32, width=32, num_frames=FRAMES, frame_rate=24.0,
                num_inference_steps=len(sigmas), sigmas=list(sigmas), guidance_scale=guidance,
                generator=torch.Generator("cpu").manual_seed(7), output_type="pt")
    return made.frames[0].permute(0, 2, 3, 1), made.audio.float()


def test_a_sigmas_schedule_runs_as_given_as_diffusers_distilled_recipe(tiny_ltx2, engine):
    """A SIGMAS input (here LTX-2's distilled schedule, at guidance 1): the frames and sound of diffusers' distilled
    recipe, which runs the schedule unshifted; the loaded pipeline keeps its own scheduler for the next run (a run
    without sigmas after it still equals plain diffusers)."""
    from diffusers.pipelines.ltx2.utils import DISTILLED_SIGMA_VALUES

    handle = PipelineHandle.of(source=tiny_ltx2, model_class="LTX2Pipeline")
    made = engine.generate(handle, request(batch_size=1, steps=len(DISTILLED_SIGMA_VALUES), guidance=1.0,
                                           sigmas=tuple(DISTILLED_SIGMA_VALUES)))
    frames, waveform = distilled_reference(tiny_ltx2, DISTILLED_SIGMA_VALUES, 1.0)
    assert (made.images - frames).abs().max() <= 1 / 255
    torch.testing.assert_close(made.audio["waveform"], waveform, atol=1e-4, rtol=0)
    again = engine.generate(handle, request(batch_size=1))
    plain, _, _ = reference(tiny_ltx2, "LTX2Pipeline", 1)
    assert (again.images - plain).abs().max() <= 1 / 255


def test_a_sigmas_schedule_is_refused_when_the_model_takes_none_or_it_is_no_schedule():
    from tpu_diffusers_runtime.tasks import prepare

    with pytest.raises(UserInputError, match=r"Wan 2.2 takes no sigmas schedule \(models that do: LTX-2\): disconnect"):
        prepare("WanPipeline", request(frames=5, steps=2, sigmas=(1.0, 0.5)))
    with pytest.raises(UserInputError, match=r"sigmas 1, 1.5 cannot be used: a flow-matching model's schedule "
                                             r"decreases from at most 1"):
        prepare("LTX2Pipeline", request(steps=2, sigmas=(1.0, 1.5)))
    with pytest.raises(UserInputError, match=r"3 sigmas make 3 steps, but steps is 2"):
        prepare("LTX2Pipeline", request(steps=2, sigmas=(1.0, 0.5, 0.25)))


# a reference video longer than the videos: trimmed to FRAMES
REFERENCE = (np.random.default_rng(2).random((FRAMES + 4, 40, 56, 3)) * 255).astype(np.uint8)


@pytest.mark.parametrize("images", [(), (PIXELS[None],)], ids=["text", "first_frame"])
def test_in_context_video_equals_plain_diffusers(tiny_ltx2, engine, images):
    """A reference video (IC-LoRA's condition, the Video Sampler's reference_video) runs LTX2InContextPipeline
    (from_pipe), with the image as the first frame where one is connected: frames and sound equal plain diffusers'
    call with the same reference (diffusers crops it to the video's size and trims it to its frames)."""
    from diffusers.pipelines.ltx2.pipeline_ltx2_condition import LTX2VideoCondition
    from diffusers.pipelines.ltx2.pipeline_ltx2_ic_lora import LTX2ReferenceCondition

    made = engine.generate(PipelineHandle.of(source=tiny_ltx2, model_class="LTX2Pipeline"),
                           request(batch_size=1, images=tuple(image.astype(np.float32) / 255.0 for image in images),
                                   reference_video=REFERENCE.astype(np.float32) / 255.0))
    assert made.info.task == "incontext2video" and made.info.pipeline == "LTX2InContextPipeline"

    def inputs(i):
        given = {"reference_conditions": [LTX2ReferenceCondition(frames=[Image.fromarray(f) for f in REFERENCE])]}
        if images:
            given["conditions"] = [LTX2VideoCondition(frames=Image.fromarray(PIXELS), index=0)]
        return given

    frames, waveform, _ = reference(tiny_ltx2, "LTX2InContextPipeline", 1, inputs)
    assert (made.images - frames).abs().max() <= 1 / 255
    torch.testing.assert_close(made.audio["waveform"], waveform, atol=1e-4, rtol=0)


def test_in_context_reference_frames_and_combinations_are_refused_before_loading():
    """diffusers encodes the reference's first `frames` frames, which must be 8k + 1; in-context with an upscaler or a
    last image is refused, saying what to change."""
    from tpu_diffusers_runtime.tasks import prepare

    with pytest.raises(UserInputError, match=r"reference_video has 6 frames, fewer than the video's 9: LTX-2 encodes "
                                             r"it as a video, so it must have 8k \+ 1 frames\. Give it 1 \(the first "
                                             r"of them\) or at least 9 frames"):
        prepare("LTX2Pipeline", request(reference_video=np.zeros((6, 32, 32, 3), np.float32)))
    prepare("LTX2Pipeline", request(reference_video=np.zeros((13, 32, 32, 3), np.float32)))  # the first 9
    with pytest.raises(UserInputError, match="reference_video with an upscaler"):
        prepare("LTX2Pipeline", request(width=64, height=64, upscaler="/x", reference_video=np.zeros((9, 8, 8, 3))))
    with pytest.raises(UserInputError, match=r"LTX2InContextPipeline takes at most 1 image.*disconnect last_image"):
        prepare("LTX2Pipeline", request(images=(PIXELS[None] / 255.0, LAST / 255.0),
                                        reference_video=np.zeros((9, 8, 8, 3))))


def test_the_reference_video_travels_to_workers_beside_the_images():
    """The worker wire form carries the reference video as a binary payload of its own, after the images."""
    sent = request(images=(PIXELS[None] / 255.0,), reference_video=REFERENCE / 255.0)
    data, payloads = sent.to_wire()
    assert data["reference_video_shape"] == [FRAMES, *REFERENCE.shape[1:]] and len(payloads) == 2  # its first FRAMES
    received = SampleRequest.from_wire(data, [bytes(payload) for payload in payloads])
    assert np.array_equal(received.reference_video, sent.reference_video)
    assert np.array_equal(received.images[0], sent.images[0]) and received.mask is None
    assert SampleRequest.from_wire(*request().to_wire()).reference_video is None


def test_an_ic_lora_s_reference_downscale_factor_comes_from_its_file(tiny_ltx2, engine, tmp_path):
    """An IC-LoRA trained on half-size references records reference_downscale_factor 2 in its safetensors metadata:
    the reference is encoded at half the video's size, equal to plain diffusers' LTX2InContextPipeline with the LoRA
    fused and that factor; a size the factor cannot halve onto the VAE's grid is refused before loading."""
    import tiny_loras
    from diffusers.pipelines.ltx2.pipeline_ltx2_ic_lora import LTX2ReferenceCondition
    from safetensors.torch import load_file, save_file

    from tpu_diffusers_runtime.plan import plan_request
    from tpu_diffusers_runtime.specs import LoraSpec

    lora = tiny_loras.build(tiny_ltx2, tmp_path / "ic.safetensors", "comfyui")
    save_file(load_file(str(lora)), str(lora), metadata={"reference_downscale_factor": "2"})
    base = PipelineHandle.of(source=tiny_ltx2, model_class="LTX2Pipeline")
    handle = base.replace(loras=(LoraSpec(str(lora), 1.0),))
    video = request(width=64, height=64, batch_size=1, reference_video=REFERENCE / 255.0)
    assert plan_request(handle, video).request.reference_downscale == 2
    with pytest.raises(UserInputError, match=r"reference_downscale_factor is 2 .* multiples of 64"):
        plan_request(handle, request(width=96, height=64, reference_video=REFERENCE / 255.0))
    made = engine.generate(handle, video)

    import diffusers

    pipe = diffusers.LTX2InContextPipeline.from_pretrained(tiny_ltx2, local_files_only=True)
    pipe.load_lora_weights(str(lora), adapter_name="ic")
    pipe.fuse_lora(components=["transformer"], adapter_names=["ic"])
    frames = pipe(prompt=PROMPT, negative_prompt="", height=64, width=64, num_frames=FRAMES, frame_rate=24.0,
                  num_inference_steps=2, guidance_scale=3.0, generator=torch.Generator("cpu").manual_seed(7),
                  output_type="pt", reference_downscale_factor=2,
                  reference_conditions=[LTX2ReferenceCondition(frames=[Image.fromarray(f) for f in REFERENCE])]).frames
    assert (made.images - frames[0].permute(0, 2, 3, 1)).abs().max() <= 1 / 255
    engine.generate(base, request(batch_size=1))  # the next run without the LoRA: the base back for the others
