#!/usr/bin/env python3
"""Tiny LoRA files for the tiny pipelines of tools/tiny_models.py, made offline.

    python tools/tiny_loras.py MODEL_DIR OUT_FILE [--seed 0] [--format diffusers|kohya|comfyui|lightx2v] [--rank 4]
                               [--expert transformer|transformer_2]

`diffusers` (every family): peft's `LoraConfig` on the transformer's attention linears (to_q, to_k, to_v,
to_out.0, where the family has them), lora_A and lora_B drawn at random from `seed` (B is not zero, so the
LoRA changes the image), saved with the pipeline class's own `save_lora_weights`.

`kohya` for SDXL: kohya's sd-scripts names (`lora_unet_input_blocks_2_1_transformer_blocks_0_attn1_to_q`, SGM
block numbers as in the checkpoint, `lora_te1_` / `lora_te2_` for the two CLIPs, with `.alpha`).

`kohya` and `comfyui` (FLUX.1) name the layers as BFL's FLUX code does; that is what diffusers' kohya
converter reads: `lora_unet_double_blocks_0_img_attn_qkv.lora_down.weight` / `.lora_up.weight` / `.alpha`
(kohya's sd-scripts, plus CLIP's first attention as `lora_te1_...`), and
`diffusion_model.double_blocks.0.img_attn.qkv.lora_down.weight` / `.lora_up.weight` (what ComfyUI's LoraSave
writes; diffusers reads FLUX.1 ComfyUI LoRAs only with lora_down/lora_up names, not lora_A/lora_B).
Only four BFL layers are used: diffusers splits a single block's fused
`linear1` (q, k, v and the MLP) at FLUX.1's real widths (3072, 3072, 3072, 12288), which a tiny model does
not have; a double block's `qkv` is split in three equal parts, which works at any width.

`lightx2v` for QwenImage is the layout of lightx2v's Qwen-Image Lightning LoRAs (Qwen-Image-2512-Lightning-
4steps-V1.0-bf16/fp32, Qwen-Image-Edit-2509-Lightning-4steps-V1.0-bf16, the files ComfyUI's templates download):
diffusers' module names without a prefix, `transformer_blocks.0.attn.to_q.lora_down.weight` / `.lora_up.weight` /
`.alpha`, on the twelve linears of every block (the image and text attention projections, their outputs and
both MLPs), with alpha = rank / 8 as those files have (rank 64, alpha 8).
`lightx2v` for Wan 2.2 (WanPipeline, WanImageToVideoPipeline) is the layout of lightx2v's 4-step LoRAs as ComfyUI's
Wan 2.2 templates load them (wan2.2_t2v_lightx2v_4steps_lora_v1.1_high_noise / _low_noise, wan2.2_i2v_lightx2v_4steps_
lora_v1_high_noise / _low_noise): Wan's original module names under `diffusion_model.`, e.g.
`diffusion_model.blocks.0.self_attn.q.lora_down.weight` / `.lora_up.weight` / `.alpha`, on the self- and cross-attention
projections (q, k, v, o) and both FFN linears of every block; one file per expert, from that expert's widths
(`--expert transformer` for the high-noise file, `transformer_2` for the low-noise one), alpha = rank / 2 (a scale
that is not 1, so its handling shows). diffusers' `_convert_non_diffusers_wan_lora_to_diffusers` reads it.
`comfyui` for Z-Image is the layout ComfyUI users hold for it (ai-toolkit's, the common trainer): diffusers'
layer names under `diffusion_model.` with `lora_A`/`lora_B` and an `.alpha` per layer, e.g.
`diffusion_model.layers.0.attention.to_q.lora_A.weight`; diffusers' Z-Image loader converts it.
`comfyui` for Krea 2 is the layout of its LoRAs for ComfyUI (Krea's module names under `diffusion_model.`, `lora_A`/
`lora_B`, no alpha: `diffusion_model.blocks.0.attn.wq.lora_A.weight`); diffusers' Krea 2 loader converts it.
`comfyui` for MiniMax H3 is the layout of its LoRAs for ComfyUI (lightx2v's `*_comfyui_bf16` turbo LoRAs, ai-toolkit's):
MiniMax's module names (ComfyUI's comfy/ldm/minimax/model.py) under `diffusion_model.`, `lora_A`/`lora_B`, no alpha, on
every linear of the transformer, so q/k/v are one fused `attn.qkv_proj` and `mlp.fc1` is [gate; value]; diffusers'
MiniMax H3 loader converts it (splits qkv's lora_B, swaps fc1's halves).
"""
from __future__ import annotations

import argparse
import json
from pathlib import Path

import torch

ATTENTION_LINEARS = ("to_q", "to_k", "to_v", "to_out.0")
FORMATS = ("diffusers", "kohya", "comfyui", "lightx2v")
# The linears of a QwenImage transformer block that lightx2v's Lightning LoRAs change.
LIGHTX2V_LINEARS = ("attn.to_q", "attn.to_k", "attn.to_v", "attn.add_q_proj", "attn.add_k_proj", "attn.add_v_proj",
                    "attn.to_out.0", "attn.to_add_out", "img_mlp.net.0.proj", "img_mlp.net.2", "txt_mlp.net.0.proj",
                    "txt_mlp.net.2")


def _model_index(model_dir: Path) -> dict:
    """model_index.json, or a modular pipeline's modular_model_index.json (its components' entries start alike)."""
    path = model_dir / "model_index.json"
    return json.loads((path if path.is_file() else model_dir / "modular_model_index.json").read_text())


def _pipeline_class(model_dir: Path):
    import diffusers

    return getattr(diffusers, _model_index(model_dir)["_class_name"])


def _load_transformer(model_dir: Path):
    import diffusers

    cls = getattr(diffusers, _model_index(model_dir)["transformer"][1])
    return cls.from_pretrained(model_dir, subfolder="transformer", local_files_only=True)


def _random_(tensor: torch.Tensor, generator: torch.Generator, std: float) -> None:
    tensor.copy_(torch.randn(tensor.shape, generator=generator) * std)


def diffusers_lora(model_dir: Path, out_file: Path, seed: int = 0, rank: int = 4, std: float = 0.3) -> Path:
    """A peft LoRA on the transformer's attention linears, in the diffusers format."""
    from peft import LoraConfig, get_peft_model_state_dict

    transformer = _load_transformer(model_dir)
    transformer.add_adapter(LoraConfig(r=rank, lora_alpha=rank, target_modules=list(ATTENTION_LINEARS)))
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, param in sorted(transformer.named_parameters()):
            if ".lora_A." in name or ".lora_B." in name:
                _random_(param, generator, std / param.shape[1] ** 0.5)
    layers = get_peft_model_state_dict(transformer)
    out_file.parent.mkdir(parents=True, exist_ok=True)
    _pipeline_class(model_dir).save_lora_weights(out_file.parent, transformer_lora_layers=layers,
                                                 weight_name=out_file.name)
    return out_file


def _flux1_bfl_layers(model_dir: Path) -> dict[str, tuple[int, int]]:
    """BFL names of four FLUX.1 layers and their (out, in) widths, from the transformer's config."""
    config = json.loads((model_dir / "transformer" / "config.json").read_text())
    inner = config["num_attention_heads"] * config["attention_head_dim"]
    mlp = int(inner * 4.0)  # FLUX.1's mlp_ratio
    return {"double_blocks.0.img_attn.qkv": (3 * inner, inner), "double_blocks.0.img_attn.proj": (inner, inner),
            "double_blocks.0.txt_attn.proj": (inner, inner), "single_blocks.0.linear2": (inner, inner + mlp)}


def _clip_layers(model_dir: Path, component: str = "text_encoder") -> dict[str, tuple[int, int]]:
    """The attention of CLIP's first layer (kohya's `lora_te1_`), so the kohya LoRA also changes a text encoder."""
    width = json.loads((model_dir / component / "config.json").read_text())["hidden_size"]
    return {f"text_model.encoder.layers.0.self_attn.{name}": (width, width)
            for name in ("q_proj", "k_proj", "v_proj", "out_proj")}


def bfl_lora(model_dir: Path, out_file: Path, style: str, seed: int = 0, rank: int = 4, std: float = 0.3) -> Path:
    """A FLUX.1 LoRA with BFL layer names: kohya's (`lora_unet_..`, with `.alpha`) or ComfyUI's
    (`diffusion_model...`, no alpha)."""
    from safetensors.torch import save_file

    if _pipeline_class(model_dir).__name__ != "FluxPipeline":
        raise ValueError(f"{style} LoRAs are made for FLUX.1 only, not {model_dir}")
    layers = {f"lora_unet_{name.replace('.', '_')}" if style == "kohya" else f"diffusion_model.{name}": shape
              for name, shape in _flux1_bfl_layers(model_dir).items()}
    if style == "kohya":
        layers.update({f"lora_te1_{name.replace('.', '_')}": shape for name, shape in _clip_layers(model_dir).items()})
    tensors = _kohya_tensors(layers, torch.Generator().manual_seed(seed), rank, std,
                             alpha=float(rank) if style == "kohya" else None)
    out_file.parent.mkdir(parents=True, exist_ok=True)
    save_file(tensors, str(out_file))
    return out_file


def _sdxl_sgm_layers(model_dir: Path) -> dict[str, tuple[int, int]]:
    """Four UNet linears with the SGM names kohya's sd-scripts train SDXL under (input_blocks.N / middle_block /
    output_blocks.N, as in the checkpoint), and their (out, in) widths from the UNet's config: self- and
    cross-attention of the deepest down level, the middle block's attention output, the first up block's proj_in."""
    config = json.loads((model_dir / "unet" / "config.json").read_text())
    channels, cross = config["block_out_channels"], config["cross_attention_dim"]
    down = 1 + (config["layers_per_block"] + 1) * (len(channels) - 1)  # the first block of the deepest level
    return {f"input_blocks.{down}.1.transformer_blocks.0.attn1.to_q": (channels[-1], channels[-1]),
            f"input_blocks.{down}.1.transformer_blocks.0.attn2.to_k": (channels[-1], cross),
            "middle_block.1.transformer_blocks.0.attn1.to_out.0": (channels[-1], channels[-1]),
            "output_blocks.0.1.proj_in": (channels[-1], channels[-1])}


def _kohya_tensors(layers: dict[str, tuple[int, int]], generator, rank: int, std: float, alpha: float | None) -> dict:
    """lora_down / lora_up drawn at random for each layer {name: (out, in)}, and `.alpha` unless it is None."""
    tensors = {}
    for key, (out_features, in_features) in layers.items():
        down, up = torch.empty(rank, in_features), torch.empty(out_features, rank)
        _random_(down, generator, std / in_features ** 0.5)
        _random_(up, generator, std / rank ** 0.5)
        tensors[f"{key}.lora_down.weight"], tensors[f"{key}.lora_up.weight"] = down, up
        if alpha is not None:
            tensors[f"{key}.alpha"] = torch.tensor(alpha)
    return tensors


def sdxl_kohya_lora(model_dir: Path, out_file: Path, seed: int = 0, rank: int = 4, std: float = 0.3) -> Path:
    """An SDXL LoRA as kohya's sd-scripts save it: `lora_unet_<SGM name>`, `lora_te1_` (CLIP-L) and `lora_te2_`
    (OpenCLIP bigG) layers, each with lora_down / lora_up / alpha."""
    from safetensors.torch import save_file

    layers = {f"lora_unet_{name.replace('.', '_')}": shape for name, shape in _sdxl_sgm_layers(model_dir).items()}
    for prefix, component in (("lora_te1_", "text_encoder"), ("lora_te2_", "text_encoder_2")):
        layers.update({prefix + name.replace(".", "_"): shape
                       for name, shape in _clip_layers(model_dir, component).items()})
    # alpha = rank / 2: the LoRA's scale (alpha / rank) is not 1, so its handling shows
    tensors = _kohya_tensors(layers, torch.Generator().manual_seed(seed), rank, std, alpha=rank / 2)
    out_file.parent.mkdir(parents=True, exist_ok=True)
    save_file(tensors, str(out_file))
    return out_file


def lightx2v_lora(model_dir: Path, out_file: Path, seed: int = 0, rank: int = 4, std: float = 0.3) -> Path:
    """A QwenImage LoRA in lightx2v's Lightning layout: no prefix, lora_down/lora_up and an alpha of rank / 8."""
    from safetensors.torch import save_file

    if _pipeline_class(model_dir).__name__ not in ("QwenImagePipeline", "QwenImageEditPipeline",
                                                   "QwenImageEditPlusPipeline"):
        raise ValueError(f"lightx2v LoRAs are made for QwenImage only, not {model_dir}")
    transformer = _load_transformer(model_dir)
    generator = torch.Generator().manual_seed(seed)
    tensors = {}
    for block in range(len(transformer.transformer_blocks)):
        for name in LIGHTX2V_LINEARS:
            key = f"transformer_blocks.{block}.{name}"
            layer = transformer.get_submodule(key)
            down, up = torch.empty(rank, layer.in_features), torch.empty(layer.out_features, rank)
            _random_(down, generator, std / layer.in_features ** 0.5)
            _random_(up, generator, 8 * std / rank ** 0.5)  # alpha / rank = 1/8 scales it down again
            tensors[f"{key}.lora_down.weight"], tensors[f"{key}.lora_up.weight"] = down, up
            tensors[f"{key}.alpha"] = torch.tensor(rank / 8)
    out_file.parent.mkdir(parents=True, exist_ok=True)
    save_file(tensors, str(out_file))
    return out_file


# Wan's original names of a block's linears that lightx2v's LoRAs change -> diffusers' WanTransformer3DModel names
WAN_LIGHTX2V_LINEARS = {
    **{f"{attn}.{o}": f"{ours}.{d}" for attn, ours in (("self_attn", "attn1"), ("cross_attn", "attn2"))
       for o, d in zip("qkvo", ("to_q", "to_k", "to_v", "to_out.0"))},
    "ffn.0": "ffn.net.0.proj", "ffn.2": "ffn.net.2"}


def wan_lightx2v_lora(model_dir: Path, out_file: Path, seed: int = 0, rank: int = 4, std: float = 0.3,
                      expert: str = "transformer") -> Path:
    """A Wan 2.2 LoRA in lightx2v's layout (`diffusion_model.blocks.N.self_attn.q.lora_down.weight`, alpha) for one
    expert (`transformer` = high noise, `transformer_2` = low noise), with that expert's layer widths."""
    import diffusers
    from safetensors.torch import save_file

    index = json.loads((model_dir / "model_index.json").read_text())
    if (index.get(expert) or [None])[0] != "diffusers":
        raise ValueError(f"{model_dir} has no {expert}")
    transformer = getattr(diffusers, index[expert][1]).from_pretrained(model_dir, subfolder=expert,
                                                                        local_files_only=True)
    generator = torch.Generator().manual_seed(seed)
    tensors = {}
    for block in range(len(transformer.blocks)):
        for original, name in WAN_LIGHTX2V_LINEARS.items():
            layer = transformer.get_submodule(f"blocks.{block}.{name}")
            key = f"diffusion_model.blocks.{block}.{original}"
            down, up = torch.empty(rank, layer.in_features), torch.empty(layer.out_features, rank)
            _random_(down, generator, std / layer.in_features ** 0.5)
            _random_(up, generator, 2 * std / rank ** 0.5)  # alpha / rank = 1/2 scales it down again
            tensors[f"{key}.lora_down.weight"], tensors[f"{key}.lora_up.weight"] = down, up
            tensors[f"{key}.alpha"] = torch.tensor(rank / 2)
    out_file.parent.mkdir(parents=True, exist_ok=True)
    save_file(tensors, str(out_file))
    return out_file


def zimage_comfyui_lora(model_dir: Path, out_file: Path, seed: int = 0, rank: int = 4) -> Path:
    """The diffusers LoRA renamed to ai-toolkit's Z-Image layout: `diffusion_model.` names and alpha = rank
    (a scale of 1, so it changes the model as the diffusers file does)."""
    from safetensors.torch import load_file, save_file

    layers = load_file(diffusers_lora(model_dir, out_file, seed, rank))
    tensors = {}
    for key, value in layers.items():
        name = "diffusion_model." + key.removeprefix("transformer.")
        tensors[name] = value
        if name.endswith(".lora_A.weight"):
            tensors[name.replace(".lora_A.weight", ".alpha")] = torch.tensor(float(rank))
    save_file(tensors, str(out_file))
    return out_file


# diffusers' Krea 2 module names -> Krea's (diffusers' _convert_non_diffusers_krea2_lora_to_diffusers, inverted)
KREA2_NAMES = {"transformer.": "diffusion_model.", "transformer_blocks.": "blocks.", "text_fusion.": "txtfusion.",
               ".attn.to_q.": ".attn.wq.", ".attn.to_k.": ".attn.wk.", ".attn.to_v.": ".attn.wv.",
               ".attn.to_out.0.": ".attn.wo."}


def _renamed_diffusers_lora(model_dir: Path, out_file: Path, names: dict[str, str], seed: int, rank: int) -> Path:
    """The diffusers LoRA with each `names` key replaced by its value in every tensor name (no alpha added)."""
    from safetensors.torch import load_file, save_file

    tensors = {}
    for key, value in load_file(diffusers_lora(model_dir, out_file, seed, rank)).items():
        for new, old in names.items():
            key = key.replace(new, old)
        tensors[key] = value
    save_file(tensors, str(out_file))
    return out_file


def krea2_comfyui_lora(model_dir: Path, out_file: Path, seed: int = 0, rank: int = 4) -> Path:
    """The diffusers LoRA renamed to the layout of Krea 2's LoRAs for ComfyUI (Krea's reference trainer): Krea's module
    names under `diffusion_model.`, `lora_A`/`lora_B` and no alpha, e.g. `diffusion_model.blocks.0.attn.wq.lora_A.weight`
    (and the text fusion blocks' `txtfusion.refiner_blocks.0.attn.wq`); diffusers' Krea 2 loader converts it."""
    return _renamed_diffusers_lora(model_dir, out_file, KREA2_NAMES, seed, rank)


def ltx2_comfyui_lora(model_dir: Path, out_file: Path, seed: int = 0, rank: int = 4) -> Path:
    """The diffusers LoRA in the layout of Lightricks' LTX-2 LoRAs (the distilled LoRA, ComfyUI's): the attention
    linears keep their names under `diffusion_model.`, `lora_A`/`lora_B` and no alpha, e.g.
    `diffusion_model.transformer_blocks.0.attn1.to_q.lora_A.weight`; diffusers' LTX-2 loader converts it."""
    return _renamed_diffusers_lora(model_dir, out_file, {"transformer.": "diffusion_model."}, seed, rank)


def minimax_h3_comfyui_lora(model_dir: Path, out_file: Path, seed: int = 0, rank: int = 4,
                            std: float = 0.3) -> Path:
    """A MiniMax H3 LoRA in ComfyUI's layout on every 2-D weight of the transformer in MiniMax's own names
    (tiny_single_files.minimax_h3_to_original), drawn at random, lora_A/lora_B, no alpha."""
    from safetensors.torch import save_file
    from tiny_single_files import folder_weights, minimax_h3_to_original

    original = minimax_h3_to_original(folder_weights(model_dir, "transformer"))
    layers = {f"diffusion_model.{key.removesuffix('.weight')}": tuple(value.shape)
              for key, value in sorted(original.items()) if key.endswith(".weight") and value.ndim == 2}
    tensors = {key.replace(".lora_down.", ".lora_A.").replace(".lora_up.", ".lora_B."): value for key, value
               in _kohya_tensors(layers, torch.Generator().manual_seed(seed), rank, std, alpha=None).items()}
    out_file.parent.mkdir(parents=True, exist_ok=True)
    save_file(tensors, str(out_file))
    return out_file


def build(model_dir, out_file, fmt: str = "diffusers", seed: int = 0, rank: int = 4,
          expert: str = "transformer") -> Path:
    """Write a LoRA for the tiny (or bench) pipeline in `model_dir` to `out_file`; returns out_file as a Path.
    `expert`: the Wan 2.2 expert a lightx2v LoRA is made for."""
    model_dir, out_file = Path(model_dir), Path(out_file)
    if fmt == "lightx2v" and _pipeline_class(model_dir).__name__ in ("WanPipeline", "WanImageToVideoPipeline"):
        return wan_lightx2v_lora(model_dir, out_file, seed, rank, expert=expert)
    if fmt == "diffusers":
        return diffusers_lora(model_dir, out_file, seed, rank)
    if fmt == "kohya" and _pipeline_class(model_dir).__name__ == "StableDiffusionXLPipeline":
        return sdxl_kohya_lora(model_dir, out_file, seed, rank)
    if fmt == "comfyui" and _pipeline_class(model_dir).__name__ == "ZImagePipeline":
        return zimage_comfyui_lora(model_dir, out_file, seed, rank)
    if fmt == "comfyui" and _pipeline_class(model_dir).__name__ == "Krea2Pipeline":
        return krea2_comfyui_lora(model_dir, out_file, seed, rank)
    if fmt == "comfyui" and _pipeline_class(model_dir).__name__ == "LTX2Pipeline":
        return ltx2_comfyui_lora(model_dir, out_file, seed, rank)
    if fmt == "comfyui" and _pipeline_class(model_dir).__name__ == "MiniMaxH3ModularPipeline":
        return minimax_h3_comfyui_lora(model_dir, out_file, seed, rank)
    if fmt in ("kohya", "comfyui"):
        return bfl_lora(model_dir, out_file, fmt, seed, rank)
    if fmt == "lightx2v":
        return lightx2v_lora(model_dir, out_file, seed, rank)
    raise ValueError(f"unknown format {fmt!r}; expected one of {FORMATS}")


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("model_dir", type=Path)
    parser.add_argument("out_file", type=Path)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--format", choices=FORMATS, default="diffusers")
    parser.add_argument("--rank", type=int, default=4)
    parser.add_argument("--expert", choices=("transformer", "transformer_2"), default="transformer",
                        help="Wan 2.2 lightx2v: the expert the LoRA is for (high noise, low noise)")
    args = parser.parse_args(argv)
    print(build(args.model_dir, args.out_file, args.format, args.seed, args.rank, args.expert))


if __name__ == "__main__":
    main()
