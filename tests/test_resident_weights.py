"""int8/fp8 layers kept quantized in the model (runtime/resident_weights.py), on a tiny Z-Image: its ComfyUI file
fuses q, k and v into one qkv layer, which diffusers' converter splits with torch.chunk, so the row mapping is
exercised. The files are quantized by comfy-kitchen's own quantizers and written in ComfyUI's layout."""
import dataclasses
import json
import os

import pytest
import torch
from diffusers import ZImagePipeline, ZImageTransformer2DModel

import tiny_loras
import tiny_models
import tiny_single_files as tsf
from tpu_diffusers_runtime import memory_plan, resident_weights, single_file
from tpu_diffusers_runtime.families import family_for
from tpu_diffusers_runtime.file_choice import file_status
from tpu_diffusers_runtime.quant_formats import QuantizedWeight
from tpu_diffusers_runtime.features import lora
from safetensors.torch import save_file
from tpu_diffusers_runtime.specs import LoraSpec, QuantizedWeights

KEEP = QuantizedWeights.KEEP_QUANTIZED
LAYOUTS = {"int8_tensorwise": "TensorWiseINT8Layout", "int8_convrot": "TensorWiseINT8Layout",
           "float8_e4m3fn": "TensorCoreFP8Layout", "float8_e5m2": "TensorCoreFP8Layout"}
CONVROT_GROUP = 16  # comfy-kitchen's Hadamard group (a power of 4); the tiny model's widths are multiples of it


@pytest.fixture(scope="module")
def zimage(tmp_path_factory):
    return str(tiny_models.build("zimage", tmp_path_factory.mktemp("resident") / "tiny-zimage"))


def quantize(sd: dict, fmt: str):
    """(a ComfyUI-layout file's tensors, {file key: QuantizedWeight}) of `sd` with every 2-D weight quantized by
    comfy-kitchen as `fmt`."""
    from comfy_kitchen.tensor import get_layout_class

    tensors, quantized = {}, {}
    for key, value in sd.items():
        if not (key.endswith(".weight") and value.dim() == 2):
            tensors[key] = value
            continue
        layout = get_layout_class(LAYOUTS[fmt])
        if fmt.startswith("int8"):
            convrot = fmt == "int8_convrot" and value.shape[1] % CONVROT_GROUP == 0
            qdata, params = layout.quantize(value, is_weight=True, per_channel=True, convrot=convrot,
                                            convrot_groupsize=CONVROT_GROUP)
            conf = {"format": "int8_tensorwise", **({"convrot": True, "convrot_groupsize": CONVROT_GROUP}
                                                    if convrot else {})}
        else:
            qdata, params = layout.quantize(value, dtype=getattr(torch, fmt))
            conf = {"format": fmt}
        layer = key[: -len(".weight")]
        tensors[key], tensors[f"{layer}.weight_scale"] = qdata, params.scale
        tensors[f"{layer}.comfy_quant"] = torch.tensor(list(json.dumps(conf).encode()), dtype=torch.uint8)
        quantized[key] = QuantizedWeight(conf["format"], LAYOUTS[fmt], qdata, params)
    return tensors, quantized


def dequantized(tensors: dict, quantized: dict, dtype) -> dict:
    """The file's weights as the dequantized-on-load path gives them: each quantized layer's dequantize."""
    return {k: quantized[k].dequantize(dtype) if k in quantized else v.to(dtype) for k, v in tensors.items()
            if not k.endswith((".weight_scale", ".comfy_quant"))}


def load_transformer(folder: str, weights: dict, dtype=torch.float32):
    kind = family_for("ZImagePipeline").denoiser_kind
    model, *problems = single_file._load_diffusers("transformer", ZImageTransformer2DModel, weights, folder, dtype,
                                                   kind)
    assert not any(problems), problems
    return model.eval().requires_grad_(False)


def quantized_zimage(folder: str, fmt: str):
    """(the transformer loaded dequantized, the same made resident, what `apply` did)."""
    tensors, quantized = quantize(tsf.zimage_to_comfy(tsf.folder_weights(folder, "transformer")), fmt)
    plain = load_transformer(folder, dequantized(tensors, quantized, torch.float32))
    weights = dequantized(tensors, quantized, torch.float32)
    resident = load_transformer(folder, weights)
    return plain, resident, resident_weights.apply(resident, weights, quantized, KEEP)


def image(pipe, **kwargs):
    return pipe(prompt="a photo of a cat", height=64, width=64, num_inference_steps=2, output_type="np",
                generator=torch.Generator().manual_seed(0), max_sequence_length=16, **kwargs).images


@pytest.mark.parametrize("fmt", ["int8_tensorwise", "int8_convrot", "float8_e4m3fn", "float8_e5m2"])
def test_resident_layers_give_the_dequantized_image_bit_for_bit(zimage, fmt):
    """Every Linear of the file's quantized layers, also the q/k/v rows of the fused qkv, stays quantized, and
    the image equals the dequantized-on-load model's exactly."""
    plain, resident, done = quantized_zimage(zimage, fmt)
    layers = [m for m in resident.modules() if isinstance(m, resident_weights.ResidentLinear)]
    linears = [m for m in plain.modules() if type(m) is torch.nn.Linear]
    assert sum(done.resident.values()) == len(layers) == len(linears) > 30 and done.left_dequantized == 0
    assert any(getattr(m.params, "convrot", False) for m in layers) == (fmt == "int8_convrot")
    qkv = [m for n, m in resident.named_modules() if n.endswith("attention.to_q")]
    assert qkv and all(isinstance(m, resident_weights.ResidentLinear) for m in qkv)  # a row block of the file's qkv
    for name, module in resident.named_modules():
        if isinstance(module, resident_weights.ResidentLinear):
            assert module.qdata.dtype == (torch.int8 if fmt.startswith("int8") else getattr(torch, fmt)), name
            assert torch.equal(module.weight, plain.get_submodule(name).weight), name
    pipe = ZImagePipeline.from_pretrained(zimage, transformer=plain)
    expected = image(pipe)
    pipe.transformer = resident
    assert (image(pipe) == expected).all()


def test_a_layer_the_converter_built_anew_stays_dequantized_and_is_counted(zimage):
    """A file layer no Linear holds the rows of (here: its rows reversed, as a converter that permutes rows
    would leave the model's weights) is left dequantized, and its Linears stay plain."""
    tensors, quantized = quantize(tsf.zimage_to_comfy(tsf.folder_weights(zimage, "transformer")), "int8_tensorwise")
    weights = dequantized(tensors, quantized, torch.float32)
    model = load_transformer(zimage, weights)
    rebuilt = next(k for k in quantized if k.endswith(".qkv.weight"))
    weights[rebuilt] = weights[rebuilt].flip(0)
    linears = sum(1 for m in model.modules() if type(m) is torch.nn.Linear)
    done = resident_weights.apply(model, weights, quantized, KEEP)
    assert done.left_dequantized == 1 and sum(done.resident.values()) == linears - 3  # its q, k and v stay plain
    assert "1 quantized layers of the file left dequantized" in done.words("transformer")


LORA_ATOL = 1e-5  # unfused (x A B s added) against fused (W + s B A): float32 sums in another order (2.5e-6 seen)


def test_a_lora_on_resident_layers_stays_unfused_gives_fused_diffusers_image_and_a_strength_change_loads_nothing(
        zimage, tmp_path):
    """The LoRA is peft's side branch on the quantized layers (their data is untouched); the image equals plain
    diffusers with the LoRA fused into the dequantized weights within LORA_ATOL. A strength change is
    set_adapters only: it still works with the LoRA file gone."""
    path = str(tiny_loras.build(zimage, tmp_path / "zimage_lora.safetensors", "comfyui", seed=1))
    plain, resident, _ = quantized_zimage(zimage, "int8_tensorwise")
    qdata = {n: m.qdata.clone() for n, m in resident.named_modules() if isinstance(m, resident_weights.ResidentLinear)}
    reference = ZImagePipeline.from_pretrained(zimage, transformer=plain)
    reference.load_lora_weights(str(tmp_path), weight_name="zimage_lora.safetensors", adapter_name="a")
    base = ZImagePipeline.from_pretrained(zimage, transformer=resident)
    state = lora.LoraState()
    base_image = image(base)

    def check(strength):
        reference.set_adapters(["a"], [strength])
        reference.fuse_lora(components=["transformer"], lora_scale=1.0, adapter_names=["a"])
        expected = image(reference)
        reference.unfuse_lora(components=["transformer"])
        notes = lora.apply_loras(base, (LoraSpec(path, strength),), state)
        assert "unfused: the base layers stay quantized" in notes[0]
        got = image(base)
        assert abs(expected - base_image).max() > 0.1  # the LoRA changes the image (measured: 0.5 and 0.2)
        assert abs(got - expected).max() < LORA_ATOL, strength

    check(1.0)
    os.remove(path)  # a strength change reads nothing
    check(0.5)
    lora.apply_loras(base, (), state)
    assert not lora._has_adapters(resident)
    layers = {n: m.qdata for n, m in resident.named_modules() if isinstance(m, resident_weights.ResidentLinear)}
    assert layers.keys() == qdata.keys() and all(torch.equal(layers[n], qdata[n]) for n in qdata)


def tensor_bytes(model) -> int:
    return sum(t.numel() * t.element_size() for t in (*model.parameters(), *model.buffers()))


@pytest.mark.parametrize("fmt", ["int8_tensorwise", "float8_e4m3fn"])
def test_resident_bytes_are_the_files_quantized_bytes_and_the_memory_plan_counts_them(zimage, tmp_path, fmt):
    """A resident transformer holds the file's int8/fp8 data and scales plus the rest in its dtype (not the
    dequantized float32 of every layer), and the per-chip plan's figure from the file's header is the same."""
    tensors, quantized = quantize(tsf.zimage_to_comfy(tsf.folder_weights(zimage, "transformer")), fmt)
    path = tmp_path / f"zimage_{fmt}.safetensors"
    save_file(tensors, str(path))
    plain, resident, done = quantized_zimage(zimage, fmt)
    assert done.left_dequantized == 0
    dequantized_bytes = sum(w.qdata.numel() * 4 for w in quantized.values())
    quantized_bytes = sum(w.nbytes for w in quantized.values())
    assert tensor_bytes(resident) == tensor_bytes(plain) - dequantized_bytes + quantized_bytes
    assert tensor_bytes(resident) < tensor_bytes(plain) * 0.4  # ~1 byte per weight instead of 4
    family = family_for("ZImagePipeline")
    sizes = memory_plan.sizes_of_folder(zimage, family)
    planned = memory_plan.component_bytes(sizes, memory_plan.Layout(), dtype_bytes=4)["transformer"]
    with_files = dataclasses.replace(sizes, quantized={"transformer": memory_plan.stored_sizes(str(path))})
    assert planned == tensor_bytes(plain)
    assert memory_plan.component_bytes(with_files, memory_plan.Layout(), dtype_bytes=4)["transformer"] == \
        tensor_bytes(resident)


def test_the_file_status_says_each_files_formats_and_whether_they_stay_quantized_on_this_device(zimage, tmp_path):
    """Read from the headers (and the small comfy_quant tensors): auto keeps int8/fp8 quantized on tpu and cuda and
    dequantizes them on cpu; a file without per-layer formats gets no line."""
    sd = tsf.zimage_to_comfy(tsf.folder_weights(zimage, "transformer"))
    paths = {}
    for fmt in ("int8_convrot", "float8_e4m3fn"):
        paths[fmt] = str(tmp_path / f"{fmt}.safetensors")
        save_file(quantize(sd, fmt)[0], paths[fmt])
    paths["plain"] = str(tmp_path / "plain.safetensors")
    save_file(sd, paths["plain"])
    files = [("transformer", paths["int8_convrot"]), ("text_encoder", paths["float8_e4m3fn"]),
             ("vae", paths["plain"])]
    kept = "layers; int8/fp8 layers kept quantized on the chip, dequantized per layer as they run"
    on_chip = file_status(files, QuantizedWeights.AUTO, "tpu")
    assert len(on_chip) == 2  # the plain file has no line
    transformer, text_encoder = on_chip
    assert transformer.startswith("transformer: ") and transformer.endswith(kept)
    assert "25 int8 ConvRot" in transformer and "4 int8" in transformer  # ConvRot where the width allows
    assert text_encoder.startswith("text_encoder: 29 ") and text_encoder.endswith(kept)
    assert file_status(files, QuantizedWeights.AUTO, "cuda") == on_chip
    (on_cpu,) = file_status(files[:1], QuantizedWeights.AUTO, "cpu")
    assert on_cpu == transformer.replace(kept, "layers; dequantized on load (quantized weights: dequantize on load "
                                               "on cpu)")


def test_the_setting_is_in_the_load_key_and_auto_follows_the_device():
    """Changing it reloads; auto is what it resolves to on the device (the key also holds the device type)."""
    from tpu_diffusers_runtime.device import device_info
    from tpu_diffusers_runtime.handle import PipelineHandle

    cpu = device_info("cpu")
    handles = [PipelineHandle.of(source="/m", model_class="ZImagePipeline", files=[("transformer", "/f")],
                                 quantized_weights=choice) for choice in QuantizedWeights]
    assert len({h.load_key(cpu) for h in handles}) == len(handles)
    assert PipelineHandle.from_wire(handles[1].to_wire()) == handles[1]
    assert QuantizedWeights.AUTO.resolved("cpu") is QuantizedWeights.DEQUANTIZE
    assert QuantizedWeights.AUTO.resolved("tpu") is QuantizedWeights.AUTO.resolved("cuda") is \
        QuantizedWeights.KEEP_QUANTIZED


def test_a_resident_layer_compiles_without_a_graph_break_and_moves_its_packed_data(zimage):
    """torch.compile traces comfy-kitchen's dequantization (fullgraph) to the eager result; `.to()` moves the
    int8 data and the scales (what model CPU offload does), not a dequantized copy."""
    _, resident, _ = quantized_zimage(zimage, "int8_convrot")
    layer = next(m for m in resident.modules() if isinstance(m, resident_weights.ResidentLinear)
                 and m.params.convrot)
    x = torch.randn(2, layer.in_features)
    assert torch.equal(torch.compile(layer, fullgraph=True)(x), layer(x))
    resident.to("meta")
    assert {t.device.type for t in (*resident.parameters(), *resident.buffers())} == {"meta"}
    assert layer.qdata.dtype == torch.int8


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
@pytest.mark.parametrize("fmt", ["int8_convrot", "float8_e4m3fn", "scaled_fp8"])
def test_a_file_loaded_keeping_its_layers_quantized_gives_the_dequantized_image_bit_for_bit(zimage, tmp_path, fmt,
                                                                                            dtype):
    """Through the loader (single_file.load_component with quant_formats.quantized_layers): the transformer's
    layers stay quantized, the run info says how many, and the image equals `dequantize on load`'s exactly."""
    from tpu_diffusers_runtime.device import device_info
    from tpu_diffusers_runtime.handle import PipelineHandle
    from tpu_diffusers_runtime.loading import load_pipeline

    path = str(tmp_path / f"z_image_turbo_{fmt}.safetensors")
    comfy = tsf.zimage_to_comfy(tsf.folder_weights(zimage, "transformer"))
    save_file(tsf.scaled_fp8(comfy) if fmt == "scaled_fp8" else quantize(comfy, fmt)[0], path)  # the older form
    pipes, notes = {}, {}
    for choice in (QuantizedWeights.DEQUANTIZE, KEEP):
        notes[choice] = []
        pipes[choice] = load_pipeline(PipelineHandle.of(source=zimage, model_class="ZImagePipeline", dtype=dtype,
                                                        files=[("transformer", path)], quantized_weights=choice),
                                      device_info("cpu"), notes=notes[choice])
    layers = [m for m in pipes[KEEP].transformer.modules() if isinstance(m, resident_weights.ResidentLinear)]
    assert len(layers) > 30 and not notes[QuantizedWeights.DEQUANTIZE]
    assert notes[KEEP] == [f"transformer: {len(layers)} {layers[0].format} layers kept quantized on the chip, "
                           "dequantized per layer as they run"]
    assert (image(pipes[KEEP]) == image(pipes[QuantizedWeights.DEQUANTIZE])).all()
