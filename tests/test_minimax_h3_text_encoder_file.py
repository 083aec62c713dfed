"""MiniMax H3's text encoder file (runtime/families/minimax_h3.py, FileSlot.layers_read): Comfy-Org's
qwen3vl_32b_minimax_h3_nvfp4_awq is Qwen3-VL 32B in ComfyUI's layout cut after decoder layer 50 (no final norm, no
lm_head), its language model's linears nvfp4 with AWQ pre-scales. Written here from the tiny H3 folder's 51-layer text
encoder (tools/tiny_single_files.minimax_h3_text_encoder_files), it loads as a text encoder of the file's 50 layers only
(the config keeps 51: diffusers' blocks check it) whose hidden_states[50] is the full model's with the file's weights
(dequantized by comfy-kitchen's eager functions, independently of the loader); through the File Loader's plan and the
Engine, the video and sound of the folder holding those weights. A Qwen3 file and a Qwen3-VL of fewer layers are
refused naming why."""

import shutil
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file, save_file

import tiny_single_files as tsf
from test_minimax_h3 import PIPELINE, reference, request
from test_quant_formats import eager_dequantized
from tpu_diffusers_runtime.device import device_info
from tpu_diffusers_runtime.engine import Engine
from tpu_diffusers_runtime.errors import UserInputError
from tpu_diffusers_runtime.handle import PipelineHandle
from tpu_diffusers_runtime.loading import load_pipeline


def file_values(path) -> dict:
    """The file's weights in transformers' names, each quantized layer as comfy-kitchen's eager functions dequantize
    it (pre_quant_scale folded in), in float32."""
    raw = load_file(str(path))
    out = {}
    for key, value in raw.items():
        layer = key.removesuffix(".weight")
        if f"{layer}.comfy_quant" in raw:
            if key.endswith(".weight"):
                out[key] = eager_dequantized(raw, layer, torch.float32)
        elif not key.endswith((".comfy_quant", ".weight_scale", ".weight_scale_2", ".pre_quant_scale")):
            out[key] = value.float()
    return {("model.language_model." + k.removeprefix("model.") if k.startswith("model.") else "model." + k): v
            for k, v in out.items()}


@pytest.fixture(scope="module")
def h3_text(tmp_path_factory):
    """(a configs folder named as auto finds it whose text encoder holds the file's values in its first 50 layers
    (its 51st layer and final norm are the tiny model's: they do not change hidden_states[50]) and whose transformer
    holds bf16 values, the files)."""
    import tiny_models

    root = tmp_path_factory.mktemp("h3_text")
    tiny = root / "tiny-minimax-h3"
    tiny_models.save(*tiny_models.minimax_h3(), tiny)
    files = {**tsf.minimax_h3_text_encoder_files(tiny, root / "files"), **tsf.minimax_h3_files(tiny, root / "files")}
    folder = Path(shutil.copytree(tiny, root / "configs" / "MiniMax-H3"))
    tsf.bf16_valued_transformer(folder)
    from transformers import Qwen3VLForConditionalGeneration

    model = Qwen3VLForConditionalGeneration.from_pretrained(folder / "text_encoder")
    values = file_values(files["text_encoder"])
    state = model.state_dict()
    assert set(values) < set(state) and len(values) == len([k for k in state if ".layers.50." not in k and k not in (
        "model.language_model.norm.weight", "lm_head.weight")])
    model.load_state_dict({**state, **values})
    model.save_pretrained(folder / "text_encoder")
    return folder, files


@pytest.fixture(scope="module")
def engine():
    return Engine(distribute=False)


def prompt_embeds(text_encoder, processor):
    from diffusers.modular_pipelines.minimax_h3.encoders import get_qwen3vl_prompt_embeds

    return get_qwen3vl_prompt_embeds(text_encoder, processor, processor.tokenizer("a cat playing piano").input_ids)


def test_the_cut_file_loads_its_50_layers_only_and_gives_the_folders_prompt_embeddings(h3_text):
    """Its 50 layers hold exactly the dequantized values, no 51st layer nor final norm is built (nothing runs random
    weights), the run info says so, and the blocks' own encoder (hidden_states[50]) gives the folder's embeddings; the
    file's nvfp4 layers are real (they differ from the tiny model's weights by the nvfp4 error)."""
    from transformers import Qwen3VLForConditionalGeneration, Qwen3VLProcessor

    folder, files = h3_text
    notes = []
    pipe = load_pipeline(PipelineHandle.of(source=str(folder), model_class=PIPELINE,
                                           files=(("text_encoder", str(files["text_encoder"])),)),
                         device_info("cpu"), notes=notes)
    got = pipe.text_encoder
    text = got.model.language_model
    assert len(text.layers) == 50 and isinstance(text.norm, torch.nn.Identity)
    assert got.config.text_config.num_hidden_layers == 51
    assert any("'qwen3vl_32b_minimax_h3_nvfp4_awq.safetensors' holds the first 50 of its 51 decoder layers and no "
               "final norm" in note for note in notes), notes
    want = Qwen3VLForConditionalGeneration.from_pretrained(folder / "text_encoder").eval()
    values = file_values(files["text_encoder"])
    state = got.state_dict()
    assert all(torch.equal(state[k], v) for k, v in values.items())
    processor = Qwen3VLProcessor.from_pretrained(folder / "processor")
    with torch.no_grad():
        embeds, full = prompt_embeds(got, processor), prompt_embeds(want, processor)
    torch.testing.assert_close(embeds, full, rtol=0, atol=1e-6)
    q_proj = "model.language_model.layers.0.self_attn.q_proj.weight"
    original = tsf.folder_weights(folder.parent.parent / "tiny-minimax-h3", "text_encoder")[q_proj]
    assert 0 < (state[q_proj] - original).abs().max() < original.abs().max()


def test_under_the_releases_64_layer_config_it_still_builds_the_files_50_layers_only(h3_text, tmp_path):
    """The release's text encoder config has 64 layers: the file fills its first 50, none of the 14 others is built
    (no random layer), the config keeps 64, and the prompt embeddings are the 51-layer folder model's."""
    import json

    from transformers import Qwen3VLForConditionalGeneration, Qwen3VLProcessor

    folder, files = h3_text
    released = Path(shutil.copytree(folder, tmp_path / "MiniMax-H3"))
    config = json.loads((released / "text_encoder" / "config.json").read_text())
    config["text_config"]["num_hidden_layers"] = 64
    config["text_config"].pop("layer_types", None)
    (released / "text_encoder" / "config.json").write_text(json.dumps(config))
    notes = []
    pipe = load_pipeline(PipelineHandle.of(source=str(released), model_class=PIPELINE,
                                           files=(("text_encoder", str(files["text_encoder"])),)),
                         device_info("cpu"), notes=notes)
    assert len(pipe.text_encoder.model.language_model.layers) == 50
    assert pipe.text_encoder.config.text_config.num_hidden_layers == 64
    assert any("holds the first 50 of its 64 decoder layers and no final norm" in note for note in notes), notes
    processor = Qwen3VLProcessor.from_pretrained(folder / "processor")
    want = Qwen3VLForConditionalGeneration.from_pretrained(folder / "text_encoder").eval()
    with torch.no_grad():
        torch.testing.assert_close(prompt_embeds(pipe.text_encoder, processor), prompt_embeds(want, processor),
                                   rtol=0, atol=1e-6)


def test_its_text_encoder_file_gives_the_folders_video_and_sound(h3_text, engine):
    """Picked beside the diffusion model in the File Loader, the plan reads both files; the run's video and sound are
    the folder's (text encoder holding the file's values) run as diffusers' users run it."""
    from tpu_diffusers_runtime.file_choice import check_against_configs, plan

    folder, files = h3_text
    source, model_class, chosen = plan(str(files["transformer"]), {"text_encoder": str(files["text_encoder"])}, "auto",
                                       [str(folder.parent)])
    assert (source, model_class) == (str(folder), PIPELINE)
    assert dict(chosen) == {"transformer": str(files["transformer"]), "text_encoder": str(files["text_encoder"])}
    check_against_configs(source, model_class, chosen, files["transformer"].name)
    made = engine.generate(PipelineHandle.of(source=source, model_class=model_class, files=chosen),
                           request(batch_size=1))
    assert any("holds the first 50 of its 51 decoder layers" in note for note in made.info.notes), made.info.notes
    frames, waveform, _ = reference(str(folder), "t2va", 1)
    assert (made.images - frames).abs().max() <= 1 / 255
    torch.testing.assert_close(made.audio["waveform"], waveform, atol=1e-4, rtol=0)


def test_a_whole_qwen3vl_file_loads_every_layer(h3_text):
    """A Qwen3-VL file that is not cut (every layer and the final norm) loads as it is: nothing left out."""
    folder, files = h3_text
    notes = []
    pipe = load_pipeline(PipelineHandle.of(source=str(folder), model_class=PIPELINE,
                                           files=(("text_encoder", str(files["text_encoder_whole"])),)),
                         device_info("cpu"), notes=notes)
    text = pipe.text_encoder.model.language_model
    assert len(text.layers) == 51 and not isinstance(text.norm, torch.nn.Identity)
    assert not any("decoder layers" in note for note in notes)


def test_a_qwen3_file_and_a_qwen3vl_of_fewer_layers_are_refused_naming_why(h3_text, tmp_path):
    """Refused when queued (and by the loader): a Qwen3 text encoder (no vision tower), a Qwen3-VL holding fewer layers
    than the 50 H3 reads; with a hub id's configs the VAEs still need a folder with their weights."""
    from tpu_diffusers_runtime.file_choice import plan

    folder, files = h3_text
    cut = load_file(str(files["text_encoder_whole"]))
    qwen3 = tmp_path / "qwen_3_4b.safetensors"
    save_file({k: v for k, v in cut.items() if k.startswith("model.")}, str(qwen3))
    with pytest.raises(UserInputError, match=r"'qwen_3_4b.safetensors' is a Qwen3 text encoder, but text_encoder of "
                                             r"MiniMax H3 needs a Qwen3-VL text encoder"):
        plan(str(files["transformer"]), {"text_encoder": str(qwen3)}, "auto", [str(folder.parent)])
    fewer = tmp_path / "qwen3vl_8b_bf16.safetensors"
    save_file({k: v for k, v in cut.items() if not k.startswith(tuple(f"model.layers.{i}." for i in range(40, 51)))},
              str(fewer))
    with pytest.raises(UserInputError, match=r"'qwen3vl_8b_bf16.safetensors' holds 40 decoder layers, but MiniMax H3 "
                                             r"reads the hidden states after layer 50 of its text_encoder: it is a "
                                             r"Qwen3-VL text encoder of another model. Pick ComfyUI's "
                                             r"qwen3vl_32b_minimax_h3_nvfp4_awq.safetensors"):
        plan(str(files["transformer"]), {"text_encoder": str(fewer)}, "auto", [str(folder.parent)])
    with pytest.raises(UserInputError, match=r"MiniMax H3 from single files also needs vae "
                                             r"\(minimax_h3_video_vae_int8_convrot.safetensors\), audio_vae "
                                             r"\(minimax_h3_audio_vae_fp32.safetensors\)"):
        plan(str(files["transformer"]), {"text_encoder": str(files["text_encoder"])}, "auto", [])  # a hub id's configs
    with pytest.raises(UserInputError, match=r"holds 40 decoder layers"):  # the loader checks too
        load_pipeline(PipelineHandle.of(source=str(folder), model_class=PIPELINE,
                                        files=(("text_encoder", str(fewer)),)), device_info("cpu"), notes=[])
