"""The pipeline families TPU Diffusers runs: one module per family, all of its facts in one class.

A family is a set of diffusers pipelines that share a denoiser architecture, text encoders, VAE and
latent space (FLUX.1 text-to-image, Kontext and Fill are one family). It is found from the
`_class_name` of a folder's `model_index.json` (`family_for`) or from a single file's keys
(`single_file.family_of_file`). Everything that differs between families is a field of `Family`,
not an `if` elsewhere. Adding a family: docs/adding_a_family.md.
"""

from __future__ import annotations

from ..errors import UserInputError
from . import flux1, flux2, flux2_klein, flux3, krea2, ltx2, minimax_h3, qwenimage, qwenimage21, sd3, sdxl, wan, zimage
from .base import (EDIT, FIRSTLAST2VIDEO, IMAGE2IMAGE, IMAGE2VIDEO, INCONTEXT2VIDEO, INPAINT, REFERENCE2VIDEO,  # noqa: F401
                   TEXT2IMAGE, TEXT2VIDEO, VIDEO_TASKS, ComfyLatent, Family, FileKind, FileSlot, FileVariant,
                   MemoryModel, ModularBlocks, ReferenceModel, TaskPipeline, TwoStage)  # (re-exported)
from .components import CLIP, KL_VAE, QWEN3, QWEN3VL, T5, WAN_VAE

FAMILIES: tuple[Family, ...] = (flux1.FAMILY, sd3.FAMILY, flux2.FAMILY, qwenimage.FAMILY, flux2_klein.FAMILY,
                               sdxl.FAMILY, zimage.FAMILY, wan.FAMILY, qwenimage21.FAMILY, krea2.FAMILY,
                               flux3.FAMILY, ltx2.FAMILY, minimax_h3.FAMILY)

# Single-file detection order: the first kind with a matching key wins, so more specific kinds come first
# (a FLUX.2 model also has FLUX.1's double blocks; Qwen2.5-VL's attention has biases Mistral's lacks; FLUX.2
# [klein] has [dev]'s keys, told by its context embedder's width).
FILE_KINDS: tuple[FileKind, ...] = (
    flux3.FAMILY.denoiser_kind,  # its key is its own
    flux2_klein.FAMILY.denoiser_kind,
    flux2.FAMILY.denoiser_kind, flux1.FAMILY.denoiser_kind, sd3.FAMILY.denoiser_kind, qwenimage.FAMILY.denoiser_kind,
    zimage.FAMILY.denoiser_kind,  # its files have no key of the kinds above, and no kind below has its key
    wan.FAMILY.denoiser_kind,  # as Z-Image's
    krea2.FAMILY.denoiser_kind,  # as Z-Image's
    ltx2.FAMILY.denoiser_kind,  # as Z-Image's
    ltx2.AUDIO_VAE, ltx2.DIFFUSION_DECODER_VAE, ltx2.VIDEO_VAE, ltx2.VOCODER, ltx2.CONNECTORS,  # keys of their own;
    # LTX-2.5's diffusion-decoder VAE also has the conv VAE's statistics: before it
    ltx2.GEMMA4, ltx2.GEMMA3,  # Gemma 4 has Gemma 3's layer norms: before it
    minimax_h3.VIDEO_VAE, minimax_h3.AUDIO_VAE,  # keys of their own; the video VAE also has KL_VAE's: before it
    # Wan 2.2's VAE has Wan 2.1's keys, UMT5 has T5's: each before the other; Qwen-Image 2.1's VAE has Wan 2.2's and
    # the FLUX.1/SD3 VAE's diffusers keys
    flux2.VAE, qwenimage21.VAE, wan.WAN22_VAE, WAN_VAE, KL_VAE, CLIP, wan.UMT5, T5, qwenimage.QWEN25VL,
    QWEN3VL, QWEN3,  # Qwen3-VL's text model has Qwen3's keys (and Mistral 3's): before them
    flux2.MISTRAL3,
    sdxl.FAMILY.denoiser_kind, sdxl.OPEN_CLIP_BIGG, qwenimage21.FAMILY.denoiser_kind,
    minimax_h3.FAMILY.denoiser_kind,  # keys of its own
)

# diffusers' model types (single_file_utils.infer_diffusers_model_type) of diffusion models whose family TPU Diffusers
# lacks, as a refusal names them (a family it has is named by its FileKind).
UNSUPPORTED_MODEL_TYPES = {"hunyuan-video": "a HunyuanVideo video model"}


def listed(families) -> str:
    """'A, B and C': the families' names, for node descriptions and tooltips."""
    names = list(dict.fromkeys(family.name for family in families))
    return ", ".join(names[:-1]) + f" and {names[-1]}" if len(names) > 1 else "".join(names)


def with_each_setting(families) -> list[Family]:
    """The families, each also as it is with each of its model_index settings (`setting_changes`), for node texts
    that name what each model takes."""
    return [variant for family in families
            for variant in (family, *(family.with_settings({name: True}) for name, _ in family.setting_changes))]


def supported() -> str:
    return ", ".join(f"{f.name} ({', '.join(f.model_classes)})" for f in FAMILIES)


def family_for(model_class, where: str = "", settings=None) -> Family:
    """The family a model_index.json `_class_name` belongs to (as a model with these model_index `settings`
    is: `Family.with_settings`); a clear error for anything else."""
    if not isinstance(model_class, str):  # diffusers' custom-pipeline form: ["module", "Class"]
        raise UserInputError(
            f"{where or 'this model'} names a custom pipeline ({model_class!r} in model_index.json's _class_name), "
            f"which TPU Diffusers does not run (it would execute the model's own code). Supported: {supported()}.")
    for family in FAMILIES:
        if model_class in family.model_classes:
            return family.with_settings(settings or {})
    raise UserInputError(
        f"{where or 'this model'} is a '{model_class}', which TPU Diffusers does not run. "
        f"Supported pipelines: {supported()}. Pick a model folder of one of these."
    )

