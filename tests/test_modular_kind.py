"""The modular pipeline kind: FLUX.1 and Z-Image run through diffusers' modular blocks (TPU_DIFFUSERS_PIPELINE_KIND=
modular) give the classic pipelines' images for the same seed and report the same steps; Cancel raised from the
progress callback ends a modular run; under model CPU offload a modular run (and a task switch) gives the image placed
on the device gives, its models hooked one at a time and back on the host after the run; what the modular kind does
not do yet is refused by name.

FLUX.1 and Qwen-Image give equal images bit for bit for one image per call (the blocks run the same modules with the
same operations, CPU float32). Where the blocks batch or order float operations otherwise, sums round differently,
by up to ~2e-6, so those are compared within 1e-5: two images in one call (the blocks batch the prompt's embeddings
with other ops), and CFG through the blocks' guider (Z-Image, SDXL: the conditional and unconditional predictions as
two denoiser calls, where the classic pipelines make one call of both). A real difference (a wrong guidance, seed,
strength or schedule) moves pixels by far more: Qwen-Image's image-to-image blocks, left unwired, differ by 0.2."""

import dataclasses

import numpy as np
import pytest
import tiny_loras
import torch

from tpu_diffusers_runtime.engine import Engine
from tpu_diffusers_runtime.errors import UserInputError
from tpu_diffusers_runtime.preview import PreviewSpec
from tpu_diffusers_runtime.handle import PipelineHandle
from tpu_diffusers_runtime.loading import inspect_source
from tpu_diffusers_runtime.specs import CompileSpec, ExecutionMode, LoraSpec, Placement
from tpu_diffusers_runtime.tasks import SampleRequest

PROMPT = "a cat sitting on a red chair"
IMAGE = (np.random.default_rng(0).random((1, 64, 64, 3))).astype(np.float32)  # ComfyUI's IMAGE


PREVIEW = PreviewSpec(factors=tuple((0.1, 0.0, -0.1) for _ in range(16)))  # 16 latent channels (SDXL's 4: none)


class Cancelled(Exception):
    pass


def run(tiny, name: str, kind: str, monkeypatch, request: SampleRequest, placement=Placement.DEVICE,
        cancel_at: int = 0, loras: tuple = ()):
    """(images, steps reported with their previews, the loaded pipeline) of `request` on a fresh engine, with the
    pipeline kind `kind`."""
    monkeypatch.setenv("TPU_DIFFUSERS_PIPELINE_KIND", kind)
    folder = tiny(name)
    handle = PipelineHandle.of(source=folder, model_class=inspect_source(folder), placement=placement, loras=loras)
    engine = Engine(distribute=False)
    steps = []

    def on_progress(done, total, what, *preview):
        if what == "sampling":
            steps.append((done, total, *preview))
            if done == cancel_at:
                raise Cancelled  # as ComfyUI's Cancel does, from the progress callback

    images = engine.generate(handle, request, on_progress, PREVIEW).images
    return images, steps, engine.realise(handle)[0].pipe


@pytest.mark.parametrize("name, request_, tolerance", [
    ("flux1-schnell", SampleRequest(prompt=PROMPT, width=64, height=64, steps=3, seed=7, batch_size=2), 1e-5),
    ("flux1-schnell", SampleRequest(prompt=PROMPT, width=64, height=64, steps=4, seed=7, images=(IMAGE,),
                                    denoise=0.6), 0),
    ("zimage", SampleRequest(prompt=PROMPT, width=64, height=64, steps=3, seed=7, batch_size=2), 1e-5),
    ("zimage", SampleRequest(prompt=PROMPT, negative_prompt="blurry", width=64, height=64, steps=3, guidance=2.0,
                             seed=7), 1e-5),
    ("zimage", SampleRequest(prompt=PROMPT, width=64, height=64, steps=4, seed=7, images=(IMAGE,), denoise=0.6), 1e-5),
    ("sdxl", SampleRequest(prompt=PROMPT, negative_prompt="blurry", width=64, height=64, steps=3, guidance=2.5,
                           seed=7), 1e-5),
    ("sdxl", SampleRequest(prompt=PROMPT, width=64, height=64, steps=4, guidance=2.5, seed=7, images=(IMAGE,),
                           denoise=0.6), 1e-5),
    ("qwenimage", SampleRequest(prompt=PROMPT, negative_prompt="blurry", width=64, height=64, steps=3, guidance=2.5,
                                seed=7), 0),
], ids=["flux1-text2image", "flux1-image2image", "zimage-text2image", "zimage-cfg", "zimage-image2image",
        "sdxl-cfg", "sdxl-image2image", "qwenimage-cfg"])
def test_a_modular_run_equals_the_classic_run_and_reports_the_same_steps(tiny, monkeypatch, name, request_, tolerance):
    from diffusers.modular_pipelines import ModularPipeline

    classic, classic_steps, classic_pipe = run(tiny, name, "classic", monkeypatch, request_)
    modular, modular_steps, modular_pipe = run(tiny, name, "modular", monkeypatch, request_)
    assert not isinstance(classic_pipe, ModularPipeline) and isinstance(modular_pipe, ModularPipeline)
    torch.testing.assert_close(modular, classic, atol=tolerance, rtol=0)
    assert [step[:2] for step in modular_steps] == [step[:2] for step in classic_steps]
    assert modular_steps[-1][0] == modular_steps[-1][1]
    previews = [(modular[2], classic[2]) for modular, classic in zip(modular_steps, classic_steps)]
    assert all((modular is None) == (classic is None) == (name == "sdxl") for modular, classic in previews)
    assert all(np.abs(modular.astype(int) - classic.astype(int)).max() <= 1  # each step's preview, in 8-bit pixels
               for modular, classic in previews if modular is not None)


def test_a_lora_fused_into_a_modular_pipeline_gives_the_classic_image(tiny, tiny_dir, monkeypatch, tmp_path):
    lora = (LoraSpec(str(tiny_loras.build(tiny_dir / "tiny-flux1-schnell", tmp_path / "flux1.safetensors", seed=1))),)
    request = SampleRequest(prompt=PROMPT, width=64, height=64, steps=2, seed=3)
    base = run(tiny, "flux1-schnell", "modular", monkeypatch, request)[0]
    modular = run(tiny, "flux1-schnell", "modular", monkeypatch, request, loras=lora)[0]
    classic = run(tiny, "flux1-schnell", "classic", monkeypatch, request, loras=lora)[0]
    assert torch.equal(modular, classic) and (modular - base).abs().max() > 1e-3


def test_a_compiled_modular_run_equals_the_compiled_classic_run(tiny, monkeypatch):
    """Compile acts on the same denoiser module in both kinds (dynamo's caches are reset between the two runs)."""
    request = SampleRequest(prompt=PROMPT, width=64, height=64, steps=2, seed=7)
    images = {}
    for kind in ("classic", "modular"):
        torch.compiler.reset()
        monkeypatch.setenv("TPU_DIFFUSERS_PIPELINE_KIND", kind)
        folder = tiny("flux1-schnell")
        handle = PipelineHandle.of(source=folder, model_class="FluxPipeline", mode=ExecutionMode.COMPILED,
                                   compile=CompileSpec())
        generation = Engine(distribute=False).generate(handle, request)
        assert generation.info.compiled_now and generation.info.pipeline == {
            "classic": "FluxPipeline", "modular": "FluxModularPipeline"}[kind]
        images[kind] = generation.images
    assert torch.equal(images["modular"], images["classic"])


def test_a_family_with_only_modular_blocks_always_runs_modular(monkeypatch):
    from tpu_diffusers_runtime.families import TEXT2IMAGE, TaskPipeline, family_for
    from tpu_diffusers_runtime.pipeline_kinds import CLASSIC, MODULAR, kind_for

    flux = family_for("FluxPipeline")
    modular_only = dataclasses.replace(flux, model_classes={"FluxPipeline": {TEXT2IMAGE: TaskPipeline("")}})
    for setting in ("classic", "modular"):
        monkeypatch.setenv("TPU_DIFFUSERS_PIPELINE_KIND", setting)
        assert kind_for(modular_only, "FluxPipeline").name == MODULAR
        assert kind_for(flux, "FluxPipeline").name == setting
        assert kind_for(family_for("StableDiffusion3Pipeline"), "StableDiffusion3Pipeline").name == CLASSIC  # no blocks


def test_cancel_from_the_progress_callback_ends_a_modular_run(tiny, monkeypatch):
    request = SampleRequest(prompt=PROMPT, width=64, height=64, steps=4, seed=1)
    with pytest.raises(Cancelled):
        run(tiny, "flux1-schnell", "modular", monkeypatch, request, cancel_at=2)


def test_what_the_modular_kind_does_not_do_yet_is_refused_by_name(tiny, monkeypatch):
    inpaint = SampleRequest(prompt=PROMPT, width=64, height=64, steps=2, images=(IMAGE,),
                            mask=np.ones((1, 64, 64), np.float32))
    with pytest.raises(UserInputError, match="has no workflow for inpaint; it runs text2image, image2image"):
        run(tiny, "flux1-schnell", "modular", monkeypatch, inpaint)


def assert_offloaded(pipe, chain: list[str]):
    """Every model of `pipe` hooked by accelerate's CpuOffload for the run's device (here the CPU, as the classic
    offload's tests run it), chained in `chain`'s order (each one sends the one before it back to the host when it
    runs), the pipeline's execution device the hooks' device, and every weight on the host after the run."""
    from accelerate.hooks import CpuOffload

    models = {name: module for name, module in pipe.components.items() if isinstance(module, torch.nn.Module)}
    hooks = {name: getattr(module, "_hf_hook", None) for name, module in models.items()}
    assert all(isinstance(hook, CpuOffload) and hook.execution_device == torch.device("cpu")
               for hook in hooks.values()), hooks
    assert [getattr(hooks[name].prev_module_hook, "model", None) for name in chain] == [
        None, *(models[name] for name in chain[:-1])]
    assert pipe._execution_device.type == "cpu"
    assert {p.device.type for module in models.values() for p in module.parameters()} == {"cpu"}


@pytest.mark.parametrize("name, request_, chain", [
    ("flux1-schnell", SampleRequest(prompt=PROMPT, width=64, height=64, steps=3, seed=7),
     ["text_encoder", "text_encoder_2", "transformer", "vae"]),
    ("flux1-schnell", SampleRequest(prompt=PROMPT, width=64, height=64, steps=4, seed=7, images=(IMAGE,),
                                    denoise=0.6), ["text_encoder", "text_encoder_2", "transformer", "vae"]),
    ("qwenimage21-turbo", SampleRequest(prompt=PROMPT, width=96, height=64, steps=3, seed=7, images=(IMAGE,)),
     ["text_encoder", "transformer", "vae"]),
], ids=["flux1-text2image", "flux1-image2image", "qwenimage21-turbo-edit"])
def test_model_cpu_offload_of_a_modular_pipeline_gives_the_image_placed_on_the_device(tiny, monkeypatch, name,
                                                                                     request_, chain):
    """diffusers' modular pipelines have no enable_model_cpu_offload: their models are hooked as that method hooks a
    classic pipeline's, in the order the blocks use them last, and all go back to the host after the run."""
    placed = run(tiny, name, "modular", monkeypatch, request_)[0]
    offloaded, _, pipe = run(tiny, name, "modular", monkeypatch, request_, placement=Placement.MODEL_CPU_OFFLOAD)
    assert torch.equal(offloaded, placed)
    assert_offloaded(pipe, chain)


@pytest.mark.parametrize("edit", [False, True], ids=["text2image", "edit"])
def test_qwen_image_21_turbo_runs_diffusers_turbo_blocks_as_a_diffusers_user_sets_them_up(tiny, monkeypatch, edit):
    """Qwen-Image 2.1 Turbo (its model_index.json's `sample_sigmas`) runs diffusers' QwenImage21TurboAutoBlocks:
    the image of those blocks set up from the folder as diffusers documents (`init_pipeline`, `load_components`),
    text to image and edit (the workflow `image_conditioned`), for the same seed. Its fixed grid (3 sigmas) sets the
    steps whatever is asked; the guidance and negative prompt are not passed (the blocks take none), and the classic
    pipeline, which reads the same setting, gives the same images."""
    from diffusers import QwenImage21TurboAutoBlocks
    from PIL import Image

    reference = Image.fromarray((IMAGE[0] * 255).round().astype(np.uint8))  # as the Sampler's IMAGE becomes PIL
    request = SampleRequest(prompt=PROMPT, negative_prompt="blurry", width=96, height=64, steps=5, guidance=3.0,
                            seed=7, images=(IMAGE,) if edit else ())
    modular, steps, pipe = run(tiny, "qwenimage21-turbo", "modular", monkeypatch, request)
    assert type(pipe).__name__ == "QwenImage21TurboModularPipeline"
    assert [step[:2] for step in steps] == [(1, 3), (2, 3), (3, 3)]
    user = QwenImage21TurboAutoBlocks().init_pipeline(tiny("qwenimage21-turbo"))
    user.load_components(torch_dtype=torch.float32)
    expected = user(prompt=PROMPT, width=96, height=64, generator=torch.Generator("cpu").manual_seed(7),
                    output_type="pt", **({"image": [reference]} if edit else {})).images
    assert torch.equal(modular, expected[:, :3].permute(0, 2, 3, 1))
    assert torch.equal(run(tiny, "qwenimage21-turbo", "classic", monkeypatch, request)[0], modular)


def test_qwen_image_21_turbo_is_told_by_its_sample_sigmas_and_its_files_by_their_name(monkeypatch):
    """The setting, not a class, makes a Qwen-Image 2.1 model Turbo (as diffusers' modular loader picks the Turbo
    blocks for such a folder); ComfyUI's Turbo files (qwen_image_2.1_turbo_bf16) take the Turbo repo's configs."""
    from tpu_diffusers_runtime.families import family_for
    from tpu_diffusers_runtime.pipeline_kinds import CLASSIC, MODULAR, kind_for

    base, turbo = (family_for("QwenImage21Pipeline", settings=settings)
                   for settings in ({}, {"sample_sigmas": [1.0, 0.9, 0.6]}))
    assert (base.default_steps, base.takes_negative_prompt, dict(base.modular)) == (40, True, {})
    assert (turbo.default_steps, turbo.takes_negative_prompt) == (8, False)
    assert turbo.modular["QwenImage21Pipeline"].blocks == "QwenImage21TurboAutoBlocks"
    for setting, kind in (("classic", CLASSIC), ("modular", MODULAR)):
        monkeypatch.setenv("TPU_DIFFUSERS_PIPELINE_KIND", setting)
        assert (kind_for(turbo, "QwenImage21Pipeline").name, kind_for(base, "QwenImage21Pipeline").name) == (
            kind, CLASSIC)
    variant = base.variant_of_file("qwen_image_2.1_turbo_bf16.safetensors", "qwen-image-2.1")
    assert variant.config_repo == "Qwen/Qwen-Image-2.1-Turbo" and family_for(
        "QwenImage21Pipeline", settings=variant.settings).default_steps == 8
    assert base.variant_of_file("qwen_image_2.1_int8_convrot.safetensors", "qwen-image-2.1") is None


def test_a_task_switch_on_an_offloaded_modular_pipeline_runs_under_the_same_hooks(tiny, monkeypatch):
    """Text to image, edit, text to image on one offloaded modular pipeline: each task's pipeline is made of the loaded
    one's modules (nothing loads), so it runs under the same hooks and gives the image placed on the device gives."""
    monkeypatch.setenv("TPU_DIFFUSERS_PIPELINE_KIND", "modular")
    folder = tiny("qwenimage21-turbo")
    requests = [SampleRequest(prompt=PROMPT, width=96, height=64, steps=3, seed=7, **inputs)
                for inputs in (dict(), dict(images=(IMAGE,)), dict())]
    runs = {}
    for placement in (Placement.DEVICE, Placement.MODEL_CPU_OFFLOAD):
        engine = Engine(distribute=False)
        handle = PipelineHandle.of(source=folder, model_class=inspect_source(folder), placement=placement)
        runs[placement] = [engine.generate(handle, request) for request in requests]
        assert engine.cache.stats.loads == 1
    assert [(run.info.task, run.info.loaded) for run in runs[Placement.MODEL_CPU_OFFLOAD]] == [
        ("text2image", True), ("edit", False), ("text2image", False)]
    assert all(torch.equal(offloaded.images, placed.images)
               for offloaded, placed in zip(runs[Placement.MODEL_CPU_OFFLOAD], runs[Placement.DEVICE]))
    entry = engine.realise(handle)[0]
    assert len(entry.task_pipes) == 2
    for pipe in (entry.pipe, *entry.task_pipes.values()):
        assert_offloaded(pipe, ["text_encoder", "transformer", "vae"])
