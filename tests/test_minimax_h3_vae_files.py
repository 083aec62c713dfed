"""MiniMax H3's VAE files in ComfyUI's layout (runtime/families/minimax_h3_vae.py) from a tiny folder
(tools/tiny_single_files.minimax_h3_vae_files): the video VAE in fp16 and int8 ConvRot (its ViT decoder's block
linears), the audio VAE in fp32 with its weight norm folded. Picked in the File Loader with the diffusion model file,
they give the video and sound of the configs folder holding their values; converted, they are the folder's weights
(the int8 ones within int8 quantisation error of the unquantized weights); a wrong file in a slot, or a file of
another VAE than the configs', is refused."""

import shutil
from pathlib import Path

import pytest
import torch

from tpu_diffusers_runtime.device import device_info
from tpu_diffusers_runtime.engine import Engine
from tpu_diffusers_runtime.errors import ModelLoadError, UserInputError
from tpu_diffusers_runtime.handle import PipelineHandle
from tpu_diffusers_runtime.loading import load_pipeline
from tpu_diffusers_runtime.specs import QuantizedWeights

from test_minimax_h3 import PIPELINE, reference, request, tiny_h3  # noqa: F401 (tiny_h3: the module's fixture)

PRECISIONS = ("fp16", "int8_convrot")


@pytest.fixture(scope="module")
def vae_files(tiny_h3, tmp_path_factory):  # noqa: F811
    """{"files": the transformer and VAE files, precision: a configs folder (named as auto finds it) holding exactly
    what the bf16 transformer file, that video VAE file and the audio VAE file load as}; "original": the folder they
    are written from: the tiny one with its video decoder's residual scales random (diffusers starts them at zero,
    which makes each ViT block an identity: the video would not tell the decoder's attention and FFN weights)."""
    import tiny_single_files as tsf

    root = tmp_path_factory.mktemp("h3_vae_files")
    original = Path(shutil.copytree(tiny_h3, root / "original" / "MiniMax-H3"))
    generator = torch.Generator().manual_seed(0)
    tsf.component_holding(original, "vae", lambda sd: {k: torch.rand(v.shape, generator=generator) + 0.5 if
                                                      k.endswith((".scale1", ".scale2")) else v for k, v in sd.items()})
    files = {**tsf.minimax_h3_files(original, root / "files"), **tsf.minimax_h3_vae_files(original, root / "files")}
    out = {"files": files, "original": original}
    for precision in PRECISIONS:
        folder = Path(shutil.copytree(original, root / precision / "MiniMax-H3"))
        tsf.bf16_valued_transformer(folder)
        tsf.component_holding(folder, "vae", tsf.minimax_h3_video_vae_values(precision))
        tsf.component_holding(folder, "audio_vae", tsf.minimax_h3_audio_vae_values)
        out[precision] = folder
    return out


def picked(vae_files, precision):
    files = vae_files["files"]
    return {"vae": str(files[f"vae_{precision}"]), "audio_vae": str(files["audio_vae"])}


@pytest.mark.parametrize("precision", PRECISIONS)
def test_the_vae_files_give_the_folders_video_and_sound(vae_files, precision):
    """The File Loader's plan with the diffusion model, video VAE and audio VAE files: every one read from its file,
    the text encoder from the configs folder; the video and sound of that folder."""
    from tpu_diffusers_runtime.file_choice import plan

    folder, transformer = vae_files[precision], str(vae_files["files"]["transformer"])
    source, model_class, files = plan(transformer, picked(vae_files, precision), "auto", [str(folder.parent)])
    assert (source, model_class) == (str(folder), PIPELINE)
    assert dict(files) == {"transformer": transformer, **picked(vae_files, precision)}
    made = Engine(distribute=False).generate(PipelineHandle.of(source=source, model_class=model_class, files=files),
                                             request(batch_size=1))
    frames, waveform, _ = reference(str(folder), "t2va", 1)
    assert (made.images - frames).abs().max() <= 1 / 255
    torch.testing.assert_close(made.audio["waveform"], waveform, atol=1e-4, rtol=0)


def loaded(vae_files, precision, quantized_weights=QuantizedWeights.DEQUANTIZE, notes=None):
    files = (("transformer", str(vae_files["files"]["transformer"])), *picked(vae_files, precision).items())
    return load_pipeline(PipelineHandle.of(source=str(vae_files[precision]), model_class=PIPELINE, files=files,
                                           quantized_weights=quantized_weights), device_info("cpu"), notes=notes)


@pytest.mark.parametrize("precision", PRECISIONS)
def test_the_converted_vaes_are_the_folders_weights(vae_files, precision):
    """Every tensor of both converted VAEs is the folder's (which holds the files' values): q/k/v de-interleaved by
    head, w1's halves swapped, names mapped; the audio VAE's weight_v is the folded weight, its weight_g that weight's
    norm (computed apart, so within float32 rounding). The int8 ConvRot decoder is dequantized even when the
    Loader keeps quantized layers (no VAE is kept quantized)."""
    from diffusers import AutoencoderKLMiniMaxH3, AutoencoderKLMiniMaxH3Audio

    from tpu_diffusers_runtime.resident_weights import ResidentLinear

    folder = vae_files[precision]
    notes = []
    pipe = loaded(vae_files, precision, QuantizedWeights.KEEP_QUANTIZED, notes)
    for name, cls in (("vae", AutoencoderKLMiniMaxH3), ("audio_vae", AutoencoderKLMiniMaxH3Audio)):
        want = cls.from_pretrained(folder / name).state_dict()
        got = getattr(pipe, name).state_dict()
        assert sorted(got) == sorted(want)
        for key in want:
            if key.endswith(".weight_g"):
                torch.testing.assert_close(got[key], want[key], rtol=1e-6, atol=0)
            else:
                assert torch.equal(got[key], want[key]), key
        assert not any(isinstance(m, ResidentLinear) for m in getattr(pipe, name).modules())
    assert not any(note.startswith(("vae", "audio_vae")) for note in notes)


def test_the_int8_convrot_decoder_is_the_unquantized_weights_within_int8_error(vae_files):
    """Against the tiny folder's own float32 weights: the int8 ConvRot block linears within their rows' int8 error
    (each row rounded to 255 steps of its largest rotated value, at most its norm, after bf16 rounding; the rotation is
    orthonormal, so per row |error| <= |row| (sqrt(inputs) / 254 + 2^-8)), every other tensor within fp16 rounding."""
    from diffusers import AutoencoderKLMiniMaxH3

    import tiny_single_files as tsf

    want = AutoencoderKLMiniMaxH3.from_pretrained(vae_files["original"] / "vae").state_dict()
    got = loaded(vae_files, "int8_convrot").vae.state_dict()
    assert sorted(got) == sorted(want)
    for key, value in want.items():
        if tsf.MINIMAX_H3_VAE_LINEARS.match(key):
            bound = value.norm(dim=1) * (value.shape[1] ** 0.5 / 254 + 2 ** -8)
            assert ((got[key] - value).norm(dim=1) <= bound).all(), key
            assert not torch.equal(got[key], value.half().float()), key  # really quantized
        else:
            torch.testing.assert_close(got[key], value, rtol=2 ** -10, atol=1e-7)


def test_a_wrong_file_in_a_vae_slot_is_refused_when_queued(vae_files):
    from tpu_diffusers_runtime.file_choice import plan

    files, folder = vae_files["files"], vae_files["fp16"]
    transformer, video, audio = str(files["transformer"]), str(files["vae_fp16"]), str(files["audio_vae"])
    roots = [str(folder.parent)]
    with pytest.raises(UserInputError, match=r"'minimax_h3_audio_vae_fp32.safetensors' is a MiniMax H3 audio VAE, "
                                             r"but vae of MiniMax H3 needs a MiniMax H3 video VAE\. Pick the right "
                                             r"file for vae\."):
        plan(transformer, {"vae": audio, "audio_vae": audio}, "auto", roots)
    with pytest.raises(UserInputError, match=r"'minimax_h3_video_vae_fp16.safetensors' is a MiniMax H3 video VAE, "
                                             r"but audio_vae of MiniMax H3 needs a MiniMax H3 audio VAE\."):
        plan(transformer, {"vae": video, "audio_vae": video}, "auto", roots)
    with pytest.raises(UserInputError, match=r"'minimax_h3_fl2va_bf16.safetensors' is a MiniMax H3 diffusion model, "
                                             r"but vae of MiniMax H3 needs a MiniMax H3 video VAE\."):
        plan(transformer, {"vae": transformer}, "auto", roots)
    # a configs-only folder (auto's hub id): the text encoder and both VAEs are needed as files
    with pytest.raises(UserInputError, match=r"MiniMax H3 from single files also needs text_encoder "
                                             r"\(qwen3vl_32b_minimax_h3_nvfp4_awq.safetensors\), vae "
                                             r"\(minimax_h3_video_vae_int8_convrot.safetensors\), audio_vae "
                                             r"\(minimax_h3_audio_vae_fp32.safetensors\)\."):
        plan(transformer, {}, "auto", [])
    with pytest.raises(UserInputError, match=r"MiniMax H3 from single files also needs text_encoder "
                                             r"\(qwen3vl_32b_minimax_h3_nvfp4_awq.safetensors\)\."):
        plan(transformer, {"vae": video, "audio_vae": audio}, "auto", [])


@pytest.mark.parametrize("component", ["vae", "audio_vae"])
def test_a_vae_file_of_other_latent_statistics_than_the_configs_is_refused(vae_files, tmp_path, component):
    """The files carry their latent statistics, diffusers' configs too: a file whose statistics are not the configs
    folder's is another VAE than the one the pipeline normalises its latents for."""
    from diffusers import AutoencoderKLMiniMaxH3, AutoencoderKLMiniMaxH3Audio
    from safetensors.torch import load_file, save_file

    from tpu_diffusers_runtime.single_file import load_component

    source = vae_files["files"]["vae_fp16" if component == "vae" else "audio_vae"]
    state = load_file(source)
    state["latents_std"] = state["latents_std"] * 2
    path = tmp_path / source.name
    save_file(state, path)
    cls = {"vae": AutoencoderKLMiniMaxH3, "audio_vae": AutoencoderKLMiniMaxH3Audio}[component]
    with pytest.raises(ModelLoadError, match=rf"'{source.name}' is not a MiniMax H3 (video|audio) VAE for MiniMax H3 "
                                             rf"as 'MiniMax-H3' describes it \(ValueError: its latents_std \(\[2\.0, "
                                             rf"2\.0, 2\.0\]\.\.\. \d+ channels\) is not the configs folder's "
                                             rf"{component} config's \(\[1\.0, 1\.0, 1\.0\]\.\.\. \d+\): the file and "
                                             rf"the configs are of two different VAEs\)"):
        load_component(component, cls, str(path), str(vae_files["fp16"]), torch.float32, {}, [],
                       model_file=str(vae_files["files"]["transformer"]))


def test_the_int8_convrot_video_vae_is_said_and_planned_dequantized(vae_files):
    """The File Loader's status and the memory plan, from the headers: its int8 ConvRot layers are not kept
    quantized, whatever quantized_weights says (the diffusion model's are)."""
    from tpu_diffusers_runtime.file_choice import file_status
    from tpu_diffusers_runtime.memory_plan import quantized_sizes

    files = vae_files["files"]
    chosen = (("transformer", str(files["transformer_int8_convrot"])), ("vae", str(files["vae_int8_convrot"])),
              ("audio_vae", str(files["audio_vae"])))
    status = file_status(chosen, QuantizedWeights.KEEP_QUANTIZED, "tpu")
    assert status[0].startswith("transformer: ") and status[0].endswith("kept quantized on the chip, dequantized per "
                                                                        "layer as they run")
    assert status[1] == ("vae: 4 int8 ConvRot layers; dequantized on load (a MiniMax H3 video VAE is not kept "
                         "quantized)")
    assert len(status) == 2  # the audio VAE has no quantized layers
    sizes = quantized_sizes(PipelineHandle.of(source=str(vae_files["int8_convrot"]), model_class=PIPELINE,
                                              files=chosen), str(vae_files["int8_convrot"]))
    assert set(sizes) == {"transformer", "audio_vae"} and sizes["transformer"][0] > 0


@pytest.mark.parametrize("component", ["vae", "audio_vae"])
def test_a_vae_file_in_diffusers_layout_loads_as_it_is(vae_files, tmp_path, component):
    """A diffusers folder's own VAE weights saved as one file (weight_g / weight_v, to_q / to_k / to_v): told by the
    same keys, loaded without conversion."""
    from diffusers import AutoencoderKLMiniMaxH3, AutoencoderKLMiniMaxH3Audio

    from tpu_diffusers_runtime.single_file import load_component

    folder = vae_files["fp16"]
    path = tmp_path / f"minimax_h3_{component}_diffusers.safetensors"
    shutil.copy(folder / component / "diffusion_pytorch_model.safetensors", path)
    cls = {"vae": AutoencoderKLMiniMaxH3, "audio_vae": AutoencoderKLMiniMaxH3Audio}[component]
    got = load_component(component, cls, str(path), str(folder), torch.float32, {}, [],
                         model_file=str(vae_files["files"]["transformer"])).state_dict()
    want = cls.from_pretrained(folder / component).state_dict()
    assert sorted(got) == sorted(want) and all(torch.equal(got[k], want[k]) for k in want)
