#!/usr/bin/env python3
"""Tiny LoRA files for the tiny pipelines of tools/tiny_models.py, made offline.

    python tools/tiny_loras.py MODEL_DIR OUT_FILE [--seed 0] [--format diffusers|kohya|comfyui] [--rank 4]

`diffusers` (every family): peft's `LoraConfig` on the transformer's attention linears (to_q, to_k, to_v,
to_out.0, where the family has them), lora_A and lora_B drawn at random from `seed` (B is not zero, so the
LoRA changes the image), saved with the pipeline class's own `save_lora_weights`.

`kohya` and `comfyui` (FLUX.1 only) name the layers as BFL's FLUX code does; that is what diffusers' kohya
converter reads: `lora_unet_double_blocks_0_img_attn_qkv.lora_down.weight` / `.lora_up.weight` / `.alpha`
(kohya's sd-scripts, plus CLIP's first attention as `lora_te1_...`), and
`diffusion_model.double_blocks.0.img_attn.qkv.lora_down.weight` / `.lora_up.weight` (what ComfyUI's LoraSave
writes; diffusers reads FLUX.1 ComfyUI LoRAs only with lora_down/lora_up names, not lora_A/lora_B).
Only four BFL layers are used: diffusers splits a single block's fused
`linear1` (q, k, v and the MLP) at FLUX.1's real widths (3072, 3072, 3072, 12288), which a tiny model does
not have; a double block's `qkv` is split in three equal parts, which works at any width.

`comfyui` for Z-Image is the layout ComfyUI users hold for it (ai-toolkit's, the common trainer): diffusers'
layer names under `diffusion_model.` with `lora_A`/`lora_B` and an `.alpha` per layer, e.g.
`diffusion_model.layers.0.attention.to_q.lora_A.weight`; diffusers' Z-Image loader converts it.
"""
from __future__ import annotations

import argparse
import json
from pathlib import Path

import torch

ATTENTION_LINEARS = ("to_q", "to_k", "to_v", "to_out.0")
FORMATS = ("diffusers", "kohya", "comfyui")


def _pipeline_class(model_dir: Path):
    import diffusers

    return getattr(diffusers, json.loads((model_dir / "model_index.json").read_text())["_class_name"])


def _load_transformer(model_dir: Path):
    import diffusers

    index = json.loads((model_dir / "model_index.json").read_text())
    cls = getattr(diffusers, index["transformer"][1])
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


def _clip_layers(model_dir: Path) -> dict[str, tuple[int, int]]:
    """The attention of CLIP's first layer (kohya's `lora_te1_`), so the kohya LoRA also changes a text encoder."""
    width = json.loads((model_dir / "text_encoder" / "config.json").read_text())["hidden_size"]
    return {f"text_model.encoder.layers.0.self_attn.{name}": (width, width)
            for name in ("q_proj", "k_proj", "v_proj", "out_proj")}


def bfl_lora(model_dir: Path, out_file: Path, style: str, seed: int = 0, rank: int = 4, std: float = 0.3) -> Path:
    """A FLUX.1 LoRA with BFL layer names: kohya's (`lora_unet_..`, with `.alpha`) or ComfyUI's
    (`diffusion_model...`, no alpha)."""
    from safetensors.torch import save_file

    if _pipeline_class(model_dir).__name__ != "FluxPipeline":
        raise ValueError(f"{style} LoRAs are made for FLUX.1 only, not {model_dir}")
    generator = torch.Generator().manual_seed(seed)
    tensors = {}
    layers = {f"lora_unet_{name.replace('.', '_')}" if style == "kohya" else f"diffusion_model.{name}": shape
              for name, shape in _flux1_bfl_layers(model_dir).items()}
    if style == "kohya":
        layers.update({f"lora_te1_{name.replace('.', '_')}": shape for name, shape in _clip_layers(model_dir).items()})
    for key, (out_features, in_features) in layers.items():
        down, up = torch.empty(rank, in_features), torch.empty(out_features, rank)
        _random_(down, generator, std / in_features ** 0.5)
        _random_(up, generator, std / rank ** 0.5)
        tensors[f"{key}.lora_down.weight"], tensors[f"{key}.lora_up.weight"] = down, up
        if style == "kohya":
            tensors[f"{key}.alpha"] = torch.tensor(float(rank))
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


def build(model_dir, out_file, fmt: str = "diffusers", seed: int = 0, rank: int = 4) -> Path:
    """Write a LoRA for the tiny (or bench) pipeline in `model_dir` to `out_file`; returns out_file as a Path."""
    model_dir, out_file = Path(model_dir), Path(out_file)
    if fmt == "diffusers":
        return diffusers_lora(model_dir, out_file, seed, rank)
    if fmt == "comfyui" and _pipeline_class(model_dir).__name__ == "ZImagePipeline":
        return zimage_comfyui_lora(model_dir, out_file, seed, rank)
    if fmt in ("kohya", "comfyui"):
        return bfl_lora(model_dir, out_file, fmt, seed, rank)
    raise ValueError(f"unknown format {fmt!r}; expected one of {FORMATS}")


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("model_dir", type=Path)
    parser.add_argument("out_file", type=Path)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--format", choices=FORMATS, default="diffusers")
    parser.add_argument("--rank", type=int, default=4)
    args = parser.parse_args(argv)
    print(build(args.model_dir, args.out_file, args.format, args.seed, args.rank))


if __name__ == "__main__":
    main()
