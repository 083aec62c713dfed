"""Which pipeline component comes from which single file: the TPU File Loader's plan, from a diffusion
model (or all-in-one checkpoint), the text encoder and VAE files picked next to it, and the configs.

`plan` reads headers only (each file's once), so the node refuses a wrong pick when the prompt is queued:
a file of another family, a text encoder in the VAE slot, a missing encoder. `check_against_configs`
runs when the node executes: it fetches the configs of a hub repo if needed and compares shapes.
"""

from __future__ import annotations

import collections
import os

from .errors import UserInputError
from .families import FAMILIES, Family, family_for, supported
from .single_file import (HeaderView, check_file_for_slot, check_files_against_configs, check_layers_read,
                          components_in_checkpoint, config_folder, default_config_repo, family_of_file, kind_of_file,
                          model_class_of, settings_of, variant_of)
from .sources import config_values, has_weights, list_model_folders, read_model_index, resolve_model_folder
from .specs import QuantizedWeights

AUTO_CONFIGS = "auto"


def plan(model: str, picked: dict[str, str], configs: str, diffusers_roots: list[str]
         ) -> tuple[str, str, tuple[tuple[str, str], ...]]:
    """(configs source, model class, ((component, path), ...)) for diffusion model/checkpoint file `model`,
    the files `picked` per component (absolute paths) and `configs` (auto, or a folder name inside
    `diffusers_roots`); raises UserInputError."""
    model_header = HeaderView(model)
    picked_headers = {component: HeaderView(path) for component, path in picked.items()}
    settings = settings_of(model_header)  # a variant told by its files may be a model class with settings
    family = family_of_file(model_header).with_settings(settings)
    check_supported_file(model_header, family)
    model_class = model_class_of(model_header)
    if configs == AUTO_CONFIGS:
        source = auto_configs(default_config_repo(model_header), diffusers_roots)
    else:
        source = resolve_model_folder(configs, diffusers_roots)
    if os.path.isabs(source):
        check_configs_class(source, model_class, model_header.name, settings)
    with_weights = components_with_weights(source) if os.path.isabs(source) else set()  # a hub id: configs only
    return source, model_class, choose_files(model_header, family, picked_headers, with_weights)


def check_against_configs(source: str, model_class: str, files, model_name: str) -> None:
    """When the node runs: the configs now (downloaded when online, else the error names the command), of
    the model's class (auto's hub configs too, e.g. a file variant's), and the text encoder files' shapes
    against them, so a wrong file fails on the File Loader and not in the Sampler's load."""
    folder = config_folder(source)
    model_file = dict(files).get(family_for(model_class).denoiser)
    check_configs_class(folder, model_class, model_name, settings_of(model_file) if model_file else {})
    check_files_against_configs(files, folder, model_class)


def choose_files(model: HeaderView, family: Family, picked: dict[str, HeaderView],
                 configs_have_weights: set[str] = frozenset()) -> tuple[tuple[str, str], ...]:
    """((component, path), ...): the model file for its denoiser and whatever else it carries, each picked
    file for its component (it overrides the checkpoint's own) and for the parts it carries (`FileSlot.carried_by`)
    where nothing else gives them; `configs_have_weights` are components the
    config folder can load itself (a full diffusers folder picked as configs). `family` is the model's as its
    file variant's settings make it (`settings_of`)."""
    files = {name: model.path for name in components_in_checkpoint(model, family)}
    files[family.denoiser] = model.path
    slots = {slot.component: slot for slot in family.file_slots}
    settings, comfy_files = settings_of(model), comfy_files_of(model)
    for name, header in picked.items():
        if name not in slots:
            what = f"'{model.name}' is {family.name}" + (f" ({', '.join(settings)})" if settings else "")
            if name in family.extra_denoisers:  # a variant of the family with one diffusion model
                raise UserInputError(f"{what}, which has one diffusion model: it takes no second diffusion model "
                                     f"({name}); leave it at 'none'. It takes: {describe_slots(family, comfy_files)}.")
            raise UserInputError(f"{family.name} has no {name}; leave it at 'none'. {family.name} takes: "
                                 f"{describe_slots(family, comfy_files)}.")
        check_file_for_slot(header, name, family.base_class, settings, model)
        check_layers_read(header.keys(), header.name, name, family)
        check_file_name(header, slots[name], comfy_files)
        if name in family.extra_denoisers:
            check_same_model(model, header, name, comfy_files.get(name, slots[name].comfy_file))
        files[name] = header.path
    for name, slot in slots.items():  # a part a picked file carries (FileSlot.carried_by), where nothing else gives it
        carrier = picked.get(slot.carried_by)
        if carrier is not None and name not in files and name not in configs_have_weights and \
                name in components_in_checkpoint(carrier, family):
            check_file_for_slot(carrier, name, family.base_class, settings, model)
            files[name] = carrier.path
    missing = [name for name, slot in slots.items() if name not in files and name not in configs_have_weights
               and not slot.optional]
    if missing:
        raise UserInputError(f"{family.name} from single files also needs " + ", ".join(
            f"{name} ({comfy_files.get(name, slots[name].comfy_file)})" for name in missing) + f". {family.name} "
            f"takes: {describe_slots(family, comfy_files)}.")
    return tuple(sorted(files.items()))


def check_supported_file(model: HeaderView, family: Family) -> None:
    """A diffusion-model file that is of the family's kind but not one it can load (told by its name)."""
    part = next((part for part in family.unsupported_files if part in model.name.lower()), None)
    if part:
        raise UserInputError(f"'{model.name}' is named '{part}': {family.unsupported_files[part]}.")


def comfy_files_of(model: HeaderView) -> dict:
    """{component: ComfyUI's file for it} where the model file's variant pairs it with another than the slot's."""
    variant = variant_of(model)
    return dict(variant.comfy_files) if variant else {}


def check_file_name(header: HeaderView, slot, comfy_files: dict) -> None:
    """A file of the right kind whose name says it belongs elsewhere (a first expert picked as the
    second one: the same keys and shapes, so only its name tells)."""
    part = next((part for part in slot.not_named if part in header.name.lower()), None)
    if part:
        raise UserInputError(f"'{header.name}' is named '{part}', so it is not the file for {slot.component} (it "
                             f"takes {comfy_files.get(slot.component, slot.comfy_file)} or that file of your model); "
                             f"a '{part}' file goes in the model input. Pick the right file for {slot.component}.")


def check_same_model(model: HeaderView, other: HeaderView, component: str, comfy_file: str) -> None:
    """A second diffusion model (a second expert) must be of the model's own variant, with its shapes: experts
    of two variants would mix two models."""
    def words(header):
        variant = variant_of(header)
        return (variant.config_repo if variant else family_of_file(header).default_config_repo).split("/")[-1]

    if other.path == model.path:
        raise UserInputError(f"'{other.name}' is picked twice: {component} takes the model's other expert "
                             f"({comfy_file}), not the model file itself.")
    shape = next((k for k in model if k in other and model[k].shape != other[k].shape), None)
    if variant_of(other) != variant_of(model) or shape:
        detail = f": {shape} is {list(other[shape].shape)} there, {list(model[shape].shape)} here" if shape else ""
        raise UserInputError(f"'{other.name}' ({words(other)}) is not of the same model as '{model.name}' "
                             f"({words(model)}){detail}. {component} takes the other expert of the model picked: "
                             f"{comfy_file}.")


def describe_slots(family: Family, comfy_files: dict | None = None) -> str:
    return ", ".join(f"{slot.component} = {(comfy_files or {}).get(slot.component, slot.comfy_file)}"
                     + (" (optional)" if slot.optional else "") for slot in family.file_slots)


def check_configs_class(folder: str, model_class: str, model_name: str, settings: dict | None = None) -> None:
    """The configs are of the model's class: not another family's, nor another variant's of its family; and of its
    model_index settings where they change the family (`Family.setting_changes`)."""
    index = read_model_index(folder, is_folder=True)
    held = index["_class_name"]
    if held == model_class:
        held_settings = config_values(index)
        for name, _ in family_for(model_class).setting_changes:
            has, needs = bool(held_settings.get(name)), bool((settings or {}).get(name))
            if has != needs:
                raise UserInputError(
                    f"configs: '{os.path.basename(folder)}' holds a {held} {'with' if has else 'without'} {name}, but "
                    f"'{model_name}' is one {'with' if needs else 'without'} it (told by its name); pick a diffusers "
                    "folder of the same model (or auto).")
    if held != model_class:
        raise UserInputError(f"configs: '{os.path.basename(folder)}' holds a {held}, but '{model_name}' loads as a "
                             f"{model_class}; pick a diffusers folder of the same model (or auto). {named_variants()} TPU "
                             f"Diffusers runs these from single files: {supported()}.")


def named_variants() -> str:
    """Which model classes a diffusion-model file's name tells (the families' `FileVariant.name_contains`)."""
    named = {}
    for family in FAMILIES:
        for variant in family.file_variants:
            named.setdefault(variant.model_class, []).extend(variant.name_contains)
    return "A file's name tells its model class: " + ", ".join(
        f"{'/'.join(dict.fromkeys(parts))}: {model_class}" for model_class, parts in named.items() if parts) + "."


def auto_configs(repo: str, diffusers_roots: list[str]) -> str:
    """The folder in models/diffusers named like the model's hub repository (where the download command
    that the error names puts the config files), else the hub id: its config files from the hub cache."""
    folders = [f for f in list_model_folders(diffusers_roots) if f.split("/")[-1] == repo.split("/")[-1]]
    return resolve_model_folder(folders[0], diffusers_roots) if folders else repo


def components_with_weights(folder: str) -> set[str]:
    """Components of a diffusers folder that hold weights (a configs-only download holds none)."""
    return {name for name in os.listdir(folder) if has_weights(folder, name)}


def quantized_layer_formats(path: str) -> dict[str, tuple[str, str]]:
    """{weight key: (format name, in words)} of a file's ComfyUI per-layer quantized layers, from the header and
    the small comfy_quant tensors (no weight data; read once per file by quant_formats)."""
    from .quant_formats import file_quantization

    return {key: (layer.format.name, layer.words) for key, layer in file_quantization(path).layers.items()}


def file_status(files, choice: QuantizedWeights, device_type: str) -> list[str]:
    """A File Loader's status, from the headers: each component's quantized formats and whether its layers stay
    quantized on the chip with `choice` on this device (a line only for files with ComfyUI's per-layer formats)."""
    from .resident_weights import ROW_FORMATS

    resolved = choice.resolved(device_type)
    lines = []
    for component, path in files:
        layers = quantized_layer_formats(path).values()
        if not layers:
            continue
        counts = collections.Counter(words for _, words in layers)
        formats = ", ".join(f"{count} {words}" for words, count in sorted(counts.items()))
        kind = kind_of_file(path)
        if kind is not None and kind.dequantized:
            where = f"dequantized on load ({kind.words} is not kept quantized)"
        elif not any(name in ROW_FORMATS for name, _ in layers):
            where = "dequantized on load (only int8 and fp8 layers stay quantized)"
        elif resolved.keeps_quantized:
            where = "int8/fp8 layers kept quantized on the chip, dequantized per layer as they run"
        else:
            where = f"dequantized on load (quantized weights: {resolved} on {device_type})"
        lines.append(f"{component}: {formats} layers; {where}")
    return lines
