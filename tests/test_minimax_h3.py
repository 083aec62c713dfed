"""MiniMax H3 (runtime/families/minimax_h3.py), diffusers' modular blocks only: text to video, image to video and
first/last frame to video and reference to video from a tiny random modular folder (tools/tiny_models.py minimax_h3), frames and stereo sound
against the modular pipeline as a diffusers user runs it (`ModularPipeline.from_pretrained(folder, workflow=...)`, one
call per video with seed + i); its 17n + 5 frame rule refused when the run is planned; one partition loaded at a time
(t2va/fl2va's `transformer`, or ref2va's `transformer_ref` for a reference run, which says so); an IC-LoRA's reference
video refused. Its diffusion-model
files in Comfy-Org's layout (tools/tiny_single_files.minimax_h3_files) through the File Loader's plan: the video and
sound of the folder holding the file's values, the templates' pruned file (ComfyUI's curve form) too; ref2va files
refused when queued."""

import shutil
from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image

from tpu_diffusers_runtime import input_checks
from tpu_diffusers_runtime.device import device_info
from tpu_diffusers_runtime.engine import Engine
from tpu_diffusers_runtime.errors import UserInputError
from tpu_diffusers_runtime.families import family_for
from tpu_diffusers_runtime.handle import PipelineHandle
from tpu_diffusers_runtime.loading import load_pipeline
from tpu_diffusers_runtime.references import Reference
from tpu_diffusers_runtime.specs import MeshSpec
from tpu_diffusers_runtime.tasks import SampleRequest

PIPELINE = "MiniMaxH3ModularPipeline"
PROMPT = "a cat playing piano"
FRAMES = 124  # 17n + 5, the fewest it makes (5 s at 24 fps)
PIXELS = (np.random.default_rng(0).random((40, 64, 3)) * 255).astype(np.uint8)  # another size than the video's
LAST = (np.random.default_rng(1).random((2, 40, 24, 3)) * 255).astype(np.uint8)  # video i ends on item i % 2


@pytest.fixture(scope="module")
def tiny_h3(tmp_path_factory):
    import tiny_models

    folder = tmp_path_factory.mktemp("models") / "tiny-minimax-h3"
    tiny_models.save(*tiny_models.minimax_h3(), folder)
    return str(folder)


@pytest.fixture(scope="module")
def engine():
    return Engine(distribute=False)


def request(**fields):
    return SampleRequest(**{**dict(prompt=PROMPT, width=32, height=32, steps=3, guidance=3.0, seed=7, batch_size=2,
                                   frames=FRAMES, negative_prompt="blurry"), **fields})


def reference(folder, workflow, videos, inputs=lambda i: {}):
    """The modular pipeline as diffusers' users run it: that workflow's components only, one call per video."""
    from diffusers import ModularPipeline

    pipe = ModularPipeline.from_pretrained(folder, workflow=workflow)
    pipe.load_components(dtype=torch.float32)
    calls = [pipe(prompt=PROMPT, num_frames=FRAMES, height=32, width=32, num_inference_steps=3,
                  generator=torch.Generator("cpu").manual_seed(7 + i), output_type="pt",
                  output=["videos", "audio", "sampling_rate"], **inputs(i)) for i in range(videos)]
    frames = torch.cat([call["videos"][0] for call in calls]).permute(0, 2, 3, 1)
    return frames, torch.cat([call["audio"] for call in calls]).float(), calls[0]["sampling_rate"]


TASKS = {  # task: (its workflow, the Sampler's images, the blocks' inputs for video i)
    "text2video": ("t2va", (), lambda i: {}),
    "image2video": ("fl2va", (PIXELS[None],), lambda i: {"image": Image.fromarray(PIXELS)}),
    "firstlast2video": ("fl2va", (PIXELS[None], LAST),
                        lambda i: {"image": Image.fromarray(PIXELS), "last_image": Image.fromarray(LAST[i % 2])}),
}


@pytest.mark.parametrize("task", TASKS)
def test_frames_and_sound_equal_the_modular_pipeline_video_after_video(tiny_h3, engine, task):
    workflow, images, inputs = TASKS[task]
    made = engine.generate(PipelineHandle.of(source=tiny_h3, model_class=PIPELINE),
                           request(images=tuple(image.astype(np.float32) / 255.0 for image in images)))
    assert made.info.task == task and made.info.pipeline == PIPELINE
    assert made.images.shape == (2 * FRAMES, 32, 32, 3) and made.info.fps == 24.0
    frames, waveform, rate = reference(tiny_h3, workflow, 2, inputs)
    assert (made.images - frames).abs().max() <= 1 / 255  # within one 8-bit level
    assert made.audio["sample_rate"] == rate == 32_000
    assert made.audio["waveform"].shape == waveform.shape and waveform.shape[:2] == (2, 2)
    torch.testing.assert_close(made.audio["waveform"], waveform, atol=1e-4, rtol=0)
    notes = " | ".join(made.info.notes)
    assert "negative prompt ignored" in notes and "guidance unused" in notes


def test_only_the_t2va_and_fl2va_transformer_loads(tiny_h3):
    from tpu_diffusers_runtime import pipeline_kinds

    family = family_for(PIPELINE)
    takes = pipeline_kinds.kind_for(family, PIPELINE).takes(PIPELINE)
    assert "transformer" in takes and "transformer_ref" not in takes
    pipe = load_pipeline(PipelineHandle.of(source=tiny_h3, model_class=PIPELINE), device_info("cpu"))
    assert pipe.transformer is not None and getattr(pipe, "transformer_ref", None) is None
    assert {"text_encoder", "vae", "audio_vae", "scheduler", "audio_scheduler"} <= set(pipe.components)


def test_frames_off_its_17n_plus_5_rule_are_refused_before_loading(tmp_path):
    """124..345 as 17n + 5 (diffusers would round 108 up to 124 and refuse 346): refused when the run is planned,
    naming the rule and the nearest counts, with no folder to load; the Video Sampler's queue-time check lets its
    counts through, and the other families' rules are unchanged."""
    from tpu_diffusers_runtime.tasks import prepare

    h3, wan = family_for(PIPELINE), family_for("WanPipeline")
    assert input_checks.video_frame_factor() == 4
    assert input_checks.frames_problem(124) is None and input_checks.frames_problem(345) is None
    assert input_checks.frames_problem(141, h3) is None and input_checks.frames_problem(81, wan) is None
    assert input_checks.frames_problem(125) is None  # 4k + 1: Wan's
    assert "4k + 1" in input_checks.frames_problem(126)
    for frames, nearest in ((121, "124"), (81, "124"), (346, "345"), (130, "124 or 141"), (344, "328 or 345")):
        with pytest.raises(UserInputError, match=rf"frames {frames} cannot be used with MiniMax H3: it must be 17n "
                                                 rf"\+ 5 from 124 to 345 \(5 to 15 s at 24 fps.*: {nearest}\.$"):
            prepare(PIPELINE, request(frames=frames))
    missing = PipelineHandle.of(source=str(tmp_path / "no-such-folder"), model_class=PIPELINE)
    with pytest.raises(UserInputError, match=r"17n \+ 5"):
        Engine(distribute=False).generate(missing, request(frames=121))


@pytest.mark.parametrize("width, height, nearest", [(1920, 1088, "1344x768"), (1024, 1024, "768x768"),
                                                    (4096, 512, "2016x512"), (512, 2048, "512x2016")])
def test_sizes_off_its_canvas_are_refused_before_loading_naming_the_nearest(tmp_path, width, height, nearest):
    """Its blocks pick canvases with a short edge of at most 768, at most 768 x 1344 pixels, 1:4 to 4:1; a size the
    pack passes is held to the same canvas, refused when the run is planned (no folder to load) with the nearest
    canvas of the asked shape."""
    missing = PipelineHandle.of(source=str(tmp_path / "no-such-folder"), model_class=PIPELINE)
    with pytest.raises(UserInputError, match=rf"MiniMax H3 makes canvases with a short edge of at most 768, at most "
                                             rf"1,032,192 pixels and an aspect ratio from 1:4 to 4:1 .*: the nearest "
                                             rf"of this shape is {nearest}\.$"):
        Engine(distribute=False).generate(missing, request(width=width, height=height))


def test_a_reference_video_is_refused(tiny_h3, engine):
    """An IC-LoRA's reference video is LTX-2's in-context video: MiniMax H3 has none (its videos go in as
    references)."""
    video = np.zeros((FRAMES, 32, 32, 3), np.float32)
    with pytest.raises(UserInputError, match="reference_video"):
        engine.generate(PipelineHandle.of(source=tiny_h3, model_class=PIPELINE), request(reference_video=video))


SOUND = np.random.default_rng(2).uniform(-0.5, 0.5, (2, 32_000)).astype(np.float32)  # 1 s of stereo at 32 kHz
CLIP = (np.random.default_rng(3).random((30, 40, 56, 3)) * 255).astype(np.uint8)  # 1 s of video at 30 fps
REFERENCES = (Reference("image", frames=PIXELS[None] / 255.0),
              Reference("video", frames=CLIP / 255.0, fps=30.0, audio=SOUND, sample_rate=32_000),
              Reference("image", frames=LAST[:1] / 255.0),
              Reference("audio", audio=SOUND[:1, :16_000], sample_rate=32_000))


def diffusers_references():
    """REFERENCES as a diffusers user gives them to ref2va, in the same order."""
    from diffusers.modular_pipelines.minimax_h3 import (MiniMaxH3AudioReference, MiniMaxH3ImageReference,
                                                        MiniMaxH3VideoReference)

    return [MiniMaxH3ImageReference(image=Image.fromarray(PIXELS)),
            MiniMaxH3VideoReference(frames=CLIP, fps=30.0, audio=torch.tensor(SOUND), sample_rate=32_000),
            MiniMaxH3ImageReference(image=Image.fromarray(LAST[0])),
            MiniMaxH3AudioReference(audio=torch.tensor(SOUND[:1, :16_000]), sample_rate=32_000)]


def test_reference_to_video_loads_its_partition_in_place_and_equals_ref2va(tiny_h3):
    """Pictures, a 30 fps video with its sound and a sound clip, in order: ref2va's frames and sound as diffusers'
    users get them (its own partition, `transformer_ref`, loaded in place of `transformer`, and the run says so);
    t2va after it loads t2va's partition again, and fl2va after that loads nothing."""
    engine = Engine(distribute=False)
    handle = PipelineHandle.of(source=tiny_h3, model_class=PIPELINE)
    made = engine.generate(handle, request(references=REFERENCES))
    assert made.info.task == "reference2video" and made.info.loaded
    assert "loaded ref2va's own transformer_ref; transformer of t2va/fl2va not loaded" in made.info.notes
    (entry,) = engine.cache._pipelines.values()
    assert getattr(entry.pipe, "transformer", None) is None and entry.pipe.transformer_ref is not None
    frames, waveform, _ = reference(tiny_h3, "ref2va", 2, lambda i: {"references": diffusers_references()})
    assert (made.images - frames).abs().max() <= 1 / 255
    torch.testing.assert_close(made.audio["waveform"], waveform, atol=1e-4, rtol=0)

    assert engine.generate(handle, request(batch_size=1)).info.loaded  # t2va: its partition again
    (entry,) = engine.cache._pipelines.values()
    assert entry.pipe.transformer is not None and getattr(entry.pipe, "transformer_ref", None) is None
    image = (PIXELS[None] / 255.0).astype(np.float32)
    assert not engine.generate(handle, request(batch_size=1, images=(image,))).info.loaded  # fl2va: same


def test_two_context_parallel_ranks_give_the_single_process_video_and_sound(tiny_h3, engine):
    """Context parallelism with diffusers' plan, 2 CPU ranks (gloo): each holds the whole pipeline and runs half of
    the packed sequence (this prompt's 10 text tokens, unpadded, the stereo sound's 2 x 207 rows, 37 x 1 x 2 video
    tokens). At 32x32 this text to video's sequence is 461 rows, which 2 ranks split unevenly (Ulysses Anything):
    gloo's all_gather takes equal parts only, so the ranks refuse it with a message on what to change, and the group
    runs on. A reference run then loads ref2va's transformer_ref in place of transformer on the same warm group (its
    pictures' rows and tokens join the sequence), and CP splits it too. Each equals one process's frames and sound.
    Measured, 64x32's image to video (500 rows) equals one process's too, left out here for time."""
    mesh = MeshSpec(chips=2, context_parallel=2)
    cp_engine = Engine()
    handle = PipelineHandle.of(source=tiny_h3, model_class=PIPELINE, mesh=mesh)

    def equals_one_process(task, references):
        video = request(batch_size=1, width=64, references=references)
        single = engine.generate(PipelineHandle.of(source=tiny_h3, model_class=PIPELINE), video)
        result = cp_engine.generate(handle, video)
        assert result.info.task == task and result.info.context_parallel == 2
        assert (result.images - single.images).abs().max() <= 1 / 255
        torch.testing.assert_close(result.audio["waveform"], single.audio["waveform"], atol=1e-4, rtol=0)
        denoiser = "transformer_ref" if references else "transformer"
        assert f"context parallel (Ulysses): {denoiser} over 2 ranks" in result.info.notes

    try:
        equals_one_process("text2video", ())
        with pytest.raises(UserInputError, match=r"does not split into 2 equal parts, and CPU ranks "
                                                 r"\(torch.distributed's gloo\) gather equal parts only"):
            cp_engine.generate(handle, request(batch_size=1))
        equals_one_process("reference2video", REFERENCES)
    finally:
        cp_engine.unload()


def test_two_tensor_parallel_ranks_give_the_single_process_video_and_sound(tiny_h3, engine):
    """The family's TP plan (diffusers has none), 2 CPU ranks (gloo), text to video: each rank holds a 1/2 slice of
    every attention's value and output projections (per head: the tiny model's 2 heads x 16) and of each SwiGLU FFN
    (per half), in the block and the token refiner; the frames and the sound equal one process's, and each rank holds
    all of the transformer less half of what the plan shards (the tiny Qwen3-VL stays whole: only the transformer is
    asked). A reference run's transformer_ref is sharded by the same plan (the test below checks that it is asked
    for); a reference run (REFERENCES, 2 steps) on 2 TP ranks, measured once, equals one process's frames within
    2.4e-7 and sound within 3.7e-8 with each rank holding half of transformer_ref's planned weights; left out here
    for time (~8 min on a shared 2-core CPU, most of it the single-process reference run)."""
    from diffusers.hooks.tensor_parallel import resolve_tp_shard_specs

    from tpu_diffusers_runtime.distributed.sharding import local_bytes
    from tpu_diffusers_runtime.families import minimax_h3

    handle = PipelineHandle.of(source=tiny_h3, model_class=PIPELINE)
    video = request(batch_size=1, steps=2)
    single = engine.generate(handle, video)
    transformer = engine.realise(handle)[0].pipe.transformer
    params = dict(transformer.named_parameters())
    specs = resolve_tp_shard_specs(transformer, minimax_h3.tensor_parallel_plan(transformer.config), 2)
    planned = sum(params[name].numel() * params[name].element_size() for name, spec in specs.items()
                  if spec.dim is not None)
    tp_engine = Engine()
    try:
        result = tp_engine.generate(PipelineHandle.of(source=tiny_h3, model_class=PIPELINE,
                                                      mesh=MeshSpec(chips=2, shard_text_encoder=False)), video)
    finally:
        tp_engine.unload()
    assert result.info.task == "text2video" and result.info.mesh_shape == (1, 1, 2)
    assert (result.images - single.images).abs().max() <= 1 / 255
    torch.testing.assert_close(result.audio["waveform"], single.audio["waveform"], atol=1e-4, rtol=0)
    assert result.info.sharded_fraction_per_rank == (0.5, 0.5)
    assert result.info.transformer_bytes_per_rank == (local_bytes(transformer) - planned // 2,) * 2


def test_a_tp_mesh_is_checked_and_each_partition_loads_sharded_with_the_family_plan(tiny_h3, tmp_path):
    """Before a TP launch the mesh passes (H3 has the family's plan; tp 2 divides the tiny model's 2 heads of 16
    channels; its Qwen3-VL's one key/value head does not: it stays whole), a head width tp does not divide is refused
    (the plan splits each head's value channels), and a context-parallel x tensor-parallel replica is refused; on a TP
    rank both partitions' transformers, t2va/fl2va's `transformer` and ref2va's `transformer_ref`, load with a
    TensorParallelConfig over the replica's mesh, and the class's `_tp_plan` is the family's for that config."""
    import json
    from diffusers import MiniMaxH3Transformer3DModel

    from tpu_diffusers_runtime.distributed.mesh import check_mesh, mesh_shape, shardable_families
    from tpu_diffusers_runtime.distributed.sharding import Sharding
    from tpu_diffusers_runtime.families import minimax_h3
    from tpu_diffusers_runtime.model_folder import component_config

    assert "MiniMax H3" in shardable_families()
    assert check_mesh(MeshSpec(chips=2, shard_text_encoder=False), tiny_h3, device_info("cpu"))[0] == \
        "mesh: 1 replica(s) x 2-way tensor parallel over 2 ranks"
    odd = tmp_path / "odd-heads"
    shutil.copytree(tiny_h3, odd)
    config_path = odd / "transformer_ref" / "config.json"
    config_path.write_text(json.dumps({**json.loads(config_path.read_text()), "attention_head_dim": 15}))
    with pytest.raises(UserInputError, match=r"tp 2 \(chips / replicas\) does not divide the transformer's 15-channel "
                                             r"heads \(attention_head_dim\): .* one of \[1\]"):
        check_mesh(MeshSpec(chips=2, shard_text_encoder=False), str(odd), device_info("cpu"))
    with pytest.raises(UserInputError, match="context parallel or tensor parallel, not both"):
        mesh_shape(MeshSpec(chips=4, context_parallel=2, replicas=1), 4)

    class TwoRanks:  # what Sharding reads of the replica's tp mesh before a load
        def size(self):
            return 2

    mesh = TwoRanks()
    sharding = Sharding(MeshSpec(chips=2, shard_text_encoder=False), mesh, minimax_h3.FAMILY)
    for name in ("transformer", "transformer_ref"):
        assert sharding.load_kwargs(tiny_h3, name)["parallel_config"].mesh is mesh
        plan = minimax_h3.tensor_parallel_plan(component_config(tiny_h3, name))
        assert {key: type(style) for key, style in MiniMaxH3Transformer3DModel._tp_plan.items()} == \
            {key: type(style) for key, style in plan.items()}
    assert sharding.sharded == {"transformer", "transformer_ref"} and sharding.load_kwargs(tiny_h3, "vae") == {}


@pytest.mark.parametrize("references, message", [
    ((Reference("audio", audio=SOUND, sample_rate=32_000),), "only beside a picture or a video"),
    ((Reference("image", frames=PIXELS[None] / 255.0),) * 10, "at most 9 image references; 10 are connected"),
    ((Reference("video", frames=CLIP / 255.0, fps=0.0),), "frame rate 0.0"),
    ((Reference("video", frames=CLIP[:15] / 255.0, fps=30.0),),
     r"15 frames at 30 fps is too short: MiniMax H3 reads at least 13 frames at 24 fps \(0.54 s\)"),
    ((Reference("image", frames=PIXELS / 255.0),), r"frames of shape \[40, 64, 3\]"),
])
def test_references_it_cannot_read_are_refused_before_loading(tmp_path, references, message):
    missing = PipelineHandle.of(source=str(tmp_path / "no-such-folder"), model_class=PIPELINE)
    with pytest.raises(UserInputError, match=message):
        Engine(distribute=False).generate(missing, request(references=references))


def test_references_travel_to_workers_as_payloads():
    data, payloads = request(references=REFERENCES, images=()).to_wire()
    back = SampleRequest.from_wire(data, [bytes(p) for p in payloads])
    assert [r.kind for r in back.references] == ["image", "video", "image", "audio"]
    for sent, got in zip(REFERENCES, back.references):
        assert sent.fps == got.fps and sent.sample_rate == got.sample_rate
        for name in ("frames", "audio"):
            assert (getattr(sent, name) is None) == (getattr(got, name) is None)
            if getattr(sent, name) is not None:
                np.testing.assert_array_equal(getattr(sent, name), getattr(got, name))


@pytest.fixture(scope="module")
def h3_files(tiny_h3, tmp_path_factory):
    """{precision: (a configs folder named as auto finds it, holding exactly what that file loads as, the file)}, and
    the pruned file."""
    import tiny_single_files as tsf

    root = tmp_path_factory.mktemp("h3_files")
    files = tsf.minimax_h3_files(tiny_h3, root / "files")
    folders = {}
    for precision, values in (("bf16", tsf.bf16_valued_transformer),
                              ("int8_convrot", lambda f: tsf.transformer_holding(f, tsf.minimax_h3_int8_values))):
        folders[precision] = Path(shutil.copytree(tiny_h3, root / precision / "MiniMax-H3"))
        values(folders[precision])
    return {"bf16": (folders["bf16"], files["transformer"]),
            "int8_convrot": (folders["int8_convrot"], files["transformer_int8_convrot"]),
            "pruned": files["transformer_pruned"]}


@pytest.mark.parametrize("precision", ["bf16", "int8_convrot"])
def test_its_diffusion_model_file_gives_the_folders_video_and_sound(h3_files, engine, precision):
    """Comfy-Org's unpruned fl2va file (bf16 unprefixed; int8 ConvRot under model.diffusion_model.) converted by
    diffusers' own converter, the rest from the configs folder auto finds: the folder's video and sound."""
    from tpu_diffusers_runtime.file_choice import plan

    folder, path = h3_files[precision]
    source, model_class, files = plan(str(path), {}, "auto", [str(folder.parent)])
    assert (source, model_class, files) == (str(folder), PIPELINE, (("transformer", str(path)),))
    made = engine.generate(PipelineHandle.of(source=source, model_class=model_class, files=files),
                           request(batch_size=1))
    frames, waveform, _ = reference(str(folder), "t2va", 1)
    assert (made.images - frames).abs().max() <= 1 / 255
    torch.testing.assert_close(made.audio["waveform"], waveform, atol=1e-4, rtol=0)


def test_the_templates_pruned_file_gives_the_video_and_sound_of_the_file_it_was_pruned_from(h3_files, engine):
    """ComfyUI's curve form (the templates' minimax_h3_fl2va_pruned_int8_convrot): its time embedder is a table of the
    time embedding's curve, its AdaLN projections take the curve's coordinates, without SiLU. Pruned at the full rank
    from the unpruned int8 file (its blocks' int8 layers as they are), it gives that file's video and sound up to the
    table's interpolation (measured 2e-7); both are diffusers' modular pipeline's."""
    from tpu_diffusers_runtime.file_choice import plan

    folder, unpruned = h3_files["int8_convrot"]
    made = {}
    for name, path in (("pruned", h3_files["pruned"]), ("unpruned", unpruned)):
        source, model_class, files = plan(str(path), {}, "auto", [str(folder.parent)])
        assert (source, files) == (str(folder), (("transformer", str(path)),))
        made[name] = engine.generate(PipelineHandle.of(source=source, model_class=model_class, files=files),
                                     request(batch_size=1))
        if name == "pruned":
            transformer = next(iter(engine.cache._pipelines.values())).pipe.transformer
            assert tuple(transformer.time_embedder.table.shape) == (1025, 16)
            assert transformer.transformer_blocks[0].adaln_proj.linear.weight.dtype == torch.float32
    assert (made["pruned"].images - made["unpruned"].images).abs().max() <= 1e-5
    torch.testing.assert_close(made["pruned"].audio["waveform"], made["unpruned"].audio["waveform"], atol=1e-6, rtol=0)
    frames, waveform, _ = reference(str(folder), "t2va", 1)
    assert (made["pruned"].images - frames).abs().max() <= 1 / 255
    torch.testing.assert_close(made["pruned"].audio["waveform"], waveform, atol=1e-4, rtol=0)


def test_ref2va_files_and_configs_without_weights_are_refused_when_queued(h3_files, tmp_path):
    """A ref2va file has fl2va's keys but is another model; the text encoder comes only from a folder with its
    weights, the VAEs from one or from their files (tests/test_minimax_h3_vae_files.py)."""
    from tpu_diffusers_runtime.file_choice import plan

    folder, path = h3_files["bf16"]
    ref2va = tmp_path / "minimax_h3_ref2va_bf16.safetensors"
    ref2va.symlink_to(path)
    with pytest.raises(UserInputError, match=r"is named 'ref2va': reference to video's own transformer is not read "
                                             r"from a file yet \(a reference run loads transformer_ref from the configs "
                                             r"folder's weights\)"):
        plan(str(ref2va), {}, "auto", [str(folder.parent)])
    with pytest.raises(UserInputError, match=r"MiniMax H3 from single files also needs text_encoder "
                                             r"\(qwen3vl_32b_minimax_h3_nvfp4_awq.safetensors\), vae "
                                             r"\(minimax_h3_video_vae_int8_convrot.safetensors\), audio_vae"):
        plan(str(path), {}, "auto", [])  # auto's hub id gives configs only
    with pytest.raises(UserInputError, match=r"'minimax_h3_fl2va_bf16.safetensors' is a MiniMax H3 diffusion model, "
                                             r"but text_encoder of MiniMax H3 needs a Qwen3-VL text encoder"):
        plan(str(path), {"text_encoder": str(path)}, "auto", [])
    with pytest.raises(UserInputError, match=r"is a MiniMax H3 diffusion model, but vae of MiniMax H3 needs a MiniMax "
                                             r"H3 video VAE"):
        plan(str(path), {"vae": str(path)}, "auto", [str(folder.parent)])


def test_the_int8_convrot_file_holds_the_folders_weights_and_keeps_its_layers_quantized(h3_files):
    """diffusers' converter splits the stacked q/k/v and swaps fc1's halves: the model holds exactly the folder's
    weights. Kept quantized, q/k/v are row blocks of the file's layer and stay int8; fc1's swapped halves are a new
    tensor, left dequantized (the run info counts them). The pruned file keeps the same layers quantized, but its
    AdaLN projections (float32 there)."""
    from diffusers import MiniMaxH3Transformer3DModel

    from tpu_diffusers_runtime.resident_weights import ResidentLinear
    from tpu_diffusers_runtime.specs import QuantizedWeights

    folder, path = h3_files["int8_convrot"]
    want = MiniMaxH3Transformer3DModel.from_pretrained(folder / "transformer").state_dict()
    pipes, notes = {}, []
    for choice in (QuantizedWeights.DEQUANTIZE, QuantizedWeights.KEEP_QUANTIZED):
        pipes[choice] = load_pipeline(PipelineHandle.of(source=str(folder), model_class=PIPELINE,
                                                        files=(("transformer", str(path)),), quantized_weights=choice),
                                      device_info("cpu"), notes=notes)
    got = pipes[QuantizedWeights.DEQUANTIZE].transformer.state_dict()
    assert sorted(got) == sorted(want) and all(torch.equal(got[k], want[k]) for k in want)
    resident = {name for name, module in pipes[QuantizedWeights.KEEP_QUANTIZED].transformer.named_modules()
                if isinstance(module, ResidentLinear)}
    assert {f"transformer_blocks.0.attn.to_{p}" for p in "qkv"} <= resident
    assert "transformer_blocks.0.ff.net.0.proj" not in resident
    assert any("2 quantized layers of the file left dequantized" in note for note in notes)
    pruned = load_pipeline(PipelineHandle.of(source=str(folder), model_class=PIPELINE, files=(
        ("transformer", str(h3_files["pruned"])),), quantized_weights=QuantizedWeights.KEEP_QUANTIZED),
        device_info("cpu"), notes=notes).transformer  # the same int8 layers, but for its float32 AdaLN and curve
    assert {name for name, module in pruned.named_modules() if isinstance(module, ResidentLinear)} == {
        name for name in resident if not name.startswith(("time_embedder.", "norm_out.")) and "adaln" not in name}


def test_a_reference_run_compiles_its_own_transformers_blocks_under_offload_and_matches_eager(tiny_h3):
    """Compiled mode on ref2va's partition: `transformer_ref` (Family.partition_denoisers) is compiled as the first
    partition's transformer would be (its repeated blocks under model CPU offload); frames and sound equal eager."""
    from tpu_diffusers_runtime.specs import CompileSpec, ExecutionMode, Placement

    video = request(references=REFERENCES[:2], batch_size=1)
    handle = PipelineHandle.of(source=tiny_h3, model_class=PIPELINE, mode=ExecutionMode.COMPILED,
                               placement=Placement.MODEL_CPU_OFFLOAD, compile=CompileSpec())
    engine = Engine(distribute=False)
    made = engine.generate(handle, video)
    (entry,) = engine.cache._pipelines.values()
    assert entry.states["compilation"].scope == "repeated_blocks" and made.info.compiled_now
    model = entry.pipe.transformer_ref
    blocks = [module for module in model.modules() if type(module).__name__ in model._repeated_blocks]
    assert blocks and all(block._compiled_call_impl is not None for block in blocks)
    eager = Engine(distribute=False).generate(PipelineHandle.of(source=tiny_h3, model_class=PIPELINE), video)
    torch.testing.assert_close(made.images, eager.images, atol=2e-3, rtol=0)  # inductor reorders float32 sums
    torch.testing.assert_close(made.audio["waveform"], eager.audio["waveform"], atol=1e-4, rtol=0)
