"""ComfyUI's quantized files read through comfy-kitchen (runtime/quant_formats.py): each format of ComfyUI's
comfy/quant_ops.py, written by comfy-kitchen's own quantizers in ComfyUI's on-disk layout (tools/
tiny_single_files.py), dequantizes to exactly what comfy-kitchen's eager backend computes from the file's tensors;
the header alone tells the formats; what cannot be read is refused naming the format, the file and what to pick."""

import json
import os

import pytest
import torch
from safetensors.torch import load_file, save_file

import tiny_single_files as tsf
from tpu_diffusers_runtime import quant_formats, single_file
from tpu_diffusers_runtime.errors import UserInputError


@pytest.fixture(scope="module")
def quantized_files(tiny_dir, tmp_path_factory):
    return tsf.zimage_quantized_files(tiny_dir / "tiny-zimage", tmp_path_factory.mktemp("quantized") / "models")


def eager_dequantized(raw: dict, layer: str, dtype) -> torch.Tensor:
    """One layer's weight as comfy-kitchen's eager functions compute it from the file's tensors, named as
    comfy/ops.py reads them, with AWQ's pre_quant_scale folded into the input columns."""
    import comfy_kitchen as ck
    from comfy_kitchen.backends.eager.quantization import dequantize_int8_convrot_weight, dequantize_int8_simple
    from comfy_kitchen.tensor import (TensorCoreAWQW4A16Layout, dequantize_convrot_w4a4_weight,
                                      dequantize_w4a8_int8_weight)

    conf = json.loads(bytes(raw[f"{layer}.comfy_quant"].tolist()))
    q, scale = raw[f"{layer}.weight"], raw.get(f"{layer}.weight_scale")
    fmt = conf["format"]
    with ck.use_backend("eager"):
        if fmt in ("float8_e4m3fn", "float8_e5m2"):
            weight = ck.dequantize_per_tensor_fp8(q, scale, dtype)
        elif fmt == "nvfp4":
            weight = ck.dequantize_nvfp4(q, raw[f"{layer}.weight_scale_2"], scale, dtype)
        elif fmt == "mxfp8":
            weight = ck.dequantize_mxfp8(q, scale, dtype)
        elif fmt == "int8_tensorwise" and conf.get("convrot"):
            weight = dequantize_int8_convrot_weight(q, scale, conf["convrot_groupsize"]).to(dtype)
        elif fmt == "int8_tensorwise":
            weight = dequantize_int8_simple(q, scale).to(dtype)
        elif fmt == "convrot_w4a4":
            weight = dequantize_convrot_w4a4_weight(q, scale, conf["convrot_groupsize"], 64, dtype)
        elif fmt == "asym_w4a8_int8":
            weight = dequantize_w4a8_int8_weight(q, raw[f"{layer}.weight_s_rel"], raw[f"{layer}.weight_s_channel"],
                                                 raw.get(f"{layer}.weight_codebook"), group_size=conf["group_size"],
                                                 convrot_groupsize=conf["convrot_groupsize"], output_dtype=dtype)
        else:  # awq_w4a16: offline-calibrated, comfy-kitchen's eager path is the layout's own unpacking
            params = TensorCoreAWQW4A16Layout.Params(scale=scale, zeros=raw[f"{layer}.weight_zeros"],
                                                     group_size=conf["group_size"], orig_dtype=dtype,
                                                     orig_shape=(q.shape[0], q.shape[1] * 2))
            weight = TensorCoreAWQW4A16Layout.dequantize(q, params).to(dtype)
    smooth = raw.get(f"{layer}.pre_quant_scale")
    return weight if smooth is None else (weight.float() * smooth.float()).to(dtype)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
@pytest.mark.parametrize("kind", tsf.QUANT_KINDS)
def test_each_format_dequantizes_to_comfy_kitchens_eager_result_bit_for_bit(quantized_files, kind, dtype):
    for component, path in quantized_files[kind].items():
        raw = load_file(str(path))
        layers = [k[: -len(".comfy_quant")] for k in raw if k.endswith(".comfy_quant")]
        got = single_file.read_weights(str(path), dtype)
        assert layers and len(layers) < sum(k.endswith(".weight") for k in raw), "a mixed file: some layers bf16"
        scales_and_markers = {k for k in raw if k.rsplit(".", 1)[0] in layers and k.rsplit(".", 1)[1] not in
                              ("weight", "bias")}
        assert scales_and_markers and sorted(got) == sorted(raw.keys() - scales_and_markers)
        header = single_file.HeaderView(str(path))  # what the queue-time checks compare with the config's shapes
        for layer in layers:
            expected = eager_dequantized(raw, layer, dtype)
            assert got[f"{layer}.weight"].dtype == dtype and torch.equal(got[f"{layer}.weight"], expected), layer
            assert header[f"{layer}.weight"].shape == expected.shape, layer
        for key in got.keys() - {f"{layer}.weight" for layer in layers}:
            assert torch.equal(got[key], raw[key].to(dtype)), key


def test_the_header_tells_each_components_formats_once_per_file_version(quantized_files, tmp_path):
    words = {kind: quant_formats.format_words(str(files["transformer"])) for kind, files in quantized_files.items()}
    assert words["int8_convrot"] == "int8 ConvRot (25 layers), int8 (4 layers), the rest bf16"  # as ComfyUI writes
    assert words["nvfp4_awq"] == "nvfp4 AWQ (17 layers), the rest bf16"
    assert words["fp8_e5m2_scaled"] == "fp8 e5m2 (29 layers), the rest bf16"
    assert quant_formats.format_words(str(quantized_files["w4a8"]["text_encoder"])) == \
        "int4 W4A8 (15 layers), the rest bf16"
    path = tmp_path / "model.safetensors"
    save_file({"a.weight": torch.zeros(4, 4, dtype=torch.bfloat16)}, str(path))
    first = quant_formats.file_quantization(str(path))
    assert quant_formats.file_quantization(str(path)) is first and first.words() == "bf16"
    save_file({"a.weight": torch.zeros(4, 4, dtype=torch.float16)}, str(path))
    os.utime(path, ns=(1, 1))  # another version of the file: read again
    assert quant_formats.format_words(str(path)) == "fp16"


def test_the_older_scaled_fp8_form_is_read_through_comfy_kitchen(tmp_path):
    import comfy_kitchen as ck

    weights = {"a.weight": torch.randn(16, 32), "a.bias": torch.randn(16)}
    path = tmp_path / "t5xxl_fp8_e4m3fn_scaled.safetensors"
    save_file(tsf.scaled_fp8(weights), str(path))
    raw = load_file(str(path))
    assert quant_formats.format_words(str(path)) == "scaled fp8 (1 layer)"
    got = single_file.read_weights(str(path), torch.bfloat16)
    assert sorted(got) == ["a.bias", "a.weight"]
    with ck.use_backend("eager"):
        expected = ck.dequantize_per_tensor_fp8(raw["a.weight"], raw["a.scale_weight"], torch.bfloat16)
    assert torch.equal(got["a.weight"], expected)


def unknown_format_file(path, fmt: str = "svdquant_w4a4"):
    save_file({"layers.0.linear.weight": torch.zeros(16, 8, dtype=torch.int8), "layers.0.linear.weight_scale":
               torch.ones(16), "layers.0.linear.comfy_quant": torch.tensor(list(json.dumps({"format": fmt}).encode()),
                                                                          dtype=torch.uint8)}, str(path))
    return str(path)


def test_a_format_comfy_kitchen_does_not_know_is_refused_naming_it_the_file_and_what_to_pick(tmp_path):
    path = unknown_format_file(tmp_path / "model_svdq.safetensors")
    pattern = (r"'model_svdq.safetensors' is quantized as 'svdquant_w4a4' \(1 layers, e.g. layers.0.linear.weight\), "
               r"a format ComfyUI's comfy-kitchen does not know. Supported are .*Pick a bf16, fp16, fp8 or int8 version")
    for read in (single_file.read_weights, lambda p, _: single_file.HeaderView(p)):
        with pytest.raises(UserInputError, match=pattern):
            read(path, torch.float32)


def test_a_format_the_installed_comfy_kitchen_lacks_is_refused_with_update_advice(quantized_files, monkeypatch):
    """An older comfy-kitchen without MXFP8's layout (ComfyUI itself then leaves mxfp8 out of QUANT_ALGOS)."""
    from comfy_kitchen.tensor import base

    monkeypatch.delitem(base.LAYOUTS, "TensorCoreMXFP8Layout")
    path = str(quantized_files["mxfp8"]["text_encoder"])
    with pytest.raises(UserInputError, match=r"'qwen_3_4b_mxfp8.safetensors' is .*quantized as mxfp8, which the "
                                             r"installed comfy-kitchen \S+ cannot read \(it lacks TensorCoreMXFP8Layout\)"
                                             r".*Pick a bf16, fp16, fp8 or int8 version.*pip install -U comfy-kitchen"):
        single_file.read_weights(path, torch.float32)
