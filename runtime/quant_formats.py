"""ComfyUI's quantized weight formats, read through comfy-kitchen (ComfyUI's own kernel library).

A quantized layer in a ComfyUI file is `<layer>.weight` (the packed data), its scales (`weight_scale`,
`weight_scale_2`, ...) and `<layer>.comfy_quant` (the format as JSON; older files put the same per layer in the
`_quantization_metadata` header entry). comfy-kitchen's layout class for the format knows how to turn those into
the weight (`Layout.dequantize(qdata, params)`, its eager backend is plain torch), so the math lives there, not
here: this module only maps a file's tensors to the layout's Params, as ComfyUI's `comfy/ops.py`
(`_load_quantized_module`) does, and tells from the header alone which formats a file holds.
"""

from __future__ import annotations

import collections
import dataclasses
import functools
import json
import os

from .errors import ModelLoadError, UserInputError

# The legacy scaled fp8 form: a marker key, and `<layer>.scale_weight` (`.scale_input`) beside each fp8 weight.
SCALED_FP8_MARKER = "scaled_fp8"
LEGACY_SCALE = ".scale_weight"
# What to pick instead of a file the pack cannot read.
PICK_INSTEAD = "Pick a bf16, fp16, fp8 or int8 version of this model"
# safetensors' dtype names, in words
DTYPE_WORDS = {"BF16": "bf16", "F16": "fp16", "F32": "fp32", "F8_E4M3": "fp8 e4m3fn", "F8_E5M2": "fp8 e5m2"}


@dataclasses.dataclass(frozen=True)
class QuantizedWeight:
    """One layer's weight as its file stores it: the format's name in the file, comfy-kitchen's layout class
    for it, the packed data and the layout's Params (scales, group sizes, the original shape and dtype), and
    the AWQ smoothing scale the layer's input is multiplied by (`pre_quant_scale`, None when the file has none)."""

    format: str
    layout: str
    qdata: object  # torch.Tensor
    params: object  # the layout's Params dataclass
    pre_quant_scale: object = None  # torch.Tensor [in_features] or None

    def dequantize(self, dtype):
        """The weight in `dtype`, computed by comfy-kitchen's layout (the same function on every path, so the
        weights a model gets on load and the ones a resident layer computes per step are equal bit for bit).
        The layout computes in `dtype` (its Params' orig_dtype, as ComfyUI sets it to the compute dtype). A
        `pre_quant_scale` (ModelOpt AWQ: ComfyUI multiplies the layer's input by it) is folded into the weight's
        columns, in float32: x * s @ W^T == x @ (W * s)^T."""
        import torch
        from comfy_kitchen.tensor import get_layout_class

        params = dataclasses.replace(self.params, orig_dtype=dtype)
        weight = get_layout_class(self.layout).dequantize(self.qdata, params)
        if self.pre_quant_scale is not None:
            weight = (weight.to(torch.float32) * self.pre_quant_scale.to(torch.float32)).to(dtype)
        return weight.to(dtype)

    @property
    def nbytes(self) -> int:
        """Bytes the layer takes while it stays quantized: the packed data, every tensor of its Params and its
        pre_quant_scale."""
        import torch

        tensors = [self.qdata, *(v for v in [*vars(self.params).values(), self.pre_quant_scale]
                                 if isinstance(v, torch.Tensor))]
        return sum(t.numel() * t.element_size() for t in tensors)


# ------------------------------------------------------------------------------------------- the formats
@dataclasses.dataclass(frozen=True)
class Format:
    """One per-layer format of ComfyUI's `comfy/quant_ops.py` QUANT_ALGOS: comfy-kitchen's layout class, the
    layer's tensors beside `.weight` as Params fields ({Params field: (file suffix, dtype the bytes are viewed
    as or None)}; `scale` is required), its other Params from the layer's JSON config (`options`) and how the
    original [out, in] shape follows from the packed data."""

    name: str
    layout: str
    words: str
    tensors: dict
    options: object = None  # (conf) -> dict of the Params' non-tensor fields
    packed_in: object = None  # (stored shape, scale's shape, options) -> in_features; None: the stored shape's


def _conf_value(conf: dict, name: str, default):
    """A layer option at the top level of its JSON or under "params", as comfy/ops.py reads it."""
    params = conf.get("params") if isinstance(conf.get("params"), dict) else {}
    return conf.get(name, params.get(name, default))


def _int8_options(conf: dict) -> dict:
    if _conf_value(conf, "convrot", False):
        return {"convrot": True, "convrot_groupsize": int(_conf_value(conf, "convrot_groupsize", 256))}
    return {}


def _convrot_w4a4_options(conf: dict) -> dict:
    return {"convrot_groupsize": int(_conf_value(conf, "convrot_groupsize", 256)), "quant_group_size": 64,
            "linear_dtype": _conf_value(conf, "linear_dtype", "int4")}


def _w4a8_options(conf: dict) -> dict:
    return {"group_size": int(_conf_value(conf, "group_size", 16)),
            "convrot_groupsize": int(_conf_value(conf, "convrot_groupsize", 256))}


def _awq_options(conf: dict) -> dict:
    return {"group_size": int(conf.get("group_size", 64))}


def _two_per_byte(shape, scale_shape, options) -> int:
    return shape[1] * 2


def _w4a8_in_features(shape, scale_shape, options) -> int:
    """One group scale per `group_size` inputs (the packed row width holds 4 or 6 bits per input)."""
    return scale_shape[1] * options["group_size"]


FORMATS = {f.name: f for f in (
    Format("float8_e4m3fn", "TensorCoreFP8Layout", "fp8 e4m3fn", {"scale": ("weight_scale", None)}),
    Format("float8_e5m2", "TensorCoreFP8Layout", "fp8 e5m2", {"scale": ("weight_scale", None)}),
    Format("nvfp4", "TensorCoreNVFP4Layout", "nvfp4",
           {"scale": ("weight_scale_2", None), "block_scale": ("weight_scale", "float8_e4m3fn")},
           packed_in=_two_per_byte),
    Format("mxfp8", "TensorCoreMXFP8Layout", "mxfp8", {"scale": ("weight_scale", "float8_e8m0fnu")}),
    Format("int8_tensorwise", "TensorWiseINT8Layout", "int8", {"scale": ("weight_scale", None)}, _int8_options),
    Format("convrot_w4a4", "TensorCoreConvRotW4A4Layout", "int4 ConvRot (W4A4)", {"scale": ("weight_scale", None)},
           _convrot_w4a4_options, _two_per_byte),
    Format("asym_w4a8_int8", "AsymW4A8Int8Layout", "int4 W4A8",
           {"scale": ("weight_s_rel", "float8_e4m3fn"), "s_channel": ("weight_s_channel", None),
            "codebook": ("weight_codebook", None)}, _w4a8_options, _w4a8_in_features),
    Format("awq_w4a16", "TensorCoreAWQW4A16Layout", "int4 AWQ (W4A16)",
           {"scale": ("weight_scale", None), "zeros": ("weight_zeros", None)}, _awq_options, _two_per_byte),
)}
# The legacy scaled fp8 form reads as per-tensor fp8 with its `.scale_weight`.
LEGACY_FP8 = Format(SCALED_FP8_MARKER, "TensorCoreFP8Layout", "scaled fp8", {"scale": ("scale_weight", None)})
# Tensors a quantized layer may carry beside its weight that no Params field takes: the activation scale (only
# for quantized matmuls) and ComfyUI's per-layer markers.
LAYER_EXTRAS = ("input_scale", "scale_input", "comfy_quant", "pre_quant_scale")


def _suffixes(fmt: Format) -> tuple[str, ...]:
    return tuple(suffix for suffix, _ in fmt.tensors.values())


# -------------------------------------------------------------------------------------- the header
@dataclasses.dataclass(frozen=True)
class LayerFormat:
    """One quantized layer as the header tells it: its format (FORMATS or LEGACY_FP8), its JSON config, whether
    it has an AWQ pre_quant_scale, and the weight's [out, in] shape (packed formats store fewer columns)."""

    format: Format
    conf: dict
    awq: bool
    shape: tuple

    @property
    def words(self) -> str:
        convrot = self.format.name == "int8_tensorwise" and _int8_options(self.conf)
        return ("int8 ConvRot" if convrot else self.format.words) + (" AWQ" if self.awq else "")


@dataclasses.dataclass(frozen=True)
class FileQuantization:
    """The quantized layers of a file ({weight key: LayerFormat}), unknown formats ({weight key: format name}),
    how many other `.weight` tensors it has and their most common dtype, in words."""

    name: str
    layers: dict
    unknown: dict
    plain_layers: int
    plain_words: str

    def words(self) -> str:
        """e.g. "int8 ConvRot (24 layers), int8 (3 layers), the rest bf16"; the dtype alone when unquantized."""
        counts = collections.Counter(layer.words for layer in self.layers.values())
        counts.update(f"'{fmt}'" for fmt in self.unknown.values())
        parts = [f"{words} ({n} layer{'s' if n != 1 else ''})" for words, n in counts.most_common()]
        if not parts:
            return self.plain_words
        return ", ".join(parts + ([f"the rest {self.plain_words}"] if self.plain_layers else []))

    def refuse_unreadable(self, model_words: str = "", supported: str = "") -> None:
        """A clear UserInputError for a format ComfyUI's own list lacks or the installed comfy-kitchen cannot
        dequantize, naming the file (and the model it holds: `model_words`), the format, what is supported and
        what to pick instead."""
        what = f"'{self.name}' is {model_words + ', ' if model_words else ''}quantized as"
        also = f" Supported are {supported}." if supported else ""
        if self.unknown:
            formats = ", ".join(f"'{f}'" for f in sorted(set(self.unknown.values())))
            raise UserInputError(f"{what} {formats} ({len(self.unknown)} layers, e.g. {next(iter(self.unknown))}), "
                                 f"a format ComfyUI's comfy-kitchen does not know.{also} {PICK_INSTEAD}.")
        missing = sorted({layer.format.name for layer in self.layers.values() if not _layout_installed(layer.format)})
        if missing:
            raise UserInputError(f"{what} {', '.join(missing)}, which the installed comfy-kitchen "
                                 f"{_kitchen_version()} cannot read (it lacks "
                                 f"{', '.join(sorted({FORMATS[m].layout for m in missing}))}).{also} {PICK_INSTEAD}, "
                                 "or update comfy-kitchen (`pip install -U comfy-kitchen`).")


@functools.lru_cache(maxsize=1)
def _kitchen_version() -> str:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("comfy-kitchen")
    except PackageNotFoundError:
        return "(not installed)"


def _layout_installed(fmt: Format) -> bool:
    try:
        from comfy_kitchen.tensor import get_layout_class

        get_layout_class(fmt.layout)
    except (ImportError, KeyError):
        return False
    return True


def _layer_config(conf) -> dict:
    return conf if isinstance(conf, dict) else {"format": conf}


def _read_configs(f, keys) -> dict[str, dict]:
    """{layer: JSON config} from `<layer>.comfy_quant` uint8 tensors (a few bytes each) and the
    `_quantization_metadata` header entry."""
    configs = {}
    meta = (f.metadata() or {}).get("_quantization_metadata")
    if meta:
        for layer, conf in json.loads(meta).get("layers", {}).items():
            configs[layer] = _layer_config(conf)
    for k in keys:
        if k.endswith(".comfy_quant"):
            configs[k[: -len(".comfy_quant")]] = _layer_config(json.loads(bytes(f.get_tensor(k).tolist()).decode()))
    return configs


def _from_header(name: str, f) -> FileQuantization:
    keys = set(f.keys())
    configs = _read_configs(f, keys)
    legacy = any(k.split(".")[-1] == SCALED_FP8_MARKER for k in keys)
    layers, unknown = {}, {}
    for layer, conf in configs.items():
        if f"{layer}.weight" not in keys:
            continue
        fmt = FORMATS.get(conf.get("format"))
        if fmt is None:
            unknown[f"{layer}.weight"] = str(conf.get("format"))
        else:
            layers[f"{layer}.weight"] = _layer_format(f, keys, f"{layer}.weight", fmt, conf)
    for k in keys:  # scaled fp8 without a per-layer config: the older form, or a `.weight_scale` beside fp8 data
        layer = k[: -len(".weight")] if k.endswith(".weight") else None
        if layer is None or k in layers or k in unknown:
            continue
        dtype = f.get_slice(k).get_dtype()
        if legacy and f"{layer}{LEGACY_SCALE}" in keys:
            layers[k] = _layer_format(f, keys, k, LEGACY_FP8, {})
        elif f"{layer}.weight_scale" in keys and dtype in ("F8_E4M3", "F8_E5M2"):
            layers[k] = _layer_format(f, keys, k, FORMATS["float8_e4m3fn" if dtype == "F8_E4M3" else "float8_e5m2"], {})
    plain = collections.Counter(f.get_slice(k).get_dtype() for k in keys
                                if k.endswith(".weight") and k not in layers and k not in unknown)
    plain_words = DTYPE_WORDS.get(plain.most_common(1)[0][0], plain.most_common(1)[0][0].lower()) if plain else ""
    return FileQuantization(name, layers, unknown, sum(plain.values()), plain_words)


def _layer_format(f, keys, key: str, fmt: Format, conf: dict) -> LayerFormat:
    base = key[: -len("weight")]
    shape = tuple(f.get_slice(key).get_shape())
    if fmt.packed_in is not None and len(shape) == 2:
        scale_key = base + fmt.tensors["scale"][0]
        scale_shape = tuple(f.get_slice(scale_key).get_shape()) if scale_key in keys else ()
        shape = (shape[0], fmt.packed_in(shape, scale_shape, fmt.options(conf) if fmt.options else {}))
    return LayerFormat(fmt, conf, f"{base}pre_quant_scale" in keys, shape)


@functools.lru_cache(maxsize=64)
def _cached(path: str, size: int, mtime: int) -> FileQuantization:
    from safetensors import SafetensorError, safe_open

    try:
        with safe_open(path, "pt") as f:
            return _from_header(os.path.basename(path), f)
    except (SafetensorError, OSError, ValueError) as e:
        raise ModelLoadError(f"weights file '{os.path.basename(path)}' is truncated or corrupt ({e}); "
                             "re-download it.") from e


def file_quantization(path: str) -> FileQuantization:
    """The formats of a safetensors file's layers, from its header and the tiny `.comfy_quant` tensors only
    (never weight data); read once per file version (path, size, modification time)."""
    stat = os.stat(path)
    return _cached(path, stat.st_size, stat.st_mtime_ns)


def format_words(path: str) -> str:
    """A short description of a file's weight format for a node's status, e.g. "int8 ConvRot (24 layers),
    the rest bf16"."""
    return file_quantization(path).words()


# ------------------------------------------------------------------------------------- the weights
def quantized_layers(path: str, only: tuple[str, ...] = ()) -> dict[str, QuantizedWeight]:
    """Every quantized layer of a file (those whose keys start with `only`, when given), keyed by its weight key (e.g.
    'double_blocks.0.img_attn.qkv.weight'), reading only those layers' tensors. Refuses a format that cannot be read
    (`refuse_unreadable`)."""
    from safetensors import safe_open

    quantization = file_quantization(path)
    quantization.refuse_unreadable()
    with safe_open(path, "pt") as f:
        return {key: _weight(quantization.name, f, key, layer) for key, layer in quantization.layers.items()
                if key.startswith(only or "")}


def _weight(name: str, f, key: str, layer: LayerFormat) -> QuantizedWeight:
    """One layer's QuantizedWeight: its tensors as the layout's Params, as comfy/ops.py builds them."""
    import torch

    fmt, base = layer.format, key[: -len("weight")]
    keys = set(f.keys())
    tensors = {}
    for field, (suffix, view) in fmt.tensors.items():
        if base + suffix in keys:
            tensor = f.get_tensor(base + suffix)
            tensors[field] = tensor.view(getattr(torch, view)) if view and tensor.dtype == torch.uint8 else tensor
        elif field == "scale":
            raise ModelLoadError(f"'{name}' marks '{key}' as {fmt.name} but has no '{base + suffix}'; re-download it.")
    from comfy_kitchen.tensor import get_layout_class

    options = fmt.options(layer.conf) if fmt.options else {}
    params = get_layout_class(fmt.layout).Params(**tensors, **options, orig_dtype=torch.float32,
                                                 orig_shape=layer.shape)
    pre_quant = f.get_tensor(base + "pre_quant_scale") if layer.awq else None
    return QuantizedWeight(fmt.name, fmt.layout, f.get_tensor(key), params, pre_quant)


def dropped_keys(quantization: FileQuantization) -> set[str]:
    """The keys a dequantized state dict leaves out: each quantized layer's scales and markers, and the legacy
    fp8 marker."""
    out = set()
    for key, layer in quantization.layers.items():
        base = key[: -len("weight")]
        out.update(base + s for s in (*_suffixes(layer.format), *LAYER_EXTRAS))
    return out
