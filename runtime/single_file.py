"""Load pipeline components from ComfyUI-style single weight files.

ComfyUI users keep models as single files: a diffusion model (`models/diffusion_models`, legacy `unet`),
text encoders (`models/text_encoders`, legacy `clip`), a VAE (`models/vae`) or an all-in-one checkpoint
(`models/checkpoints`). Weights come from those files; configs, tokenizers and the scheduler come from a
diffusers folder (or hub repo) of the same family, `config_folder`. Transformers, UNets and VAEs are converted
by diffusers' own single-file converters (BFL, Comfy-Org and Stability layouts); text encoders are in
transformers' key layout and load with transformers' own classes, except a kind whose files keep another
layout (an OpenCLIP text tower), which its FileKind converts with diffusers' converter first.

Everything a user can get wrong is checked from the safetensors header alone (`family_of_file`,
`check_file_for_slot`), so the Loader node can refuse a wrong file at queue time without reading tensors.
"""

from __future__ import annotations

import os
import re

from . import quant_formats
from .errors import ModelLoadError, UserInputError
from .families import (FAMILIES, FILE_KINDS, UNSUPPORTED_MODEL_TYPES, Family, FileKind, FileVariant, family_for,
                       supported)
from .model_folder import index_path
from .sources import check_hub_id, config_values, read_model_index
from .specs import QuantizedWeights

SUPPORTED_FORMATS = ("safetensors in bf16/fp16/fp32, or quantized as ComfyUI writes it (read through comfy-kitchen): "
                     "fp8 (e4m3fn/e5m2, scaled or not), int8 (also with ConvRot), nvfp4 (also AWQ), mxfp8, int4 "
                     "ConvRot W4A4, int4 W4A8 and AWQ W4A16; see docs/model_files.md")

# Key fragments that only bitsandbytes (NF4/FP4/int8) quantized files carry.
BNB_MARKERS = (".absmax", ".quant_map", ".nested_absmax", ".nested_quant_map", "quant_state", ".SCB")

# What a file is (families.FILE_KINDS: each kind's identifying keys, in detection order) and which kind each
# component of each family takes (Family.denoiser_kind, Family.file_slots) live in the family modules.
# ComfyUI/Stability all-in-one checkpoints keep the denoiser and the VAE under these prefixes, the text
# encoders under each family's FileSlot.checkpoint_prefix.
DENOISER_PREFIX = "model.diffusion_model."
VAE_PREFIXES = ("first_stage_model.", "vae.")

# The small files of a diffusers repo that a single-file load needs: configs, tokenizers, scheduler.
CONFIG_PATTERNS = ["*.json", "*.txt", "*.model", "*.tiktoken", "*.jinja", "tokenizer*", "*/tokenizer*"]

# Keys a text-encoder file may carry that the transformers class does not keep (buffers, CLIP's logit scale,
# a projection CLIPTextModel has no use for), and parts a text-to-image pipeline never runs, so a file
# without them (ComfyUI's text-only files of multimodal encoders) still loads. Everything else must match exactly.
IGNORED_UNEXPECTED = ("position_ids", "logit_scale", "text_projection.weight",
                      "spiece_model")  # ComfyUI's UMT5 files carry their SentencePiece tokenizer as a tensor
UNUSED_PARTS = ("vision_tower.", "multi_modal_projector.", "visual.", "lm_head.", "embed_vision.", "embed_audio.")
# what an image-input task would run
VISION_PARTS = ("vision_tower.", "multi_modal_projector.", "visual.", "embed_vision.")
# Components whose presence in model_index.json means the pipeline feeds images to its text encoder, so its
# vision tower runs (an edit pipeline with a vision-language processor).
IMAGE_TO_TEXT_ENCODER = ("processor",)


# -------------------------------------------------------------------------------------------- reading
def _is_gguf(path: str) -> bool:
    if path.lower().endswith(".gguf"):
        return True
    try:
        with open(path, "rb") as f:
            return f.read(4) == b"GGUF"
    except OSError:
        return False


def _open(path: str):
    """safe_open with the errors a user can act on: wrong format, missing, truncated or corrupt."""
    from safetensors import SafetensorError, safe_open

    name = os.path.basename(path)
    if _is_gguf(path):
        raise UserInputError(f"'{name}' is a GGUF file, which TPU Diffusers does not support; supported are "
                             f"{SUPPORTED_FORMATS}. Pick the safetensors version of this model.")
    if not os.path.isfile(path):
        raise UserInputError(f"weights file '{path}' does not exist; pick another file.")
    if not path.lower().endswith((".safetensors", ".sft")):
        raise UserInputError(f"'{name}' is not a .safetensors file; only safetensors weights are loaded (other "
                             "formats can run code when read). Pick the .safetensors version of this model.")
    try:
        return safe_open(path, "pt")
    except (SafetensorError, OSError, ValueError) as e:
        raise ModelLoadError(f"weights file '{name}' is truncated or corrupt ({e}); re-download it.") from e


def _refuse_quantized(path: str, keys) -> None:
    """Quantizations TPU Diffusers cannot read, from the header (and ComfyUI's tiny comfy_quant tensors): a
    format comfy-kitchen lacks, or bitsandbytes."""
    quantization = quant_formats.file_quantization(path)
    quantization.refuse_unreadable(_model_words(keys), f"{SUPPORTED_FORMATS}, for {supported()}")
    bad = next((k for k in keys if any(m in k for m in BNB_MARKERS)), None)
    if bad is not None:
        raise UserInputError(f"'{os.path.basename(path)}' is quantized with bitsandbytes (NF4/int8: it has '{bad}'), "
                             f"which TPU Diffusers does not support; supported are {SUPPORTED_FORMATS}. "
                             f"{quant_formats.PICK_INSTEAD}.")


def _model_words(keys) -> str:
    """What model a quantized file holds, for the refusal: a kind TPU Diffusers knows, else a diffusion model
    diffusers knows of a family TPU Diffusers lacks; "" when neither."""
    from diffusers.loaders.single_file_utils import CHECKPOINT_KEY_NAMES

    keys = set(keys)
    prefix = DENOISER_PREFIX if any(k.startswith(DENOISER_PREFIX) for k in keys) else ""
    kind = next((kind for kind in FILE_KINDS if any(prefix + k in keys for k in kind.keys())), None)
    if kind is not None:
        return kind.words
    for model_type, words in UNSUPPORTED_MODEL_TYPES.items():
        names = CHECKPOINT_KEY_NAMES.get(model_type, ())
        if any(k in keys for k in ([names] if isinstance(names, str) else names)):
            return f"{words}, which TPU Diffusers does not run yet"
    return ""


def read_weights(path: str, dtype, quantized: dict | None = None, only: tuple[str, ...] = ()) -> dict:
    """All tensors of a .safetensors file as `dtype` (those whose keys start with `only`, when given), read tensor by
    tensor; `quantized`, when given, is filled with the file's quantized layers as stored ({key: QuantizedWeight}),
    so keeping them needs no second read.

    fp8 tensors are upcast. Every quantized layer ComfyUI writes (a `<layer>.comfy_quant` config or the
    `_quantization_metadata` header entry: fp8 with `weight_scale`, int8 with or without ConvRot, nvfp4, mxfp8,
    the int4 formats, AWQ's `pre_quant_scale`; and the older scaled fp8, a `scaled_fp8` marker with
    `<layer>.scale_weight`) is dequantized by comfy-kitchen's layout (quant_formats.QuantizedWeight), and its
    scale and marker keys dropped. Other quantizations (GGUF, bitsandbytes NF4, a format comfy-kitchen lacks) are
    refused with a message saying what is supported.
    """
    from safetensors import SafetensorError

    name = os.path.basename(path)
    with _open(path) as f:
        keys = list(f.keys())
        _refuse_quantized(path, keys)
        dropped = quant_formats.dropped_keys(quant_formats.file_quantization(path))
        out = {}
        try:
            layers = quant_formats.quantized_layers(path, only)
            if quantized is not None:
                quantized.update(layers)
            for k in keys:
                if k in dropped or k.split(".")[-1] == quant_formats.SCALED_FP8_MARKER or not k.startswith(only or ""):
                    continue  # also a checkpoint's "model.diffusion_model.scaled_fp8"
                tensor = _dequantized(name, k, layers[k], dtype) if k in layers else f.get_tensor(k)
                out[k] = tensor.to(dtype) if tensor.is_floating_point() else tensor
        except SafetensorError as e:
            raise ModelLoadError(f"weights file '{name}' is truncated or corrupt ({e}); re-download it.") from e
    return out


def _dequantized(name: str, key: str, weight: quant_formats.QuantizedWeight, dtype):
    """One quantized layer's weight; a layer whose tensors do not fit its format is a broken file."""
    try:
        return weight.dequantize(dtype)
    except (RuntimeError, ValueError, TypeError) as e:
        raise ModelLoadError(f"'{name}' marks '{key}' as {weight.format} but its tensors do not fit that format "
                             f"({type(e).__name__}: {e}); re-download it.") from e


# ---------------------------------------------------------------------------------- header-only checks
class HeaderView:
    """The keys and shapes of a safetensors file, read from its header only (a quantized layer's weight with its
    [out, in] shape, not its packed one). Quacks like a state dict
    enough for diffusers' `infer_diffusers_model_type` (`in`, iteration, `[key].shape`)."""

    class _Shape:
        def __init__(self, shape):
            self.shape = tuple(shape)

    def __init__(self, path: str):
        self.path = path
        self.name = os.path.basename(path)
        with _open(path) as f:
            self._keys = list(f.keys())
            _refuse_quantized(path, self._keys)
            packed = {k: layer.shape for k, layer in quant_formats.file_quantization(path).layers.items()}
            self._shapes = {k: packed.get(k) or f.get_slice(k).get_shape() for k in self._keys}

    def __contains__(self, key):
        return key in self._shapes

    def __iter__(self):
        return iter(self._keys)

    def keys(self):
        return list(self._keys)

    def __getitem__(self, key):
        return self._Shape(self._shapes[key])

    def get(self, key, default=None):
        return self[key] if key in self else default


def _header(path) -> HeaderView:
    return path if isinstance(path, HeaderView) else HeaderView(path)


def _kind(header: HeaderView, prefix: str = "") -> FileKind | None:
    for kind in FILE_KINDS:
        if any(prefix + k in header for k in kind.keys()) and (
                not kind.widths or _width(header, kind, prefix) in kind.widths):
            return kind
    return None


def _width(header: HeaderView, kind: FileKind, prefix: str = "") -> int | None:
    """The input width (last dimension) of the tensor `kind.width_keys` names, or None if the file has none."""
    key = next((prefix + k for k in kind.width_keys if prefix + k in header), None)
    return header[key].shape[-1] if key else None


def _denoiser_prefix(header: HeaderView) -> str:
    return DENOISER_PREFIX if any(k.startswith(DENOISER_PREFIX) for k in header) else ""


def kind_of_file(path) -> FileKind | None:
    """The kind of a file of one component (no checkpoint prefix), or None when no kind's keys are in it."""
    return _kind(_header(path))


def _words(kind: FileKind | None) -> str:
    return kind.words if kind else "no model TPU Diffusers recognises"


def family_of_file(path) -> Family:
    """The family a diffusion-model or all-in-one checkpoint file belongs to."""
    header = _header(path)
    kind = _kind(header, _denoiser_prefix(header))
    family = next((f for f in FAMILIES if f.denoiser_kind == kind), None)
    if family is None:
        what = f"it is {(kind.words if kind else _model_words(header)) or 'no diffusion model TPU Diffusers knows'}"
        raise UserInputError(f"'{header.name}' is not a diffusion model of a supported family ({what}). "
                             f"Supported: {supported()}.")
    return family


def model_class_of(path) -> str:
    """The model class a diffusion-model file loads as: the variant its name or keys tell (its family's
    `file_variants`), else its family's base model (text to image)."""
    header = _header(path)
    family = family_of_file(header)
    variant = _variant(header, family)
    return variant.model_class if variant else family.base_class


def variant_of(path) -> FileVariant | None:
    """The file variant of its family a diffusion-model file is (`Family.file_variants`), or None."""
    header = _header(path)
    return _variant(header, family_of_file(header))


def settings_of(path) -> dict:
    """The model_index settings a diffusion-model file's variant is (`FileVariant.settings`): its
    family's facts for it are `family_for(model_class, settings=...)`'s."""
    variant = variant_of(path)
    return dict(variant.settings) if variant else {}


def _variant(header: HeaderView, family: Family):
    """The file variant of `family` a diffusion-model file is (by its name, model type and width), or None."""
    width = _width(header, family.denoiser_kind, _denoiser_prefix(header))
    return family.variant_of_file(header.name, _model_type(header), width)


def _model_type(header: HeaderView) -> str | None:
    """diffusers' own name for the model a file holds (e.g. a key of `Family.diffusers_model_types`), or None."""
    from diffusers.loaders.single_file_utils import infer_diffusers_model_type

    try:
        return infer_diffusers_model_type(header)
    except (KeyError, ValueError, AttributeError, TypeError):
        return None


def components_in_checkpoint(path, family: Family | None = None) -> dict[str, str]:
    """{component: key prefix} of the parts an all-in-one checkpoint carries (the denoiser, vae, text
    encoders); empty for a file of one component without prefixes."""
    header = _header(path)
    keys = header.keys()
    found = {}
    if any(k.startswith(DENOISER_PREFIX) for k in keys):
        family = family or family_of_file(header)
        found[family.denoiser] = DENOISER_PREFIX
    vae = next((p for p in VAE_PREFIXES if any(k.startswith(p) for k in keys)), None)
    if vae:
        found["vae"] = vae
    for slot in family.file_slots if family else ():
        if slot.checkpoint_prefix and any(k.startswith(slot.checkpoint_prefix) for k in keys):
            found[slot.component] = slot.checkpoint_prefix
    return found


def slot_kind(family: Family, component: str, variant: FileVariant | None = None) -> FileKind:
    """The kind of file `component` of `family` takes (with a diffusion model of file `variant`, its own kind where it
    names one); refused for a component no file can fill."""
    if component == family.denoiser:
        return family.denoiser_kind
    if variant is not None and component in variant.slot_kinds:
        return variant.slot_kinds[component]
    slot = family.slot(component)
    if slot is None:
        raise UserInputError(f"{family.name} has no '{component}' to load from a file; it takes "
                             f"{', '.join([family.denoiser, *(s.component for s in family.file_slots)])}.")
    return slot.kind


def check_file_for_slot(path, component: str, model_class: str, settings: dict | None = None,
                        model_file=None) -> str:
    """Refuse a file that cannot fill `component` of a `model_class` pipeline (with these model_index
    `settings`: they can change a slot's kind; beside the diffusion model `model_file`, whose variant can too) (a text
    encoder in the VAE slot, a T5 where CLIP goes, a diffusion model of another family, a truncated file); returns
    the key prefix of that component inside the file ('' unless it is an all-in-one checkpoint). A file of the
    component that also carries another's weights (a text encoder with the text projection beside it) is the
    component's at its top level."""
    header = _header(path)
    family = family_for(model_class, settings=settings)
    variant = variant_of(model_file) if model_file else None
    want = slot_kind(family, component, variant)
    parts = components_in_checkpoint(header, family)
    prefix = parts.get(component, "")
    got = _kind(header, prefix)
    if carries_latent_decoder(family, component, header):
        return prefix
    if got != want and parts and component not in parts:
        raise UserInputError(f"'{header.name}' is a checkpoint without a {component} ({want.words}); it carries "
                             f"{', '.join(parts)}. Pick a separate {want.words} file for {component}.")
    if got != want:
        named = f" ({variant.comfy_files[component]})" if variant and component in variant.comfy_files else ""
        raise UserInputError(f"'{header.name}' is {_words(got)}, but {component} of {family.name} needs "
                             f"{want.words}. Pick the right file for {component}{named}.")
    return prefix


def carries_latent_decoder(family: Family, component: str, path) -> bool:
    """Whether the file at `path` (or its header) fills `component` with the family's latent decoder beside it (a VAE
    file that also carries the decoder that replaces the VAE's)."""
    decoder = family.latent_decoder
    return decoder is not None and component == decoder.slot and _kind(_header(path)) is decoder.file_kind


def load_latent_decoder(family: Family, path: str, config_folder: str, dtype):
    """The family's latent decoder from `path`, the file picked for its slot, where that file carries it (else None):
    its config from the configs folder's decoder folder where it has one, else the decoder class's defaults."""
    import diffusers
    from accelerate import init_empty_weights

    decoder = family.latent_decoder
    if not carries_latent_decoder(family, decoder.slot, path):
        return None
    cls = getattr(diffusers, decoder.model_class)
    has_config = os.path.isfile(os.path.join(config_folder, decoder.component, "config.json"))
    config = cls.load_config(config_folder, subfolder=decoder.component) if has_config else {}
    with init_empty_weights():
        model = cls.from_config(config)
    try:
        # only the decoder's part of the file (the VAE's load read the file already)
        weights = read_weights(path, dtype, only=decoder.file_prefixes)
        model.load_state_dict(decoder.from_file(weights), strict=True, assign=True)
    except (RuntimeError, KeyError) as e:
        raise ModelLoadError(f"'{os.path.basename(path)}' is not {decoder.file_kind.words} as "
                             f"{decoder.model_class}'s config describes it ({type(e).__name__}: {e}).") from e
    return _to_dtype(model, dtype).eval().requires_grad_(False)


def default_config_repo(path) -> str:
    """Where configs and tokenizers for the model a file holds come from: its variant's repo
    (`FileVariant.config_repo`), else diffusers' own default repo (DIFFUSERS_DEFAULT_PIPELINE_PATHS), else the
    family's main repo when diffusers cannot tell."""
    from diffusers.loaders.single_file_utils import DIFFUSERS_DEFAULT_PIPELINE_PATHS

    header = _header(path)
    family = family_of_file(header)
    model_type = _model_type(header)
    variant = _variant(header, family)
    if variant:
        return variant.config_repo
    if model_type in family.diffusers_model_types:
        return DIFFUSERS_DEFAULT_PIPELINE_PATHS[model_type]["pretrained_model_name_or_path"]
    return family.default_config_repo


# ------------------------------------------------------------------------------------- config folder
def config_folder(source: str) -> str:
    """Where configs, tokenizers and the scheduler come from: a local folder as is; for a hub id only its
    small files, downloaded (or found in the local Hugging Face cache when offline)."""
    if os.path.isabs(source):
        if index_path(source) is None:
            raise UserInputError(f"'{source}' is not a diffusers folder (it has no model_index.json or "
                                 "modular_model_index.json) to take "
                                 "configs and tokenizers from.")
        return source
    check_hub_id(source)
    from huggingface_hub import snapshot_download
    from huggingface_hub.errors import HfHubHTTPError, LocalEntryNotFoundError, OfflineModeIsEnabled

    try:
        return snapshot_download(source, allow_patterns=CONFIG_PATTERNS)
    except OSError as e:
        if not isinstance(e, (LocalEntryNotFoundError, OfflineModeIsEnabled, HfHubHTTPError, ConnectionError,
                              TimeoutError)):  # disk full, permission denied: the cache folder is the problem
            raise ModelLoadError(f"the configs and tokenizers of '{source}' could not be stored in the Hugging Face "
                                 f"cache ({type(e).__name__}: {e}); free disk space or fix the cache folder's "
                                 "permissions (HF_HOME), then queue again.") from e
        name = source.split("/")[-1]
        raise UserInputError(
            f"the configs and tokenizers of '{source}' are not in the local Hugging Face cache and cannot be "
            f"downloaded here ({type(e).__name__}). Fetch just those small files where there is network: "
            f"`hf download {source} --exclude \"*.safetensors\" \"*.bin\" \"*.pth\" "
            f"--local-dir ComfyUI/models/diffusers/{name}` (gated repos need `hf auth login` first), then pick "
            f"that folder as the config source.") from e


# ----------------------------------------------------------------------------------------- loading
def _converter(cls, kind: FileKind | None):
    """diffusers' single-file converter for `cls`, else the file kind's own for a class diffusers' do not take."""
    from diffusers.loaders.single_file_model import (SINGLE_FILE_LOADABLE_CLASSES,
                                                     _get_single_file_loadable_mapping_class)

    mapping_class = _get_single_file_loadable_mapping_class(cls)
    if mapping_class is not None:
        return SINGLE_FILE_LOADABLE_CLASSES[mapping_class]["checkpoint_mapping_fn"]
    if kind is not None and kind.converter is not None:
        return kind.converter
    raise UserInputError(f"{cls.__name__} cannot be loaded from a single file; use a diffusers folder for it.")


def _load_diffusers(name, cls, weights, folder, dtype, kind: FileKind | None = None):
    """Convert with diffusers' converter (or the kind's own, for a layout diffusers' converters do not read),
    compare the keys with the model's (diffusers itself only logs unused keys and leaves missing ones unset),
    then load with from_single_file, which takes the converted state dict as it is."""
    from accelerate import init_empty_weights

    config = cls.load_config(folder, subfolder=name, local_files_only=True)
    lacks = kind.lacks if kind is not None else ()
    form = kind.form_of(weights) if kind is not None else None  # another form of the model (ModelForm)

    def empty_model():
        if form is not None:
            return form.empty_model(cls, config, weights)
        with init_empty_weights():
            model = cls.from_config(config)
        for part in lacks:  # not in the file: left out of the model, never random weights
            setattr(model, part, None)
        return model

    expected = set(empty_model().state_dict())
    prefix = kind.converter_prefix if kind is not None else ""
    given = {prefix + k: v for k, v in weights.items()}  # a copy: converters pop what they use
    own = kind is not None and kind.to_diffusers is not None and kind.keys()[0] in weights
    if set(weights) == expected:
        state = weights
    elif form is not None:
        state = form.to_diffusers(given, config)
    else:
        state = kind.to_diffusers(weights) if own else _converter(cls, kind)(checkpoint=given, config=config)
    missing = sorted(expected - set(state))
    unexpected = sorted(set(state) - expected)
    if kind is not None and kind.converter_pops_used and state is not weights:
        unexpected += sorted(given)  # what its converter left behind
    if missing or unexpected:
        return None, missing, unexpected, [], []
    if own or lacks or form is not None or not _single_file_loadable(cls):
        model = empty_model()
        model.load_state_dict(state, strict=True, assign=True)
    else:
        model = cls.from_single_file(state, config=folder, subfolder=name, local_files_only=True)
    return _to_dtype(model, dtype), [], [], [], []


def _single_file_loadable(cls) -> bool:
    """diffusers maps a converter to the class and the class has from_single_file (a class can have a converter in
    diffusers 0.42.1 but not FromOriginalModelMixin: its converted state dict is loaded as it is)."""
    from diffusers.loaders.single_file_model import _get_single_file_loadable_mapping_class

    return _get_single_file_loadable_mapping_class(cls) is not None and hasattr(cls, "from_single_file")


def _to_dtype(model, dtype):
    """The model in `dtype`, but for the modules its class keeps in float32 (`_keep_in_fp32_modules`: e.g. a time
    embedder, norms and modulation), which stay float32 as `from_pretrained` keeps them for a folder's model."""
    import torch

    model.to(dtype)
    keep = model._keep_in_fp32_modules or []
    for name, tensor in [*model.named_parameters(), *model.named_buffers()]:
        if tensor.is_floating_point() and any(part in name.split(".") for part in keep):
            tensor.data = tensor.data.to(torch.float32)
    return model


# a decoder layer's keys in a text encoder's state dict (transformers' and ComfyUI's names; not a vision tower's blocks)
DECODER_LAYER = re.compile(r"^(?:model\.)?(?:language_model\.)?(?:model\.)?layers\.(\d+)\.")


def decoder_layers(keys) -> int:
    """How many decoder layers a text encoder's keys hold (its highest layer index + 1; 0 for none)."""
    found = [int(m.group(1)) for m in map(DECODER_LAYER.match, keys) if m]
    return max(found) + 1 if found else 0


def check_layers_read(keys, file: str, component: str, family: Family) -> None:
    """Refuse a text encoder file with fewer decoder layers than its pipeline reads (`FileSlot.layers_read`)."""
    slot = family.slot(component)
    held = decoder_layers(keys)
    if slot is not None and slot.layers_read and held < slot.layers_read:
        raise UserInputError(f"'{file}' holds {held} decoder layers, but {family.name} reads the hidden states after "
                             f"layer {slot.layers_read} of its {component}: it is {slot.kind.words} of another model. "
                             f"Pick ComfyUI's {slot.comfy_file} (or another with at least {slot.layers_read} layers).")


def _cut_text_model(model, config_layers: int, held: int, missing: list[str], name: str, file: str,
                    notes: list[str]) -> list[str]:
    """A text encoder built with only the decoder layers its file holds (`held`, fewer than its config's
    `config_layers`; at least the slot's `layers_read`), for a pipeline that reads the hidden states after a layer the
    file has (a file cut right after the layer its pipeline reads: `FileSlot.layers_read`). The layers past the file's
    are not in the model at all, so nothing runs random weights; the config keeps `config_layers` (the model the file
    was cut from: what diffusers' blocks check before they read a layer's output). Its hidden states are each layer's
    raw output (`tie_last_hidden_states` off: else transformers puts the normed output in the last one), so
    hidden_states[i] is the full model's for every i <= held. A final norm the file lacks becomes an identity (such a
    file's conditioning is its last layer's output, unnormed), so the model's `last_hidden_state` is then the last
    layer's output, not the full model's: no pipeline reading such a slot uses it. Returns the missing keys left to
    refuse."""
    import torch

    text = next(module for module in model.modules()
                if isinstance(getattr(module, "layers", None), torch.nn.ModuleList) and hasattr(module, "norm")
                and len(module.layers) == held)
    prefix = next(n for n, m in model.named_modules() if m is text)
    norm = f"{prefix}.norm.weight"
    if norm in missing:
        text.norm = torch.nn.Identity()
        missing = [k for k in missing if k != norm]
    text.config.tie_last_hidden_states = False
    getattr(model.config, "text_config", model.config).num_hidden_layers = config_layers
    notes.append(f"{name}: '{file}' holds the first {held} of its {config_layers} decoder layers"
                 f"{' and no final norm' if isinstance(text.norm, torch.nn.Identity) else ''}; the pipeline reads no "
                 f"layer past them, so the model keeps those {held} layers and runs no others.")
    return missing


def _load_transformers(name, cls, weights, folder, dtype, kind: FileKind | None = None, layers_read: int = 0,
                       file: str = "", notes: list[str] | None = None):
    old, new = kind.text_only_prefix if kind is not None and kind.text_only_prefix else (None, None)
    if old and any(k.startswith(old + "layers.") for k in weights):
        weights = {new + k[len(old):] if k.startswith(old) else k: v for k, v in weights.items()}
    config = cls.config_class.from_pretrained(os.path.join(folder, name))
    if kind is not None and kind.to_transformers and kind.keys()[0] in weights:  # a file in its original layout
        weights = kind.to_transformers(cls, config, weights)
    text_config = getattr(config, "text_config", config)
    config_layers, held = text_config.num_hidden_layers, decoder_layers(weights)
    cut = bool(layers_read) and layers_read <= held < config_layers
    if cut:  # built with the file's layers only (_cut_text_model)
        text_config.num_hidden_layers = held
    model, info = cls.from_pretrained(None, config=config, state_dict=weights, dtype=dtype, output_loading_info=True)
    missing = [k for k in info["missing_keys"] if not k.removeprefix("model.").startswith(UNUSED_PARTS)]
    if cut:
        missing = _cut_text_model(model, config_layers, held, missing, name, file, notes if notes is not None else [])
    unexpected = [k for k in info["unexpected_keys"] if not k.endswith(IGNORED_UNEXPECTED)]
    random_vision = [k for k in info["missing_keys"] if k.removeprefix("model.").startswith(VISION_PARTS)]
    return model, missing, unexpected, sorted(info["mismatched_keys"]), random_vision


def load_component(name: str, cls, path: str, config_folder: str, dtype, weights_cache: dict,
                   notes: list[str], quantized_weights: QuantizedWeights = QuantizedWeights.DEQUANTIZE,
                   model_file: str | None = None):
    """Load pipeline component `name` (class `cls`) with weights from the single file `path` and its config
    from `config_folder/<name>`. `weights_cache` ({path: (state dict, quantized layers kept)}) lets one read of
    an all-in-one checkpoint serve all its components; the caller drops it when the pipeline is built. What the run info
    should say about the file is appended to `notes`. `quantized_weights` (resolved, not auto): whether the
    file's int8/fp8 layers stay quantized in the model (runtime/resident_weights.py). `model_file`, the diffusion
    model's file, tells its variant (`FileVariant.slot_kinds`) and holds a slot's `checkpoint_also` weights that
    `path` lacks."""
    import torch

    index = read_model_index(config_folder, is_folder=True)
    model_class = index["_class_name"]
    settings = config_values(index)
    family = family_for(model_class, settings=settings)
    variant = variant_of(model_file) if model_file else None
    prefix = check_file_for_slot(path, name, model_class, settings, model_file)
    file = os.path.basename(path)
    runs_vision = cls.__module__.startswith("transformers") and any(
        (index.get(p) or [None])[0] for p in IMAGE_TO_TEXT_ENCODER)  # (an optional one may be [null, null])
    if runs_vision:  # refused from the header, before a 7B text encoder is read for nothing
        header = _header(path)
        if not any(k[len(prefix):].removeprefix("model.").startswith(VISION_PARTS)
                   for k in header if k.startswith(prefix)):
            _refuse_without_vision(name, file, model_class, family, "")
    if path not in weights_cache:  # (its tensors in dtype, its quantized layers as stored when they are kept)
        quantized = {}
        weights_cache[path] = (read_weights(path, dtype, quantized),
                               quantized if quantized_weights.keeps_quantized else {})
    weights, quantized = weights_cache[path]
    kept_whole = family.slot(name).checkpoint_also if family.slot(name) else ()  # (the denoiser has no slot)
    carried = tuple(components_in_checkpoint(path, family).values())  # other components' weights in the file
    if prefix:
        weights = {**{k: v for k, v in weights.items() if k.startswith(kept_whole)},
                   **{k[len(prefix):]: v for k, v in weights.items() if k.startswith(prefix)}}
    elif carried:
        weights = {k: v for k, v in weights.items() if not k.startswith(carried)}
        quantized = {k: v for k, v in quantized.items() if not k.startswith(carried)}
    if kept_whole and model_file and not any(k.startswith(kept_whole) for k in weights):
        weights = {**read_weights(model_file, dtype, only=kept_whole), **weights}
    kind = slot_kind(family, name, variant)
    if carries_latent_decoder(family, name, path):
        kind = family.latent_decoder.file_kind  # its own component's part of it, as that kind converts it
    want = kind.words
    check_layers_read(weights, file, name, family)
    try:
        if cls.__module__.startswith("transformers"):
            layers_read = family.slot(name).layers_read if family.slot(name) else 0
            model, missing, unexpected, mismatched, random_vision = _load_transformers(
                name, cls, weights, config_folder, dtype, kind, layers_read, file, notes)
        else:
            model, missing, unexpected, mismatched, random_vision = _load_diffusers(
                name, cls, weights, config_folder, dtype, kind)
    except (RuntimeError, ValueError, KeyError, IndexError) as e:  # shape mismatches, missing converter keys
        raise ModelLoadError(f"'{file}' is not {want} for {family.name} as "
                             f"'{os.path.basename(config_folder)}' describes it ({type(e).__name__}: {e}).") from e
    problems = [(what, keys) for what, keys in (("missing", missing), ("unexpected", unexpected),
                                                ("of another shape", mismatched)) if keys]
    if problems:
        detail = "; ".join(f"{len(keys)} {what} (e.g. {sorted(keys)[0]})" for what, keys in problems)
        raise ModelLoadError(f"'{file}' is not {want} for {family.name} as "
                             f"'{os.path.basename(config_folder)}' describes it: weights {detail}.")
    if random_vision and runs_vision:
        _refuse_without_vision(name, file, model_class, family,
                               f" ({len(random_vision)} vision tensors missing, e.g. {random_vision[0]})")
    if random_vision:
        notes.append(f"{name}: '{file}' has no vision weights ({len(random_vision)} tensors, e.g. "
                     f"{random_vision[0]}); text to image never runs them, so they stay random. Image-input "
                     "models need a text encoder file with its vision part.")
    if isinstance(model, torch.nn.Module):
        model.eval().requires_grad_(False)
        if quantized_weights.keeps_quantized and not kind.dequantized:
            _keep_quantized(name, model, prefix, weights, quantized, quantized_weights, notes)
    return model


def _keep_quantized(name: str, model, prefix: str, weights: dict, quantized: dict, choice: QuantizedWeights,
                    notes: list[str]) -> None:
    """The model's layers that are the file's int8/fp8 layers kept quantized; the run info says how many."""
    from . import resident_weights

    quantized = {k[len(prefix):]: w for k, w in quantized.items() if k.startswith(prefix)}
    if quantized:
        notes.append(resident_weights.apply(model, weights, quantized, choice).words(name))


def _refuse_without_vision(name: str, file: str, model_class: str, family: Family, detail: str):
    """A text encoder file without (all of) its vision tower, for a pipeline that runs it on the input images."""
    slot = family.slot(name)  # there is one: check_file_for_slot accepted the file for it
    raise ModelLoadError(f"'{file}' has no vision part{detail}, but {model_class} feeds the input images to the "
                         f"vision tower of its {name}, so this edit model needs it. Pick {slot.kind.words} file "
                         f"with its vision tower: ComfyUI's {slot.comfy_file} carries it.")


def meta_model(config_folder: str, component: str, library: str, cls_name: str):
    """Component `component` built from its config on the meta device: its layers and shapes, no weights."""
    import importlib

    import torch
    from accelerate import init_empty_weights

    cls = getattr(importlib.import_module(library), cls_name)
    if library == "diffusers":
        with init_empty_weights():
            return cls.from_config(cls.load_config(config_folder, subfolder=component))
    with torch.device("meta"):
        return cls(cls.config_class.from_pretrained(os.path.join(config_folder, component)))


def check_files_against_configs(files, config_folder: str, model_class: str) -> None:
    """Refuse a text encoder file whose tensors have other shapes than the config says, from the headers
    and a model built on the meta device (no weights read): CLIP-G where CLIP-L goes, a text encoder of
    another model size. Runs when the File Loader executes, so the error is on that node, not later on the
    Sampler's load. Weights the file names differently are left to the load's own check."""
    index = read_model_index(config_folder, is_folder=True)
    settings = config_values(index)
    family = family_for(model_class, settings=settings)
    model_file = dict(files).get(family.denoiser)
    variant = variant_of(model_file) if model_file else None
    for component, path in files:
        library, cls_name = (index.get(component) or [None, None])[:2]
        if library != "transformers":
            continue  # diffusers converts transformers and VAEs from other layouts; checked when loading
        model = meta_model(config_folder, component, library, cls_name)
        header = _header(path)
        prefix = check_file_for_slot(header, component, model_class, settings, model_file)
        check_layers_read([k[len(prefix):] for k in header if k.startswith(prefix)], header.name, component, family)
        in_file = _by_suffix(k[len(prefix):] for k in header if k.startswith(prefix))
        for key, tensor in model.state_dict().items():
            file_key = prefix + in_file.get(key, "\0")
            if file_key in header and header[file_key].shape != tuple(tensor.shape):
                raise UserInputError(
                    f"'{header.name}' does not fit {component} of this {family.name}: {key} is "
                    f"{list(header[file_key].shape)} in the file, {list(tensor.shape)} in "
                    f"'{os.path.basename(config_folder)}''s config. It is "
                    f"{slot_kind(family, component, variant).words} of another size or kind; pick the right file "
                    f"for {component}.")


def _by_suffix(keys) -> dict[str, str]:
    """{dotted suffix: key} of a file's keys, for suffixes that name one key only: files put a model's
    weights under other prefixes ('text_model.', 'model.') than the transformers class of the day."""
    found: dict[str, str | None] = {}
    for key in keys:
        parts = key.split(".")
        for start in range(len(parts)):
            suffix = ".".join(parts[start:])
            found[suffix] = key if suffix not in found else None
    return {suffix: key for suffix, key in found.items() if key is not None}
