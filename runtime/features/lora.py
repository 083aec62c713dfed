"""LoRAs fused into a loaded pipeline's weights, switched without reloading or recompiling.

The handle's LoRAs are not part of its load key: the cached base pipeline is reused and the LoRAs are
applied onto it. diffusers does the reading and converting (`load_lora_weights` knows the diffusers,
kohya, ComfyUI and BFL layouts); here each LoRA is injected, weighted with its strength, fused into the
base weights, and the peft layers are removed again (`fuse_lora`, `unload_lora_weights`). So a LoRA adds
no per-step cost, and the transformer has its original module structure: a compiled transformer keeps
its compiled graphs, as only weight values change, in place.

Before a layer's weights are first changed, they are copied to the CPU once; switching LoRAs copies them
back (an exact restore, not unfuse arithmetic), so strength 0 or no LoRA gives the base image bit for bit.
On any error the pipeline is left as the base.

On a model with layers kept quantized (a File Loader's int8/fp8 file, runtime/resident_weights.py) LoRAs are not
fused: fusing into int8/fp8 data would re-quantize it (the image would no longer be the dequantized weights plus the
LoRA) and the next strength change would need the file read again. They stay peft's unfused side branches (diffusers'
`load_lora_weights`, strength by `set_adapters`): every LoRA is loaded once, also at strength 0, so a strength change
reads and reloads nothing; the image equals plain diffusers with the LoRA fused into the dequantized weights within
float32 summation order (tests/test_resident_weights.py). The price: the side branch runs every step, and a compiled
transformer can recompile when a strength changes (the scaling is a Python float a graph may guard on).

A LoRA goes into the denoiser its `expert` names (the families' `lora_targets`): `transformer` (high_noise, the
default, and the only one of one-transformer models), a second expert `transformer_2` (low_noise: diffusers'
`load_into_transformer_2`), or both; the backups cover whichever expert's weights changed. A `refine` LoRA goes into
the transformer for the refine stage of a two-stage run only (a distilled LoRA): the first stage runs with it
at strength 0, the upscale between the stages switches to its strength (`refine_after`), and the next run's
realise switches back. Fused, that is a restore and a fuse per switch; unfused, a `set_adapters`.
A model whose other partition loads its own denoiser in place of `transformer` (a reference to video workflow's
`transformer_ref`: the families' `partition_denoisers`) takes a `transformer` LoRA into that one, as diffusers routes
it there itself.
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import os
import re

from ..errors import LoraUnloadError, UserInputError
from ..families import FAMILIES, family_for
from ..specs import LoraExpert, LoraSpec, ProgressCallback

log = logging.getLogger("tpu_diffusers")

NAME = "lora"

LORA_KEY = re.compile(r"(^|\.)(lora_A|lora_B|lora_down|lora_up)(\.|$)|\.alpha$")
_LAYER = re.compile(r"^(.*)\.(lora_A|lora_B)\.weight$")
ADAPTER_PREFIX = "tpu_diffusers_lora_"
# the pipeline components each expert choice loads a LoRA into: the first (a model's one transformer) by default, as
# the families with two experts name them otherwise
EXPERT_COMPONENTS = {LoraExpert.HIGH_NOISE: ("transformer",), LoraExpert.REFINE: ("transformer",), **{
    LoraExpert(choice): targets for family in FAMILIES for choice, targets in family.lora_targets.items()}}
# what a second expert is, for the refusal on a model without one
SECOND_EXPERT_WORDS = next(family.extra_denoiser_words for family in FAMILIES if family.lora_targets)
# the denoisers a partition of a model's modular blocks loads in place of `transformer` (a reference to video
# workflow's transformer_ref)
PARTITION_DENOISERS = tuple(name for family in FAMILIES for name in family.partition_denoisers)
LORA_WITH_MESH = ("LoRAs are not supported with tensor parallelism (tp above 1) yet: the sharded transformer's weights "
                  "are DTensors split over the ranks, and diffusers' LoRA loading and fusing handles only whole "
                  "weights. Remove the LoRAs, or make the TP Mesh all replicas (replicas = chips, tp 1), or remove it.")


@dataclasses.dataclass
class LoraState:
    """What is applied to one loaded pipeline, and the base values of every weight a LoRA changed."""

    asked: tuple[LoraSpec, ...] = ()  # the handle's LoRAs, refine ones included
    applied: tuple[LoraSpec, ...] = ()
    # "component.module.param" -> (the parameter, its base value on the CPU), copied once, before the first change
    backups: dict[str, tuple[object, object]] = dataclasses.field(default_factory=dict)
    changed: set[str] = dataclasses.field(default_factory=set)  # the backups whose parameter now differs from it
    notes: tuple[str, ...] = ()  # for the run info of every run with these LoRAs
    unfused_layers: tuple[int, ...] = ()  # per applied LoRA, its peft layers, when LoRAs stay unfused


def check_lora_file(path: str) -> None:
    """Header-only check (for queue time): a readable safetensors file with LoRA-looking keys."""
    name = os.path.basename(path)
    if not path.lower().endswith(".safetensors"):
        raise UserInputError(f"LoRA '{name}' is not a .safetensors file; only safetensors LoRAs are loaded (other "
                             "formats can run code when read). Get or convert the LoRA to .safetensors.")
    if not os.path.isfile(path):
        raise UserInputError(f"LoRA file '{path}' does not exist; pick a LoRA from the list again.")
    from safetensors import SafetensorError, safe_open

    try:
        with safe_open(path, "pt") as f:
            keys = list(f.keys())
    except (SafetensorError, OSError, ValueError) as e:
        raise UserInputError(f"LoRA '{name}' is not a readable safetensors file, it is truncated or corrupt ({e}); "
                             "download it again.") from e
    if not any(LORA_KEY.search(key) for key in keys):
        raise UserInputError(f"'{name}' holds no LoRA weights (no lora_A/lora_B/lora_down/lora_up/alpha keys among "
                             f"its {len(keys)} tensors); is it a full model? Full models go in models/diffusion_models "
                             "or models/checkpoints, LoRAs in models/loras.")


def _read(path: str) -> dict:
    """All tensors of a LoRA file; a file the header check passed may still be cut short in its data."""
    from safetensors import SafetensorError
    from safetensors.torch import load_file

    try:
        return load_file(path)
    except (SafetensorError, OSError, ValueError, RuntimeError) as e:
        raise UserInputError(f"LoRA '{os.path.basename(path)}' could not be read, it is truncated or corrupt ({e}); "
                             "download it again.") from e


def apply(entry, loras: tuple[LoraSpec, ...], state: LoraState | None,
          on_progress: ProgressCallback | None = None) -> LoraState:
    """The loaded pipeline with `loras` fused in (see apply_loras), as a run's first stage has them (`refine` ones at
    strength 0); the state keeps the base weights' copies."""
    state = state if state is not None else LoraState()
    state.asked = tuple(loras)
    notes = apply_loras(entry.pipe, stage_loras(loras, refine=False), state, on_progress)
    state.notes = tuple(f"LoRA: {_name(lora)} @ {lora.strength:g} (the refine stage only)"
                        if lora.expert is LoraExpert.REFINE else note for lora, note in zip(loras, notes))
    return state


def stage_loras(loras, refine: bool) -> tuple[LoraSpec, ...]:
    """The LoRAs one stage of a run fuses: `refine` ones into the transformer, at their strength in the refine stage
    and at 0 before it (so both stages load the same files: unfused, switching is a strength change only)."""
    return tuple(dataclasses.replace(lora, expert=LoraExpert.HIGH_NOISE, strength=lora.strength if refine else 0.0)
                 if lora.expert is LoraExpert.REFINE else lora for lora in loras)


def refine_after(entry, upsample):
    """`upsample` (a two-stage run's latent upscaler, called between its stages), followed by the refine stage's
    LoRAs where the handle has `refine` ones; `upsample` itself where it has none."""
    state = entry.states.get(NAME)
    if state is None or all(lora.expert is not LoraExpert.REFINE for lora in state.asked):
        return upsample

    def upsample_then_refine_loras(*args, **kwargs):
        upscaled = upsample(*args, **kwargs)
        apply_loras(entry.pipe, stage_loras(state.asked, refine=True), state)
        return upscaled

    return upsample_then_refine_loras


def remove(entry, state: LoraState) -> None:
    """The base weights back (exact copies), no LoRA applied."""
    apply_loras(entry.pipe, (), state)


def apply_loras(pipe, loras, state: LoraState, on_progress=None) -> list[str]:
    """Make `pipe` the base with `loras` fused in, in order; returns notes for the run info.

    Nothing happens when they are what is applied already. Otherwise the base weights are restored,
    then each LoRA with a strength other than 0 is loaded by diffusers, weighted, fused and unloaded.
    On any error the pipeline is left as the base and a UserInputError names the file and what to do.
    """
    loras = tuple(loras)
    if loras == state.applied:
        return list(state.notes)
    if _keeps_quantized(pipe):
        return _apply_unfused(pipe, loras, state, on_progress)
    active = [(index, lora) for index, lora in enumerate(loras) if lora.strength != 0]
    for _, lora in active:
        check_lora_file(lora.path)  # before anything changes
    with _offload_removed(pipe):
        _restore(state)
        state.applied, state.notes = (), ()
        if not active:
            notes = [f"LoRA: {_name(lora)} @ 0 (strength 0: not applied)" for lora in loras]
        else:
            try:
                notes = _fuse(pipe, loras, active, state, on_progress)
            except BaseException as error:
                try:
                    _unload(pipe)
                except Exception as unload_error:  # peft layers may be left: this pipeline cannot be trusted
                    raise LoraUnloadError(f"{error}; removing the LoRA layers afterwards failed too ({unload_error}), "
                                          "so the loaded pipeline is dropped and the next run loads it again."
                                          ) from error
                finally:
                    _restore(state)  # the base, whatever the error was
                raise
    state.applied, state.notes = loras, tuple(notes)
    log.info("TPU Diffusers: %s", "; ".join(notes) if notes else "LoRAs removed, base weights restored")
    return notes


def _keeps_quantized(pipe) -> bool:
    """Whether a LoRA-loadable model keeps quantized layers (runtime/resident_weights.py): fusing would have to
    re-quantize them, so LoRAs stay unfused there."""
    import torch

    from ..resident_weights import has_resident_layers

    return any(isinstance(model, torch.nn.Module) and has_resident_layers(model)
               for model in (getattr(pipe, c, None) for c in pipe._lora_loadable_modules))


def _apply_unfused(pipe, loras, state: LoraState, on_progress) -> list[str]:
    """LoRAs as peft's side branches (x @ A @ B x strength added to the layer's output), left in place: the
    quantized layers are never changed. Every LoRA is loaded, also at strength 0, so that a strength change is
    `set_adapters` only: nothing is read or reloaded. Other files (or experts) unload all and load again."""
    files = [(lora.path, lora.expert) for lora in loras]
    with _offload_removed(pipe):
        if files != [(lora.path, lora.expert) for lora in state.applied]:
            for lora in loras:
                check_lora_file(lora.path)  # before anything changes
            _unload(pipe)
            state.applied, state.notes, state.unfused_layers = (), (), ()
            try:
                state.unfused_layers = tuple(len(injected) for _, _, injected
                                             in _load_adapters(pipe, list(enumerate(loras)), on_progress))
            except BaseException:
                _unload(pipe)
                raise
        if loras:
            pipe.set_adapters([f"{ADAPTER_PREFIX}{index}" for index in range(len(loras))],
                              [lora.strength for lora in loras])
    notes = [f"LoRA: {_name(lora)} @ {lora.strength:g} ({layers} layers, unfused: the base layers stay quantized)"
             for lora, layers in zip(loras, state.unfused_layers)]
    state.applied, state.notes = loras, tuple(notes)
    log.info("TPU Diffusers: %s", "; ".join(notes) if notes else "LoRAs removed")
    return notes


def _fuse(pipe, loras, active, state: LoraState, on_progress) -> list[str]:
    import torch

    names, layers = [], {}
    for index, adapter, injected in _load_adapters(pipe, active, on_progress):
        _back_up(injected, state)
        names.append(adapter)
        layers[index] = len(injected)
    if on_progress:
        on_progress(len(active), len(active), "fusing LoRAs")
    strengths = [lora.strength for _, lora in active]
    loaded = [c for c in pipe._lora_loadable_modules
              if isinstance(getattr(pipe, c, None), torch.nn.Module) and _has_adapters(getattr(pipe, c))]
    pipe.set_adapters(names, strengths)
    pipe.fuse_lora(components=loaded, lora_scale=1.0, adapter_names=names)
    _unload(pipe)
    notes = []
    for index, lora in enumerate(loras):
        if index in layers:
            experts = " + ".join(_components(pipe, lora))
            where = (f", {lora.expert}: {experts}" if _second_expert(pipe) is not None
                     else f", into {experts}" if experts != "transformer" else "")
            notes.append(f"LoRA: {_name(lora)} @ {lora.strength:g} (fused, {layers[index]} layers{where})")
        else:
            notes.append(f"LoRA: {_name(lora)} @ 0 (strength 0: not applied)")
    return notes


def _load_adapters(pipe, active, on_progress):
    """Each LoRA of `active` ((index, lora)) loaded by diffusers as adapter f"{ADAPTER_PREFIX}{index}" into the
    expert(s) it names, checked to fit first; yields (index, adapter, its peft layers)."""
    for done, (index, lora) in enumerate(active):
        if on_progress:
            on_progress(done, len(active), f"LoRA {_name(lora)}")
        adapter = f"{ADAPTER_PREFIX}{index}"
        expected = _check_fits(pipe, lora)
        try:
            with _quiet_about_components_without_keys():
                for component in _components(pipe, lora):  # one adapter name, in each expert's own model
                    into = {f"load_into_{component}": True} if component != "transformer" else {}
                    pipe.load_lora_weights(os.path.dirname(lora.path), weight_name=os.path.basename(lora.path),
                                           adapter_name=adapter, **into)
        except (ValueError, RuntimeError, KeyError, AssertionError, TypeError) as e:
            raise UserInputError(f"LoRA '{_name(lora)}' could not be loaded into this {type(pipe).__name__} "
                                 f"({type(e).__name__}: {_first_line(e)}); is it a LoRA for this model? Pick one "
                                 "made for it, or remove it.") from e
        injected = _injected(pipe, adapter)
        missing = sorted(expected - injected.keys())
        if not injected or missing:
            raise UserInputError(
                f"LoRA '{_name(lora)}' matches {'no' if not injected else 'not every'} layer of this "
                f"{type(pipe).__name__} ({len(expected) - len(missing)} of its {len(expected)} layers were applied"
                f"{', not ' + missing[0] if missing else ''}); it is a LoRA for another model. "
                "Pick one made for this model, or remove it.")
        yield index, adapter, injected


def _check_fits(pipe, lora: LoraSpec) -> set[str]:
    """The layers ("component.module") the LoRA changes, as diffusers converts it; refused before anything
    is injected when one is not in this pipeline or has other widths (diffusers would widen a
    layer for a wider LoRA, which changes the model: a control LoRA, or a LoRA for another model)."""
    import torch

    # A UNet pipeline's loader maps kohya's SGM block names (input_blocks.N) with the UNet's config, as
    # load_lora_weights does.
    unet = getattr(pipe, "unet", None)
    options = {"unet_config": unet.config} if unet is not None else {}
    try:
        converted = pipe.lora_state_dict(_read(lora.path), **options)
        converted = _peft_names(pipe, converted[0] if isinstance(converted, tuple) else converted)
    except UserInputError:
        raise
    except (ValueError, RuntimeError, KeyError, AssertionError, TypeError, IndexError) as e:
        raise UserInputError(f"LoRA '{_name(lora)}' is not in a layout diffusers can read for a "
                             f"{type(pipe).__name__} ({type(e).__name__}: {_first_line(e)}); is it a LoRA for this "
                             "model? Pick one made for it, or remove it.") from e
    converted = _into_experts(pipe, lora, converted)
    wanted = {}
    for key, value in converted.items():
        match = _LAYER.match(key)
        if match:
            wanted.setdefault(match[1], {})[match[2]] = value
    misfits = []
    for layer, parts in sorted(wanted.items()):
        component, _, path = layer.partition(".")
        model = getattr(pipe, component, None) if component in pipe._lora_loadable_modules else None
        try:
            module = model.get_submodule(path) if isinstance(model, torch.nn.Module) else None
        except AttributeError:
            module = None
        if module is None:
            misfits.append(f"{layer} is not in this pipeline")
        elif isinstance(module, torch.nn.Linear) and "lora_A" in parts and "lora_B" in parts and (
                parts["lora_A"].shape[-1] != module.in_features or parts["lora_B"].shape[0] != module.out_features):
            misfits.append(f"{layer} is {module.in_features}->{module.out_features} here, "
                           f"{parts['lora_A'].shape[-1]}->{parts['lora_B'].shape[0]} in the LoRA")
    if not wanted:
        raise UserInputError(f"LoRA '{_name(lora)}' has no layers diffusers can apply to a {type(pipe).__name__}; "
                             "it is a LoRA for another model. Pick one made for this model, or remove it.")
    if misfits:
        raise UserInputError(f"LoRA '{_name(lora)}' does not fit this {type(pipe).__name__}: {len(misfits)} of its "
                             f"{len(wanted)} layers do not match ({misfits[0]}); it is a LoRA for another model. "
                             "Pick one made for this model, or remove it.")
    return set(wanted)


def _second_expert(pipe):
    """The second expert `transformer_2`; None for a model with one transformer."""
    import torch

    model = getattr(pipe, "transformer_2", None) if "transformer_2" in pipe._lora_loadable_modules else None
    return model if isinstance(model, torch.nn.Module) else None


def _components(pipe, lora: LoraSpec) -> tuple[str, ...]:
    """The pipeline components the LoRA goes into: its expert's, with `transformer` read as the partition denoiser
    loaded in its place (diffusers' loader for such a model routes `transformer.` layers to a lone
    `transformer_ref`)."""
    import torch

    components = EXPERT_COMPONENTS[lora.expert]
    if components != ("transformer",) or isinstance(getattr(pipe, "transformer", None), torch.nn.Module):
        return components
    return next(((name,) for name in PARTITION_DENOISERS if name in pipe._lora_loadable_modules
                 and isinstance(getattr(pipe, name, None), torch.nn.Module)), components)


def _into_experts(pipe, lora: LoraSpec, converted: dict) -> dict:
    """The converted layers as the experts the LoRA goes into hold them: diffusers names an expert LoRA's layers
    `transformer.` and loads them into `transformer_2` for load_into_transformer_2 (or `transformer_ref`, see
    `_components`). Refused when the LoRA asks for a second expert this model does not have."""
    components = _components(pipe, lora)
    if components == ("transformer",):
        return converted
    if "transformer_2" in components and _second_expert(pipe) is None:
        raise UserInputError(
            f"LoRA '{_name(lora)}' is set to expert '{lora.expert}', which needs a second transformer "
            f"(transformer_2, {SECOND_EXPERT_WORDS}), but this {type(pipe).__name__} has only one. "
            "Set the LoRA's expert to high_noise (the model's transformer), or load a model with two experts.")
    out = {k: v for k, v in converted.items() if not k.startswith("transformer.")}
    for component in components:
        out.update({f"{component}.{k.removeprefix('transformer.')}": v for k, v in converted.items()
                    if k.startswith("transformer.")})
    return out


def _peft_names(pipe, converted: dict) -> dict:
    """diffusers' older LoRA names, which its kohya converter returns for UNet pipelines and text encoders
    (`.to_q_lora.down`, `.lora.down`, `.lora_linear_layer.down`), as the peft layers they are loaded into
    (`.to_q.lora_A`), by the mappings diffusers itself applies when loading them: `load_lora_adapter`'s for
    a diffusers model, `_load_lora_into_text_encoder`'s for a transformers one (and its dropping of
    'text_model.' for transformers' flattened CLIPTextModel)."""
    from diffusers.utils import (convert_state_dict_to_diffusers, convert_state_dict_to_peft,
                                 convert_unet_state_dict_to_peft)

    out = {k: v for k, v in converted.items() if k.split(".")[0] not in pipe._lora_loadable_modules}
    for component in pipe._lora_loadable_modules:
        part = {k[len(component) + 1:]: v for k, v in converted.items() if k.startswith(component + ".")}
        if part and not all(_LAYER.match(k) for k in part):
            model = getattr(pipe, component, None)
            if type(model).__module__.startswith("transformers"):
                part = convert_state_dict_to_peft(convert_state_dict_to_diffusers(part))
                if not hasattr(model, "text_model"):
                    part = {k.removeprefix("text_model."): v for k, v in part.items()}
            else:
                part = convert_unet_state_dict_to_peft(part)
        out.update({f"{component}.{k}": v for k, v in part.items()})
    return out


def _lora_layers(pipe):
    """(component, module name, peft layer) of every peft layer in the pipeline's LoRA-loadable components."""
    import torch
    from peft.tuners.tuners_utils import BaseTunerLayer

    for component in pipe._lora_loadable_modules:
        model = getattr(pipe, component, None)
        if isinstance(model, torch.nn.Module):
            for name, module in model.named_modules():
                if isinstance(module, BaseTunerLayer):
                    yield component, name, module


def _has_adapters(model) -> bool:
    from peft.tuners.tuners_utils import BaseTunerLayer

    return any(isinstance(module, BaseTunerLayer) for module in model.modules())


def _injected(pipe, adapter: str) -> dict[str, object]:
    """"component.module" -> peft layer, for the layers that hold `adapter`."""
    return {f"{component}.{name}": layer for component, name, layer in _lora_layers(pipe)
            if adapter in getattr(layer, "lora_A", {})}


def _back_up(injected: dict[str, object], state: LoraState) -> None:
    """Copy the base weights of the injected layers to the CPU, once per parameter, before they are fused."""
    for layer_name, layer in injected.items():
        for param_name, param in layer.get_base_layer().named_parameters(recurse=False):
            key = f"{layer_name}.{param_name}"
            if key not in state.backups:
                state.backups[key] = (param, param.detach().to("cpu", copy=True))
            state.changed.add(key)


def _restore(state: LoraState) -> None:
    """Copy the base values back into every parameter a LoRA changed, in place (compiled code stays valid)."""
    import torch

    with torch.no_grad():
        for key in sorted(state.changed):
            param, base = state.backups[key]
            param.data.copy_(base)
    state.changed.clear()


def _unload(pipe) -> None:
    """Remove every peft layer (fused or not): the modules are the original ones again."""
    if any(True for _ in _lora_layers(pipe)):
        pipe.unload_lora_weights()
    for _, _, layer in _lora_layers(pipe):  # unload_lora_weights skips models that are not diffusers or transformers
        raise RuntimeError(f"peft layer {type(layer).__name__} left after unloading LoRAs")
    pipe._merged_adapters = set()  # diffusers' record of fused adapters (a class-level default otherwise)


class _NoKeysFor(logging.Filter):
    def filter(self, record: logging.LogRecord) -> bool:
        return not record.getMessage().startswith("No LoRA keys associated to")


@contextlib.contextmanager
def _quiet_about_components_without_keys():
    """diffusers warns for every LoRA-loadable component a LoRA leaves alone (most LoRAs change only the
    transformer); what was applied is checked here and said in the run info instead."""
    logger, quiet = logging.getLogger("diffusers.loaders.lora_base"), _NoKeysFor()
    logger.addFilter(quiet)
    try:
        yield
    finally:
        logger.removeFilter(quiet)


@contextlib.contextmanager
def _offload_removed(pipe):
    """Model CPU offload's hooks off around the LoRA work, and back on with the pipeline's own device.
    (diffusers would re-enable them itself, but on its default accelerator, which is not ours on a TPU
    or on the CPU.)"""
    import torch

    hooked = any(hasattr(module, "_hf_hook") for module in pipe.components.values()
                 if isinstance(module, torch.nn.Module))
    device = getattr(pipe, "_offload_device", None)
    if not hooked or device is None:
        yield
        return
    pipe.remove_all_hooks()
    try:
        yield
    finally:
        pipe.enable_model_cpu_offload(device=device)


def _name(lora: LoraSpec) -> str:
    return os.path.basename(lora.path)


def _first_line(error: BaseException) -> str:
    text = str(error).strip()
    return text.splitlines()[0][:300] if text else type(error).__name__


def check_lora_fits(model_class: str, config_folder: str, lora: LoraSpec) -> None:
    """The LoRA node's check, before anything is loaded: the same as when fusing, against the pipeline's
    LoRA-loadable models built on the meta device from their configs (no weights), so a LoRA of another
    family fails on the LoRA node."""
    import diffusers

    from ..single_file import meta_model
    from ..sources import read_model_index

    if lora.expert is LoraExpert.REFINE and family_for(model_class).two_stage is None:
        with_two = ", ".join(family.name for family in FAMILIES if family.two_stage)
        raise UserInputError(f"LoRA '{_name(lora)}' is set to expert 'refine', the refine stage of a two-stage run, "
                             f"which a {model_class} has not (models with one: {with_two}). Set its expert to "
                             "high_noise.")
    pipeline_cls = getattr(diffusers, model_class)
    index = read_model_index(config_folder, is_folder=True)
    models = {}
    for component in pipeline_cls._lora_loadable_modules:
        library, cls_name = (index.get(component) or [None, None])[:2]
        if library in ("diffusers", "transformers"):
            models[component] = meta_model(config_folder, component, library, cls_name)
    skeleton = type(model_class, (), {"_lora_loadable_modules": pipeline_cls._lora_loadable_modules,
                                         "lora_state_dict": staticmethod(pipeline_cls.lora_state_dict), **models})
    _check_fits(skeleton(), lora)
