"""LoRAs on MiniMax H3 (runtime/features/lora.py), as its ComfyUI templates use them (LoraLoaderModelOnly on the
diffusion model): a tiny LoRA in diffusers' layout and one in ComfyUI's (MiniMax's own module names under
`diffusion_model.`, fused qkv, fc1 as [gate; value]; tools/tiny_loras.py) on a tiny H3 give the frames and stereo sound
of diffusers' modular pipeline with the same LoRA loaded by `load_lora_weights` and fused; a reference run fuses it into
the ref2va partition it loads (`transformer_ref`), where diffusers routes it too. The runs and the modular pipeline are
those of tests/test_minimax_h3.py."""

import json
from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image

import tiny_loras
from test_minimax_h3 import PIPELINE, PIXELS, TASKS, reference, request, tiny_h3  # noqa: F401 (tiny_h3: a fixture)
from tpu_diffusers_runtime.engine import Engine
from tpu_diffusers_runtime.errors import UserInputError
from tpu_diffusers_runtime.features.lora import check_lora_fits
from tpu_diffusers_runtime.handle import PipelineHandle
from tpu_diffusers_runtime.references import Reference
from tpu_diffusers_runtime.specs import LoraSpec

CHANGED = 1e-3  # a LoRA that changes the video changes some pixel by more than this


@pytest.fixture(scope="module")
def loras(tiny_h3, tmp_path_factory):
    root = tmp_path_factory.mktemp("loras")
    return {fmt: str(tiny_loras.build(tiny_h3, root / f"h3-{fmt}.safetensors", fmt, seed=seed))
            for seed, fmt in enumerate(("diffusers", "comfyui"), start=1)}


@pytest.fixture
def fused_in_diffusers(monkeypatch):
    """`reference` (the modular pipeline as diffusers' users run it) with a LoRA loaded into it after its components,
    as a diffusers user does: load_lora_weights, set_adapters at the strength, fuse_lora, unload_lora_weights."""
    from diffusers import ModularPipeline

    load_components = ModularPipeline.load_components

    def with_lora(path, strength):
        def load_then_fuse(pipe, *args, **kwargs):
            load_components(pipe, *args, **kwargs)
            pipe.load_lora_weights(path, adapter_name="lora")
            pipe.set_adapters(["lora"], [strength])
            loaded = [name for name in pipe._lora_loadable_modules if getattr(pipe, name, None) is not None]
            pipe.fuse_lora(components=loaded, adapter_names=["lora"])
            pipe.unload_lora_weights()

        monkeypatch.setattr(ModularPipeline, "load_components", load_then_fuse)

    return with_lora


def handle(folder, *loras):
    return PipelineHandle.of(source=folder, model_class=PIPELINE, loras=tuple(LoraSpec(*lora) for lora in loras))


@pytest.mark.parametrize("task, fmt, strength", [("text2video", "diffusers", 1.0), ("firstlast2video", "comfyui", 0.8)])
def test_its_loras_give_the_modular_pipelines_video_and_sound_and_the_base_back(tiny_h3, loras, fused_in_diffusers,
                                                                               task, fmt, strength):
    workflow, images, inputs = TASKS[task]
    video = request(batch_size=1, images=tuple(image[:1].astype(np.float32) / 255.0 for image in images))
    engine = Engine(distribute=False)
    base = engine.generate(handle(tiny_h3), video)
    made = engine.generate(handle(tiny_h3, (loras[fmt], strength)), video)
    layers = 8 if fmt == "diffusers" else 21  # q, k, v, out of the block and the refiner block; every linear
    assert made.info.notes[-1] == f"LoRA: h3-{fmt}.safetensors @ {strength:g} (fused, {layers} layers)"
    fused_in_diffusers(loras[fmt], strength)
    frames, waveform, _ = reference(tiny_h3, workflow, 1, inputs)
    assert (made.images - frames).abs().max() <= 1 / 255
    torch.testing.assert_close(made.audio["waveform"], waveform, atol=1e-4, rtol=0)
    assert (made.images - base.images).abs().max() > CHANGED
    again = engine.generate(handle(tiny_h3), video)
    assert torch.equal(again.images, base.images) and torch.equal(again.audio["waveform"], base.audio["waveform"])
    assert engine.cache.stats.loads == 1


def test_a_reference_run_fuses_it_into_transformer_ref_as_diffusers_routes_it(tiny_h3, loras, fused_in_diffusers):
    """ref2va loads `transformer_ref` in place of `transformer`: the LoRA's `transformer.` layers go there (the run
    says so), as diffusers' loader sends them to a pipeline holding transformer_ref alone."""
    engine = Engine(distribute=False)
    video = request(batch_size=1, references=(Reference("image", frames=PIXELS[None] / 255.0),))
    made = engine.generate(handle(tiny_h3, (loras["diffusers"], 1.0)), video)
    assert made.info.notes[-1] == "LoRA: h3-diffusers.safetensors @ 1 (fused, 8 layers, into transformer_ref)"
    (entry,) = engine.cache._pipelines.values()
    assert {key.split(".")[0] for key in entry.states["lora"].backups} == {"transformer_ref"}
    from diffusers.modular_pipelines.minimax_h3 import MiniMaxH3ImageReference

    fused_in_diffusers(loras["diffusers"], 1.0)
    frames, waveform, _ = reference(tiny_h3, "ref2va", 1,
                                    lambda i: {"references": [MiniMaxH3ImageReference(image=Image.fromarray(PIXELS))]})
    assert (made.images - frames).abs().max() <= 1 / 255
    torch.testing.assert_close(made.audio["waveform"], waveform, atol=1e-4, rtol=0)


def test_the_comfyui_layout_changes_the_weights_as_comfyui_merges_it(tiny_h3, loras):
    """ComfyUI adds strength x lora_B @ lora_A to its own (MiniMax's) weights; those weights through diffusers'
    single-file converter (the File Loader's, which splits qkv and swaps fc1's halves) are the pack's fused
    transformer: diffusers' LoRA converter maps the layout faithfully, fc1's swap and the fused qkv included."""
    from diffusers.loaders.single_file_utils import convert_minimax_h3_transformer_checkpoint_to_diffusers
    from safetensors.torch import load_file
    from tiny_single_files import folder_weights, minimax_h3_to_original

    strength = 0.8
    merged = minimax_h3_to_original(folder_weights(tiny_h3, "transformer"))
    lora = load_file(loras["comfyui"])
    for key in (k for k in lora if k.endswith(".lora_A.weight")):
        name = key.removeprefix("diffusion_model.").removesuffix(".lora_A.weight") + ".weight"
        merged[name] = merged[name] + strength * lora[key.replace(".lora_A.", ".lora_B.")] @ lora[key]
    config = json.loads(Path(tiny_h3, "transformer", "config.json").read_text())
    want = convert_minimax_h3_transformer_checkpoint_to_diffusers(merged, config=config)
    (entry,) = Engine(distribute=False).realise(handle(tiny_h3, (loras["comfyui"], strength)))[:1]
    got = entry.pipe.transformer.state_dict()
    assert sorted(got) == sorted(want)
    for key in want:
        torch.testing.assert_close(got[key], want[key], atol=1e-6, rtol=0, msg=key)


def test_the_lora_node_check_takes_both_layouts_from_the_configs_and_refuses_a_second_expert(tiny_h3, loras):
    for path in loras.values():
        check_lora_fits(PIPELINE, tiny_h3, LoraSpec(path))
    with pytest.raises(UserInputError, match="needs a second transformer"):
        check_lora_fits(PIPELINE, tiny_h3, LoraSpec(loras["comfyui"], 1.0, "low_noise"))
