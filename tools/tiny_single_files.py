#!/usr/bin/env python3
"""Write ComfyUI-style single weight files from a tiny diffusers folder (tools/tiny_models.py), for tests.

The files use the real layouts and the usual names, so the loader meets what users download:
  FLUX.1 (Comfy-Org): flux1-dev.safetensors (BFL layout), clip_l.safetensors, t5xxl_fp16.safetensors,
                      t5xxl_fp8_e4m3fn_scaled.safetensors (ComfyUI's scaled fp8), ae.safetensors (LDM VAE)
  SD3.5 (Stability):  sd3.5_medium.safetensors (all-in-one, with T5), sd3.5_medium_no_t5.safetensors,
                      clip_l.safetensors, clip_g.safetensors, t5xxl_fp16.safetensors
  FLUX.2 (Comfy-Org): flux2_dev.safetensors (BFL layout), mistral_3_small_flux2.safetensors, flux2-vae.safetensors
  QwenImage:          qwen_image.safetensors, qwen_2.5_vl_7b_fp8_scaled.safetensors (both already in diffusers' /
                      transformers' key layout, as Comfy-Org ships them; the text encoder with its vision tower,
                      "visual.*" beside "model.*" as ComfyUI's Qwen25_7BVLI names them), qwen_image_vae.safetensors
                      (Wan 2.1 layout; the folder needs `wan_sized_vae` first), and for tests a text-only Qwen2.5-VL
                      file without the vision tower
  FLUX.1 Kontext/Fill: flux1-dev-kontext_fp8_scaled.safetensors (Comfy-Org, BFL layout, ComfyUI's older scaled
                      fp8), flux1-fill-dev.safetensors (BFL's, bf16, 384 input channels); text encoders and VAE
                      are FLUX.1-dev's (`flux1_files` of the wide folder)
  Qwen-Image-Edit:    qwen_image_edit_2509_fp8_e4m3fn.safetensors (plain fp8), qwen_image_edit_2511_bf16.safetensors,
                      with Qwen-Image's text encoder (vision tower included) and VAE files
  FLUX.2 [klein] 4B:  flux-2-klein-4b.safetensors and flux-2-klein-4b-fp8.safetensors (BFL layout, as FLUX.2 [dev]'s),
                      qwen_3_4b.safetensors (Qwen3, "model.*"), flux2-vae.safetensors, of `flux2_klein_wide`'s folder
                      (the real context width, which tells klein from [dev])
  Qwen-Image-2512:    qwen_image_2512_fp8_e4m3fn.safetensors (plain fp8), qwen_image_2512_bf16.safetensors
  Qwen-Image 2.1:     qwen_image_2.1_bf16.safetensors (ComfyUI's fused gate_up), qwen3vl_8b_bf16.safetensors,
                      qwen_image_2.1_vae_bf16.safetensors (diffusers' layout), qwen_image_2.1_int8_convrot.safetensors
  ComfyUI quantized:  `comfy_quantized`: every format of ComfyUI's comfy/quant_ops.py, quantized by comfy-kitchen,
                      `zimage_quantized_files`: Z-Image's files in each; `comfy_int8` (int8_tensorwise, per-row
                      scales, optionally ConvRot-rotated), and `unsupported_model_file`: an int8 ConvRot file of a model
                      TPU Diffusers does not run (diffusers' identifying keys only)
  SDXL (Stability):   sd_xl_base_1.0.safetensors (all-in-one: SGM UNet, LDM VAE, CLIP-L, OpenCLIP ViT-bigG in
                      OpenCLIP's layout), sdxl_vae.safetensors
  Z-Image (Comfy-Org): z_image_turbo_bf16.safetensors (ComfyUI's Lumina 2 / NextDiT layout), qwen_3_4b.safetensors
                      (Qwen3 named "model.layers...", no lm_head, as ComfyUI's Qwen3_4B), ae.safetensors (LDM VAE)
  Krea 2 (Comfy-Org): krea2_turbo_fp8_scaled.safetensors (Krea's original layout), qwen3vl_4b_fp8_scaled.safetensors
                      (ComfyUI's Qwen3-VL layout), both ComfyUI's newer scaled fp8 (the folder needs `krea2_turbo_folder`
                      first), qwen_image_vae.safetensors, krea2_turbo_int8_convrot.safetensors (Krea's layout)
  Wan 2.2 (Comfy-Org): wan2.2_{t2v,i2v}_{high,low}_noise_14B_{fp16,fp8_scaled}.safetensors and
                      wan2.2_ti2v_5B_fp16.safetensors (Wan's original layout, ComfyUI's older scaled fp8),
                      umt5_xxl_fp16.safetensors / umt5_xxl_fp8_e4m3fn_scaled.safetensors (HF T5 names plus the
                      SentencePiece model as a "spiece_model" tensor), wan_2.1_vae.safetensors (A14B; the folder
                      needs `wan_sized_vae` first) and wan2.2_vae.safetensors (TI2V-5B), in Wan's original layouts

diffusers has converters from these layouts but none back, so the inverse key mappings below are written
here, kept small: the tests check that diffusers' converters map every file back to exactly the folder's
weights. Text encoders are stored as transformers saves them (ComfyUI's files use that layout).

diffusers' FLUX.1 BFL converter hard-codes FLUX's width (3072), so `flux1_wide(out)` builds a FLUX.1-dev
folder whose transformer has the real width with one double and one single block (bf16, ~1 GB), and tiny
text encoders and VAE. `flux1_kontext_wide` and `flux1_fill_wide` derive the Kontext and Fill folders from it
(Kontext: the same weight files, hard-linked; Fill: a new 384-channel input layer, the rest of its weights).
"""
from __future__ import annotations

import math
import os
import re
import shutil
from pathlib import Path

import torch
from safetensors.torch import load_file, save_file


def folder_weights(folder, component: str) -> dict:
    """The state dict of one component of a diffusers folder (all its safetensors shards)."""
    out = {}
    for f in sorted(Path(folder, component).glob("*.safetensors")):
        out.update(load_file(f))
    return out


def _swap_halves(t):
    """BFL/SD3 store the final modulation as (shift, scale), diffusers as (scale, shift)."""
    a, b = t.chunk(2, dim=0)
    return torch.cat([b, a], dim=0)


# --------------------------------------------------------------------------------------- VAE (LDM)
VAE_RULES = [  # diffusers key pattern -> LDM key, applied in order (the first match wins)
    (r"^(encoder|decoder)\.mid_block\.resnets\.(\d)\.(.*)$", lambda m: f"{m[1]}.mid.block_{int(m[2]) + 1}.{m[3]}"),
    (r"^(encoder|decoder)\.mid_block\.attentions\.0\.group_norm\.(.*)$", lambda m: f"{m[1]}.mid.attn_1.norm.{m[2]}"),
    (r"^(encoder|decoder)\.mid_block\.attentions\.0\.to_(q|k|v)\.(.*)$", lambda m: f"{m[1]}.mid.attn_1.{m[2]}.{m[3]}"),
    (r"^(encoder|decoder)\.mid_block\.attentions\.0\.to_out\.0\.(.*)$", lambda m: f"{m[1]}.mid.attn_1.proj_out.{m[2]}"),
    (r"^encoder\.down_blocks\.(\d+)\.resnets\.(\d+)\.(.*)$", lambda m: f"encoder.down.{m[1]}.block.{m[2]}.{m[3]}"),
    (r"^encoder\.down_blocks\.(\d+)\.downsamplers\.0\.(.*)$", lambda m: f"encoder.down.{m[1]}.downsample.{m[2]}"),
    (r"^(encoder|decoder)\.conv_norm_out\.(.*)$", lambda m: f"{m[1]}.norm_out.{m[2]}"),
]


def vae_to_ldm(sd: dict, num_up_blocks: int) -> dict:
    """AutoencoderKL (and AutoencoderKLFlux2) keys -> the LDM layout of FLUX's ae.safetensors and SD3's
    first_stage_model. Decoder up blocks are numbered the other way round; attention projections are 1x1
    convolutions there."""
    rules = VAE_RULES + [
        (r"^decoder\.up_blocks\.(\d+)\.resnets\.(\d+)\.(.*)$",
         lambda m: f"decoder.up.{num_up_blocks - 1 - int(m[1])}.block.{m[2]}.{m[3]}"),
        (r"^decoder\.up_blocks\.(\d+)\.upsamplers\.0\.(.*)$",
         lambda m: f"decoder.up.{num_up_blocks - 1 - int(m[1])}.upsample.{m[2]}"),
    ]
    out = {}
    for key, value in sd.items():
        new = key
        for pattern, repl in rules:
            m = re.match(pattern, key)
            if m:
                new = repl(m)
                break
        new = new.replace("conv_shortcut", "nin_shortcut")
        if ".mid.attn_1." in new and new.endswith(".weight") and value.dim() == 2:
            value = value[:, :, None, None]
        out[new] = value
    return out


# ----------------------------------------------------------------------------- VAE (Wan 2.1 / QwenImage)
WAN_RESNET = {"norm1.gamma": "residual.0.gamma", "conv1.": "residual.2.", "norm2.gamma": "residual.3.gamma",
              "conv2.": "residual.6.", "conv_shortcut.": "shortcut."}


def _wan_resnet(rest: str) -> str:
    for d, w in WAN_RESNET.items():
        if rest.startswith(d):
            return w + rest[len(d):]
    return rest  # resample.*, time_conv.*


WAN_RULES = [  # diffusers key pattern -> Wan 2.1 key (qwen_image_vae.safetensors)
    (r"^(encoder|decoder)\.conv_in\.(.*)$", lambda m: f"{m[1]}.conv1.{m[2]}"),
    (r"^(encoder|decoder)\.norm_out\.(.*)$", lambda m: f"{m[1]}.head.0.{m[2]}"),
    (r"^(encoder|decoder)\.conv_out\.(.*)$", lambda m: f"{m[1]}.head.2.{m[2]}"),
    (r"^quant_conv\.(.*)$", lambda m: f"conv1.{m[1]}"),
    (r"^post_quant_conv\.(.*)$", lambda m: f"conv2.{m[1]}"),
    (r"^(encoder|decoder)\.mid_block\.resnets\.(\d)\.(.*)$",
     lambda m: f"{m[1]}.middle.{2 * int(m[2])}.{_wan_resnet(m[3])}"),
    (r"^(encoder|decoder)\.mid_block\.attentions\.0\.(.*)$", lambda m: f"{m[1]}.middle.1.{m[2]}"),
    (r"^encoder\.down_blocks\.(\d+)\.(.*)$", lambda m: f"encoder.downsamples.{m[1]}.{_wan_resnet(m[2])}"),
    # decoder.upsamples is flat: each up block is 3 resnets then its upsampler (num_res_blocks = 2, as Wan)
    (r"^decoder\.up_blocks\.(\d+)\.resnets\.(\d+)\.(.*)$",
     lambda m: f"decoder.upsamples.{4 * int(m[1]) + int(m[2])}.{_wan_resnet(m[3])}"),
    (r"^decoder\.up_blocks\.(\d+)\.upsamplers\.0\.(.*)$", lambda m: f"decoder.upsamples.{4 * int(m[1]) + 3}.{m[2]}"),
]


def vae_to_wan(sd: dict) -> dict:
    """AutoencoderKLQwenImage keys -> Wan 2.1's layout. diffusers' converter assumes Wan's shape (2 resnets
    per block, 4 blocks), so the folder's VAE must have it: see `wan_sized_vae`."""
    return renamed(sd, WAN_RULES, "Wan")


def renamed(sd: dict, rules, layout: str) -> dict:
    """sd with each key renamed by the first of `rules` ((regex, name from its match)) that matches it."""
    out = {}
    for key, value in sd.items():
        for pattern, repl in rules:
            m = re.match(pattern, key)
            if m:
                out[repl(m)] = value
                break
        else:
            raise ValueError(f"no {layout} name for {key}")
    return out


def wan_sized_vae(folder) -> None:
    """Replace a tiny QwenImage (or Wan 2.2 A14B) folder's VAE by one of its class with Wan 2.1's block structure
    (num_res_blocks=2, dim_mult 1,2,4,4) but base width 4 (0.24M parameters), which diffusers' Wan converter can
    read (it hard-codes that structure)."""
    import json

    import diffusers

    cls = getattr(diffusers, json.loads(Path(folder, "model_index.json").read_text())["vae"][1])
    torch.manual_seed(0)
    vae = cls(base_dim=4, z_dim=16, dim_mult=[1, 2, 4, 4], num_res_blocks=2, temperal_downsample=[False, True, True],
              latents_mean=[0.0] * 16, latents_std=[1.0] * 16)
    vae.save_pretrained(Path(folder, "vae"))


# ------------------------------------------------------------------------------ FLUX.1 transformer
FLUX_RENAMES = {  # diffusers prefix -> BFL prefix (whole tensors)
    "time_text_embed.timestep_embedder.linear_1": "time_in.in_layer",
    "time_text_embed.timestep_embedder.linear_2": "time_in.out_layer",
    "time_text_embed.text_embedder.linear_1": "vector_in.in_layer",
    "time_text_embed.text_embedder.linear_2": "vector_in.out_layer",
    "time_text_embed.guidance_embedder.linear_1": "guidance_in.in_layer",
    "time_text_embed.guidance_embedder.linear_2": "guidance_in.out_layer",
    "context_embedder": "txt_in",
    "x_embedder": "img_in",
    "proj_out": "final_layer.linear",
}
FLUX_DOUBLE = {  # inside transformer_blocks.N -> inside double_blocks.N
    "norm1.linear": "img_mod.lin", "norm1_context.linear": "txt_mod.lin",
    "attn.norm_q.weight": "img_attn.norm.query_norm.scale", "attn.norm_k.weight": "img_attn.norm.key_norm.scale",
    "attn.norm_added_q.weight": "txt_attn.norm.query_norm.scale",
    "attn.norm_added_k.weight": "txt_attn.norm.key_norm.scale",
    "attn.to_out.0": "img_attn.proj", "attn.to_add_out": "txt_attn.proj",
    "ff.net.0.proj": "img_mlp.0", "ff.net.2": "img_mlp.2", "ff_context.net.0.proj": "txt_mlp.0",
    "ff_context.net.2": "txt_mlp.2",
}
FLUX_SINGLE = {"norm.linear": "modulation.lin", "proj_out": "linear2", "attn.norm_q.weight": "norm.query_norm.scale",
               "attn.norm_k.weight": "norm.key_norm.scale"}


def _rename_block(sd, out, src, dst, table, fused):
    """Move the tensors of block `src` to `dst` by `table`; `fused` {bfl name: [diffusers names]} are
    concatenated along dim 0 (weights and biases)."""
    for name, parts in fused.items():
        for suffix in ("weight", "bias"):
            if f"{src}.{parts[0]}.{suffix}" in sd:
                out[f"{dst}.{name}.{suffix}"] = torch.cat([sd.pop(f"{src}.{p}.{suffix}") for p in parts])
    for key in [k for k in sd if k.startswith(src + ".")]:
        rest = key[len(src) + 1:]
        for d, b in table.items():
            if rest == d or rest.startswith(d + "."):
                out[f"{dst}.{b}{rest[len(d):]}"] = sd.pop(key)
                break


def flux_to_bfl(sd: dict) -> dict:
    """FluxTransformer2DModel keys -> BFL's original FLUX.1 layout (flux1-dev.safetensors)."""
    sd, out = dict(sd), {}
    for i in sorted({int(k.split(".")[1]) for k in sd if k.startswith("transformer_blocks.")}):
        _rename_block(sd, out, f"transformer_blocks.{i}", f"double_blocks.{i}", FLUX_DOUBLE, {
            "img_attn.qkv": ["attn.to_q", "attn.to_k", "attn.to_v"],
            "txt_attn.qkv": ["attn.add_q_proj", "attn.add_k_proj", "attn.add_v_proj"]})
    for i in sorted({int(k.split(".")[1]) for k in sd if k.startswith("single_transformer_blocks.")}):
        _rename_block(sd, out, f"single_transformer_blocks.{i}", f"single_blocks.{i}", FLUX_SINGLE, {
            "linear1": ["attn.to_q", "attn.to_k", "attn.to_v", "proj_mlp"]})
    for suffix in ("weight", "bias"):
        out[f"final_layer.adaLN_modulation.1.{suffix}"] = _swap_halves(sd.pop(f"norm_out.linear.{suffix}"))
    _rename_block({f"m.{k}": v for k, v in sd.items()}, out, "m", "", FLUX_RENAMES, {})
    out = {k.lstrip("."): v for k, v in out.items()}
    return out


# ------------------------------------------------------------------------------- SD3 transformer
SD3_TOP = {
    "pos_embed.pos_embed": "pos_embed", "pos_embed.proj": "x_embedder.proj",
    "time_text_embed.timestep_embedder.linear_1": "t_embedder.mlp.0",
    "time_text_embed.timestep_embedder.linear_2": "t_embedder.mlp.2",
    "time_text_embed.text_embedder.linear_1": "y_embedder.mlp.0",
    "time_text_embed.text_embedder.linear_2": "y_embedder.mlp.2",
    "context_embedder": "context_embedder", "proj_out": "final_layer.linear",
}
SD3_BLOCK = {
    "norm1.linear": "x_block.adaLN_modulation.1", "norm1_context.linear": "context_block.adaLN_modulation.1",
    "attn.norm_q": "x_block.attn.ln_q", "attn.norm_k": "x_block.attn.ln_k",
    "attn.norm_added_q": "context_block.attn.ln_q", "attn.norm_added_k": "context_block.attn.ln_k",
    "attn.to_out.0": "x_block.attn.proj", "attn.to_add_out": "context_block.attn.proj",
    "ff.net.0.proj": "x_block.mlp.fc1", "ff.net.2": "x_block.mlp.fc2",
    "ff_context.net.0.proj": "context_block.mlp.fc1", "ff_context.net.2": "context_block.mlp.fc2",
}


def sd3_to_mmdit(sd: dict) -> dict:
    """SD3Transformer2DModel keys -> Stability's MMDiT layout (without the checkpoint prefix). The last
    block's context modulation is an AdaLayerNormContinuous, stored (shift, scale) there."""
    sd, out = dict(sd), {}
    if any(".attn2." in k for k in sd):
        raise ValueError("dual-attention (SD3.5-medium attn2) blocks are not written by this tool")
    blocks = sorted({int(k.split(".")[1]) for k in sd if k.startswith("transformer_blocks.")})
    for i in blocks:
        src = f"transformer_blocks.{i}"
        if i == blocks[-1]:
            for suffix in ("weight", "bias"):
                out[f"joint_blocks.{i}.context_block.adaLN_modulation.1.{suffix}"] = _swap_halves(
                    sd.pop(f"{src}.norm1_context.linear.{suffix}"))
        _rename_block(sd, out, src, f"joint_blocks.{i}", SD3_BLOCK, {
            "x_block.attn.qkv": ["attn.to_q", "attn.to_k", "attn.to_v"],
            "context_block.attn.qkv": ["attn.add_q_proj", "attn.add_k_proj", "attn.add_v_proj"]})
    for suffix in ("weight", "bias"):
        out[f"final_layer.adaLN_modulation.1.{suffix}"] = _swap_halves(sd.pop(f"norm_out.linear.{suffix}"))
    _rename_block({f"m.{k}": v for k, v in sd.items()}, out, "m", "", SD3_TOP, {})
    return {k.lstrip("."): v for k, v in out.items()}


# ------------------------------------------------------------------------------ FLUX.2 transformer
FLUX2_RENAMES = {
    "x_embedder": "img_in", "context_embedder": "txt_in",
    "time_guidance_embed.timestep_embedder.linear_1": "time_in.in_layer",
    "time_guidance_embed.timestep_embedder.linear_2": "time_in.out_layer",
    "time_guidance_embed.guidance_embedder.linear_1": "guidance_in.in_layer",
    "time_guidance_embed.guidance_embedder.linear_2": "guidance_in.out_layer",
    "double_stream_modulation_img.linear": "double_stream_modulation_img.lin",
    "double_stream_modulation_txt.linear": "double_stream_modulation_txt.lin",
    "single_stream_modulation.linear": "single_stream_modulation.lin",
    "proj_out": "final_layer.linear",
}
FLUX2_DOUBLE = {
    "attn.norm_q.weight": "img_attn.norm.query_norm.scale", "attn.norm_k.weight": "img_attn.norm.key_norm.scale",
    "attn.norm_added_q.weight": "txt_attn.norm.query_norm.scale",
    "attn.norm_added_k.weight": "txt_attn.norm.key_norm.scale",
    "attn.to_out.0": "img_attn.proj", "attn.to_add_out": "txt_attn.proj",
    "ff.linear_in": "img_mlp.0", "ff.linear_out": "img_mlp.2", "ff_context.linear_in": "txt_mlp.0",
    "ff_context.linear_out": "txt_mlp.2",
}
FLUX2_SINGLE = {"attn.to_qkv_mlp_proj": "linear1", "attn.to_out": "linear2",
                "attn.norm_q.weight": "norm.query_norm.scale", "attn.norm_k.weight": "norm.key_norm.scale"}


def flux2_to_bfl(sd: dict) -> dict:
    """Flux2Transformer2DModel keys -> BFL's FLUX.2 layout (flux2_dev.safetensors)."""
    sd, out = dict(sd), {}
    for i in sorted({int(k.split(".")[1]) for k in sd if k.startswith("transformer_blocks.")}):
        _rename_block(sd, out, f"transformer_blocks.{i}", f"double_blocks.{i}", FLUX2_DOUBLE, {
            "img_attn.qkv": ["attn.to_q", "attn.to_k", "attn.to_v"],
            "txt_attn.qkv": ["attn.add_q_proj", "attn.add_k_proj", "attn.add_v_proj"]})
    for i in sorted({int(k.split(".")[1]) for k in sd if k.startswith("single_transformer_blocks.")}):
        _rename_block(sd, out, f"single_transformer_blocks.{i}", f"single_blocks.{i}", FLUX2_SINGLE, {})
    for suffix in ("weight", "bias"):
        if f"norm_out.linear.{suffix}" in sd:
            out[f"final_layer.adaLN_modulation.1.{suffix}"] = _swap_halves(sd.pop(f"norm_out.linear.{suffix}"))
    _rename_block({f"m.{k}": v for k, v in sd.items()}, out, "m", "", FLUX2_RENAMES, {})
    return {k.lstrip("."): v for k, v in out.items()}


# ---------------------------------------------------------------------------------- SDXL UNet (LDM/SGM)
UNET_RESNET = {"norm1": "in_layers.0", "conv1": "in_layers.2", "norm2": "out_layers.0", "conv2": "out_layers.3",
               "time_emb_proj": "emb_layers.1", "conv_shortcut": "skip_connection"}


def unet_to_ldm(sd: dict, layers_per_block: int) -> dict:
    """UNet2DConditionModel keys -> Stability's SGM layout of an SDXL checkpoint's model.diffusion_model (without
    the prefix): input_blocks.N are conv_in, then per level `layers_per_block` (resnet, attention) pairs and its
    downsampler; output_blocks.N one more pair per level, the upsampler after them; middle_block 0/1/2 are resnet,
    attention, resnet. The top-level names are diffusers' own mapping (DIFFUSERS_TO_LDM_MAPPING), inverted."""
    from diffusers.loaders.single_file_utils import DIFFUSERS_TO_LDM_MAPPING

    top = {**DIFFUSERS_TO_LDM_MAPPING["unet"]["layers"], **DIFFUSERS_TO_LDM_MAPPING["unet"]["addition_embed_type"]}
    out = {}
    for key, value in sd.items():
        if key in top:
            out[top[key]] = value
            continue
        parts = key.split(".")
        if parts[0] == "mid_block":
            kind, index, rest = parts[1], int(parts[2]), parts[3:]
            new = ["middle_block", str(1 if kind == "attentions" else 2 * index)]
        else:  # down_blocks / up_blocks . level . resnets|attentions|downsamplers|upsamplers . index . rest
            level, kind, index, rest = int(parts[1]), parts[2], int(parts[3]), parts[4:]
            down = parts[0] == "down_blocks"
            stride = layers_per_block + 1
            if kind in ("downsamplers", "upsamplers"):
                block = stride * (level + 1) if down else stride * level + layers_per_block
                has_attention = any(k.startswith(f"up_blocks.{level}.attentions.") for k in sd)
                sub = "0" if down else ("2" if has_attention else "1")
                rest = ["op", *rest[1:]] if down else rest
                new = ["input_blocks" if down else "output_blocks", str(block), sub]
            else:
                block = 1 + stride * level + index if down else stride * level + index
                new = ["input_blocks" if down else "output_blocks", str(block), "0" if kind == "resnets" else "1"]
        if kind == "resnets":
            rest = [UNET_RESNET.get(rest[0], rest[0]), *rest[1:]]
        out[".".join(new + rest)] = value
    return out


# ----------------------------------------------------------------------------- OpenCLIP text encoder
OPEN_CLIP_TOP = {"text_model.embeddings.position_embedding.weight": "positional_embedding",
                 "text_model.embeddings.token_embedding.weight": "token_embedding.weight",
                 "text_model.final_layer_norm.weight": "ln_final.weight",
                 "text_model.final_layer_norm.bias": "ln_final.bias"}
OPEN_CLIP_LAYER = {"layer_norm1": "ln_1", "layer_norm2": "ln_2", "mlp.fc1": "mlp.c_fc", "mlp.fc2": "mlp.c_proj",
                   "self_attn.out_proj": "attn.out_proj"}


def clip_to_open_clip(sd: dict) -> dict:
    """CLIPTextModelWithProjection keys -> OpenCLIP's text tower (an SDXL checkpoint's conditioner.embedders.1.model):
    q/k/v fused into attn.in_proj_weight/bias, text_projection a (width, projection) matrix, OpenCLIP's logit_scale."""
    sd = {k.removeprefix("text_model."): v for k, v in sd.items() if not k.endswith("position_ids")}
    out = {OPEN_CLIP_TOP[f"text_model.{k}"]: v for k, v in sd.items() if f"text_model.{k}" in OPEN_CLIP_TOP}
    out["text_projection"] = sd["text_projection.weight"].T.contiguous()
    out["logit_scale"] = torch.tensor(4.6052)
    for i in sorted({int(k.split(".")[2]) for k in sd if k.startswith("encoder.layers.")}):
        src, dst = f"encoder.layers.{i}", f"transformer.resblocks.{i}"
        for suffix in ("weight", "bias"):
            out[f"{dst}.attn.in_proj_{suffix}"] = torch.cat(
                [sd[f"{src}.self_attn.{p}_proj.{suffix}"] for p in ("q", "k", "v")])
            for d, o in OPEN_CLIP_LAYER.items():
                out[f"{dst}.{o}.{suffix}"] = sd[f"{src}.{d}.{suffix}"]
    return out


# ------------------------------------------------------------------------------ Z-Image transformer
ZIMAGE_RENAMES = {  # diffusers key part -> ComfyUI's NextDiT (comfy/ldm/lumina/model.py) key part
    "all_final_layer.2-1.": "final_layer.", "all_x_embedder.2-1.": "x_embedder.",
    ".attention.to_out.0.": ".attention.out.", ".attention.norm_q.": ".attention.q_norm.",
    ".attention.norm_k.": ".attention.k_norm.",
}


def zimage_to_comfy(sd: dict) -> dict:
    """ZImageTransformer2DModel keys -> ComfyUI's layout (z_image_turbo_bf16.safetensors): q, k and v fused
    into one qkv, and the top-level norm_final that NextDiT has and diffusers' converter drops."""
    sd, out = dict(sd), {}
    for key in [k for k in sd if k.endswith(".attention.to_q.weight")]:
        block = key[: -len(".to_q.weight")]
        out[f"{block}.qkv.weight"] = torch.cat([sd.pop(f"{block}.to_{p}.weight") for p in "qkv"])
    for key, value in sd.items():
        for d, c in ZIMAGE_RENAMES.items():
            key = key.replace(d, c)
        out[key] = value
    dim = sd["cap_pad_token"].shape[1]
    out["norm_final.weight"] = torch.ones(dim, dtype=sd["cap_pad_token"].dtype)
    return out


# ------------------------------------------------------------------------------------ scaled fp8
def scaled_fp8(sd: dict, new_format: bool = False) -> dict:
    """ComfyUI's scaled fp8 of every 2-D weight: stored = weight / scale as float8_e4m3fn, with a per-tensor
    scale. The older format marks the file with `scaled_fp8` and names the scale `<layer>.scale_weight`;
    the newer one names it `<layer>.weight_scale` beside a `<layer>.comfy_quant` JSON tensor."""
    import json

    out = {} if new_format else {"scaled_fp8": torch.empty(0, dtype=torch.float8_e4m3fn)}
    for key, value in sd.items():
        if _fp8_scaled(key, value):
            layer = key[: -len(".weight")]
            out[key], scale = _to_scaled_fp8(value)
            out[f"{layer}.weight_scale" if new_format else f"{layer}.scale_weight"] = scale
            if new_format:
                out[f"{layer}.comfy_quant"] = torch.tensor(list(json.dumps({"format": "float8_e4m3fn"}).encode()),
                                                           dtype=torch.uint8)
        else:
            out[key] = value
    return out


def _fp8_scaled(key: str, value) -> bool:
    """What `scaled_fp8` stores as fp8: every 2-D weight."""
    return key.endswith(".weight") and value.dim() == 2 and value.is_floating_point()


def _to_scaled_fp8(value):
    """(stored float8_e4m3fn, scale): stored = weight / scale, one scale per tensor (its largest value -> 448)."""
    scale = value.float().abs().max().clamp(min=1e-12) / 448.0
    return (value.float() / scale).to(torch.float8_e4m3fn), scale.reshape(())


def fp8_valued(sd: dict) -> dict:
    """The weights as `scaled_fp8` of them holds them (stored x scale, float32), in any key layout: a folder with
    these weights is exactly the model its scaled fp8 files load as."""
    def value_of(key, value):
        if not _fp8_scaled(key, value):
            return value
        stored, scale = _to_scaled_fp8(value)
        return stored.to(torch.float32) * scale

    return {key: value_of(key, value) for key, value in sd.items()}


def plain_fp8(sd: dict) -> dict:
    """Comfy-Org's plain fp8 files (qwen_image_edit_2509_fp8_e4m3fn): every 2-D weight cast to
    float8_e4m3fn without a scale; norms and biases stay as they are."""
    return {k: v.to(torch.float8_e4m3fn) if k.endswith(".weight") and v.dim() == 2 and v.is_floating_point() else v
            for k, v in sd.items()}


# ------------------------------------------------------------------------- ComfyUI's quantized formats
CONVROT_GROUP = 256  # ComfyUI rotates a layer only when its input width is a multiple of this
# {file name part: (comfy_quant format, comfy-kitchen layout, quantize options, the input-width group it quantizes
# in, whether it rotates groups of ConvRot's group size)}. The JSON beside each layer is what comfy/ops.py writes.
QUANT_KINDS = {
    "fp8_e4m3fn_scaled": ("float8_e4m3fn", "TensorCoreFP8Layout", {}, 1, False),
    "fp8_e5m2_scaled": ("float8_e5m2", "TensorCoreFP8Layout", {"dtype": torch.float8_e5m2}, 1, False),
    "nvfp4": ("nvfp4", "TensorCoreNVFP4Layout", {}, 16, False),
    "nvfp4_awq": ("nvfp4", "TensorCoreNVFP4Layout", {}, 16, False),
    "mxfp8": ("mxfp8", "TensorCoreMXFP8Layout", {}, 32, False),
    "int8": ("int8_tensorwise", "TensorWiseINT8Layout", {"per_channel": True}, 1, False),
    "int8_convrot": ("int8_tensorwise", "TensorWiseINT8Layout", {"per_channel": True, "convrot": True}, 1, True),
    "convrot_w4a4": ("convrot_w4a4", "TensorCoreConvRotW4A4Layout", {}, 64, True),
    "w4a8": ("asym_w4a8_int8", "AsymW4A8Int8Layout", {"group_size": 16}, 16, True),
    "awq_w4a16": ("awq_w4a16", "TensorCoreAWQW4A16Layout", {}, 64, False),
}
AWQ_GROUP = 64


def _layer_json(fmt: str, options: dict, group: int) -> dict:
    """The `<layer>.comfy_quant` JSON comfy/ops.py (_quantized_weight_state_dict) writes for the format."""
    conf = {"format": fmt}
    if options.get("convrot"):
        conf.update(convrot=True, convrot_groupsize=group)
    elif fmt == "convrot_w4a4":
        conf["convrot_groupsize"] = group
    elif fmt == "asym_w4a8_int8":
        conf.update(group_size=options["group_size"], convrot_groupsize=group)
    elif fmt == "awq_w4a16":
        conf["group_size"] = AWQ_GROUP
    return conf


def _fits(layout, shape, multiple: int) -> bool:
    """Whether the layer quantizes without padding (a file cannot tell a padded layer's width), as the big models'
    layers all do; the others stay bf16, as in ComfyUI's "mixed" files."""
    padded = getattr(layout, "get_padded_shape", lambda s: s)(shape)
    return shape[1] % multiple == 0 and tuple(padded) == tuple(shape)


def _awq_w4a16(weight: torch.Tensor) -> dict:
    """AWQ W4A16 (offline-calibrated, so comfy-kitchen has no quantizer): uint4 codes per group of 64 inputs
    with a float scale and zero per group, W = (q - 8) * scale + zero, two codes per byte (low nibble first),
    scales and zeros [in / 64, out] in bf16, the tensors comfy/ops.py reads."""
    n, k = weight.shape
    groups = weight.float().reshape(n, k // AWQ_GROUP, AWQ_GROUP)
    low, high = groups.amin(-1), groups.amax(-1)
    scale = ((high - low) / 15).clamp(min=1e-8).to(torch.bfloat16)
    zeros = (low + 8 * scale.float()).to(torch.bfloat16)
    codes = torch.round((groups - zeros.float()[..., None]) / scale.float()[..., None] + 8).clamp(0, 15)
    codes = codes.reshape(n, k).to(torch.uint8)
    packed = (codes[:, 0::2] | (codes[:, 1::2] << 4)).view(torch.int8)
    return {"": packed, "_scale": scale.t().contiguous(), "_zeros": zeros.t().contiguous()}


def _layer_kind(kind: str, shape, convrot_group: int):
    """The QUANT_KINDS entry a 2-D weight of `shape` is written in, with its quantize options and JSON: `kind`'s
    when the layer fits it; in an int8 ConvRot file a layer whose input width is no multiple of the group is plain
    int8, as ComfyUI writes it; else None (kept bf16, as in ComfyUI's "mixed" files)."""
    from comfy_kitchen.tensor import get_layout_class

    for candidate in (kind, "int8") if kind == "int8_convrot" else (kind,):
        fmt, layout_name, options, multiple, rotated = QUANT_KINDS[candidate]
        if rotated:
            options, multiple = {**options, "convrot_groupsize": convrot_group}, math.lcm(multiple, convrot_group)
        layout = get_layout_class(layout_name)
        if _fits(layout, shape, multiple):
            return layout, options, _layer_json(fmt, options, convrot_group)
    return None


def comfy_quantized(sd: dict, kind: str, convrot_group: int = CONVROT_GROUP) -> dict:
    """A state dict as ComfyUI writes a quantized file of `kind` (QUANT_KINDS): each 2-D weight that fits the
    format quantized by comfy-kitchen's own quantizer (`Layout.quantize`), stored under the names
    `Layout.state_dict_tensors` gives (`<layer>.weight`, `.weight_scale`, ...) beside its `<layer>.comfy_quant`
    JSON; the rest in bf16. "nvfp4_awq" also smooths each layer's inputs (ModelOpt AWQ): the file holds
    quantize(W / s) and `<layer>.pre_quant_scale` s, which ComfyUI multiplies the layer's input by."""
    import json

    generator = torch.Generator().manual_seed(0)
    out = {}
    for key, value in sd.items():
        chosen = _layer_kind(kind, tuple(value.shape), convrot_group) if (
            key.endswith(".weight") and value.dim() == 2 and value.is_floating_point()) else None
        if chosen is None:
            out[key] = value.to(torch.bfloat16) if value.is_floating_point() else value
            continue
        (layout, options, conf), layer, weight = chosen, key[: -len(".weight")], value.to(torch.bfloat16)
        if kind == "nvfp4_awq":
            smooth = (torch.rand(weight.shape[1], generator=generator) + 0.5).to(torch.bfloat16)
            out[f"{layer}.pre_quant_scale"] = smooth
            weight = (weight.float() / smooth.float()).to(torch.bfloat16)
        tensors = _awq_w4a16(weight) if conf["format"] == "awq_w4a16" else layout.state_dict_tensors(
            *layout.quantize(weight, **options))
        out.update({f"{key}{suffix}": t for suffix, t in tensors.items() if t is not None})
        out[f"{layer}.comfy_quant"] = torch.tensor(list(json.dumps(conf).encode()), dtype=torch.uint8)
    return out


def comfy_valued(sd: dict, kind: str, convrot_group: int = CONVROT_GROUP) -> dict:
    """The weights as a `comfy_quantized` file of them holds them, dequantized as comfy-kitchen (and so the loader)
    does in float32: a folder with these weights is exactly the model its files of `kind` load as."""
    import dataclasses

    def value_of(key, value):
        chosen = _layer_kind(kind, tuple(value.shape), convrot_group) if (
            key.endswith(".weight") and value.dim() == 2 and value.is_floating_point()) else None
        if chosen is None:
            return value.to(torch.bfloat16).float() if value.is_floating_point() else value
        (layout, options, _) = chosen
        qdata, params = layout.quantize(value.to(torch.bfloat16), **options)
        return layout.dequantize(qdata, dataclasses.replace(params, orig_dtype=torch.float32))

    return {key: value_of(key, value) for key, value in sd.items()}


def comfy_int8(sd: dict, convrot: bool = False) -> dict:
    """ComfyUI's int8 files (int8_tensorwise, a float32 scale per output row; with `convrot` the "int8_convrot"
    files, whose layers with an input width that is a multiple of 256 are Hadamard-rotated per group of 256)."""
    return comfy_quantized(sd, "int8_convrot" if convrot else "int8")


def qwen_image21_layout(sd: dict) -> dict:
    """Qwen-Image 2.1's ComfyUI layout: diffusers' names with each block's SwiGLU gate and up projections fused
    into one `img_mlp.gate_up` (gate rows first; diffusers' converter splits it)."""
    out = {}
    for key, value in sd.items():
        if ".img_mlp.gate_layer." in key:
            out[key.replace("gate_layer", "gate_up")] = torch.cat([value, sd[key.replace("gate_layer", "proj")]])
        elif ".img_mlp.proj." not in key:
            out[key] = value
    return out


KREA2_PREFIXES = {"img_in.": "first.", "time_embed.linear_1.": "tmlp.0.", "time_embed.linear_2.": "tmlp.2.",
                  "time_mod_proj.": "tproj.1.", "txt_in.norm.weight": "txtmlp.0.scale", "txt_in.linear_1.": "txtmlp.1.",
                  "txt_in.linear_2.": "txtmlp.3.", "text_fusion.": "txtfusion.", "transformer_blocks.": "blocks.",
                  "final_layer.linear.": "last.linear.", "final_layer.norm.weight": "last.norm.scale",
                  "final_layer.scale_shift_table": "last.modulation.lin"}
KREA2_BLOCK_PARTS = {".attn.to_q.": ".attn.wq.", ".attn.to_k.": ".attn.wk.", ".attn.to_v.": ".attn.wv.",
                     ".attn.to_out.0.": ".attn.wo.", ".attn.to_gate.": ".attn.gate.",
                     ".attn.norm_q.weight": ".attn.qknorm.qnorm.scale",
                     ".attn.norm_k.weight": ".attn.qknorm.knorm.scale",
                     ".ff.": ".mlp.", ".norm1.weight": ".prenorm.scale", ".norm2.weight": ".postnorm.scale",
                     ".scale_shift_table": ".mod.lin"}


def krea2_layout(sd: dict) -> dict:
    """Krea 2's original layout (what diffusers' krea2 converter reads): blocks.N.attn.wq, txtfusion., first., ...;
    a block's six modulation vectors flattened into one."""
    out = {}
    for key, value in sd.items():
        if key.startswith("transformer_blocks.") and key.endswith(".scale_shift_table"):
            value = value.reshape(-1)
        for new, old in KREA2_BLOCK_PARTS.items():
            if not key.startswith("final_layer."):
                key = key.replace(new, old)
        prefix = next((p for p in KREA2_PREFIXES if key.startswith(p)), None)
        out[KREA2_PREFIXES[prefix] + key[len(prefix):] if prefix else key] = value
    return out


def unsupported_model_file(model_type: str, path) -> Path:
    """A ComfyUI int8 ConvRot file of a model TPU Diffusers does not run from files (a diffusers model type of
    families.UNSUPPORTED_MODEL_TYPES, or of a family without single files): diffusers' identifying keys of it (CHECKPOINT_KEY_NAMES) beside one int8
    ConvRot layer, all the header checks read."""
    from diffusers.loaders.single_file_utils import CHECKPOINT_KEY_NAMES

    names = CHECKPOINT_KEY_NAMES[model_type]
    sd = {name: torch.zeros(4) for name in ([names] if isinstance(names, str) else names)}
    torch.manual_seed(0)
    sd.update(comfy_quantized({"blocks.0.proj.weight": torch.randn(32, 32)}, "int8_convrot", 16))
    return _save(sd, Path(path))

# ------------------------------------------------------------------------------------------ Wan 2.2
WAN_NAMES = (  # diffusers key part -> Wan's original (diffusers' convert_wan_transformer_to_diffusers, inverted)
    ("condition_embedder.time_embedder.linear_1.", "time_embedding.0."),
    ("condition_embedder.time_embedder.linear_2.", "time_embedding.2."),
    ("condition_embedder.text_embedder.linear_1.", "text_embedding.0."),
    ("condition_embedder.text_embedder.linear_2.", "text_embedding.2."),
    ("condition_embedder.time_proj.", "time_projection.1."),
    (".attn1.", ".self_attn."), (".attn2.", ".cross_attn."),
    (".to_out.0.", ".o."), (".to_q.", ".q."), (".to_k.", ".k."), (".to_v.", ".v."),
    (".ffn.net.0.proj.", ".ffn.0."), (".ffn.net.2.", ".ffn.2."),
    ("proj_out.", "head.head."),
)


def wan_to_original(sd: dict) -> dict:
    """WanTransformer3DModel keys -> Wan's original layout (ComfyUI's comfy/ldm/wan/model.py, Comfy-Org's
    wan2.2_*_14B / 5B files): blocks.N.self_attn.q, cross_attn, ffn.0, modulation, head.head, head.modulation;
    diffusers' norm2 (the cross-attention norm) is the original's norm3."""
    out = {}
    for key, value in sd.items():
        key = "head.modulation" if key == "scale_shift_table" else key.replace(".scale_shift_table", ".modulation")
        for d, o in WAN_NAMES:
            key = key.replace(d, o)
        out[re.sub(r"^(blocks\.\d+)\.norm2\.", r"\1.norm3.", key)] = value
    return out


def vae22_to_wan(sd: dict) -> dict:
    """AutoencoderKLWan(is_residual=True) keys (Wan 2.2's VAE) -> its original layout (ComfyUI's
    comfy/ldm/wan/vae2_2.py, wan2.2_vae.safetensors): each down/up block a Sequential `downsamples` / `upsamples`
    of resnets, then its resampler."""
    resnets = {}
    for key in sd:
        m = re.match(r"^(encoder\.down|decoder\.up)_blocks\.(\d+)\.resnets\.(\d+)\.", key)
        if m:
            resnets[m[1], m[2]] = max(resnets.get((m[1], m[2]), 0), int(m[3]) + 1)
    rules = [
        (r"^(encoder|decoder)\.conv_in\.(.*)$", lambda m: f"{m[1]}.conv1.{m[2]}"),
        (r"^(encoder|decoder)\.norm_out\.(.*)$", lambda m: f"{m[1]}.head.0.{m[2]}"),
        (r"^(encoder|decoder)\.conv_out\.(.*)$", lambda m: f"{m[1]}.head.2.{m[2]}"),
        (r"^quant_conv\.(.*)$", lambda m: f"conv1.{m[1]}"),
        (r"^post_quant_conv\.(.*)$", lambda m: f"conv2.{m[1]}"),
        (r"^(encoder|decoder)\.mid_block\.resnets\.(\d)\.(.*)$",
         lambda m: f"{m[1]}.middle.{2 * int(m[2])}.{_wan_resnet(m[3])}"),
        (r"^(encoder|decoder)\.mid_block\.attentions\.0\.(.*)$", lambda m: f"{m[1]}.middle.1.{m[2]}"),
        (r"^(encoder\.down|decoder\.up)_blocks\.(\d+)\.resnets\.(\d+)\.(.*)$",
         lambda m: f"{m[1]}samples.{m[2]}.{m[1].split('.')[1]}samples.{m[3]}.{_wan_resnet(m[4])}"),
        (r"^(encoder\.down|decoder\.up)_blocks\.(\d+)\.(down|up)sampler\.(.*)$",
         lambda m: f"{m[1]}samples.{m[2]}.{m[3]}samples.{resnets[m[1], m[2]]}.{m[4]}"),
    ]
    return renamed(sd, rules, "Wan 2.2")


def umt5_file_layout(folder) -> dict:
    """ComfyUI's UMT5-XXL files (umt5_xxl_fp16 / fp8_e4m3fn_scaled): transformers' T5 names ("shared.weight",
    "encoder.block.N.layer...") and the tokenizer's SentencePiece model as a uint8 "spiece_model" tensor, which
    ComfyUI's Wan text encoder loader reads its tokenizer from."""
    spiece = Path(folder, "tokenizer", "spiece.model").read_bytes()
    return {**folder_weights(folder, "text_encoder"),
            "spiece_model": torch.frombuffer(bytearray(spiece), dtype=torch.uint8)}


# Comfy-Org's diffusion-model file names of each Wan 2.2 model: {folder component: name without the precision}
WAN22_MODEL_FILES = {
    "t2v": {"transformer": "wan2.2_t2v_high_noise_14B", "transformer_2": "wan2.2_t2v_low_noise_14B"},
    "i2v": {"transformer": "wan2.2_i2v_high_noise_14B", "transformer_2": "wan2.2_i2v_low_noise_14B"},
    "ti2v": {"transformer": "wan2.2_ti2v_5B"},
}


def wan22_files(folder, out, model: str) -> dict[str, Path]:
    """Comfy-Org's Wan 2.2 files of a tiny `model` ("t2v", "i2v" A14B or "ti2v" 5B) folder: each diffusion model
    as <name>_fp16 (the folder's weights, as t5xxl_fp16's) and, A14B's, <name>_fp8_scaled (ComfyUI's older scaled fp8), keyed
    by its component (and component + "_fp8"); the UMT5 files; wan_2.1_vae (A14B: the folder needs `wan_sized_vae`)
    or wan2.2_vae (TI2V-5B)."""
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    files = {}
    for component, name in WAN22_MODEL_FILES[model].items():
        original = wan_to_original(folder_weights(folder, component))
        files[component] = _save(original, out / f"{name}_fp16.safetensors")
        if model != "ti2v":  # Comfy-Org ships TI2V-5B in fp16 only
            files[f"{component}_fp8"] = _save(scaled_fp8(original), out / f"{name}_fp8_scaled.safetensors")
    umt5 = umt5_file_layout(folder)
    files["text_encoder"] = _save(umt5, out / "umt5_xxl_fp16.safetensors")
    files["text_encoder_fp8"] = _save(scaled_fp8(umt5), out / "umt5_xxl_fp8_e4m3fn_scaled.safetensors")
    vae = folder_weights(folder, "vae")
    files["vae"] = (_save(vae22_to_wan(vae), out / "wan2.2_vae.safetensors") if model == "ti2v"
                    else _save(vae_to_wan(vae), out / "wan_2.1_vae.safetensors"))
    return files


# ---------------------------------------------------------------------------------------- writers
def clip_file_layout(sd: dict) -> dict:
    """ComfyUI's (and OpenAI's HF) CLIP files name the text model 'text_model.'; transformers 5 saves a
    CLIPTextModel without that prefix."""
    return {k if k.startswith(("text_model.", "text_projection")) else "text_model." + k: v for k, v in sd.items()}


def _save(sd: dict, path: Path) -> Path:
    save_file({k: v.contiguous() for k, v in sd.items()}, str(path))
    return path


def _prefixed(sd: dict, prefix: str) -> dict:
    return {prefix + k: v for k, v in sd.items()}


def flux1_files(folder, out) -> dict[str, Path]:
    """Comfy-Org FLUX.1 files; the transformer file only when the folder's transformer has FLUX's width."""
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    files = {
        "clip_l": _save(clip_file_layout(folder_weights(folder, "text_encoder")), out / "clip_l.safetensors"),
        "t5xxl": _save(folder_weights(folder, "text_encoder_2"), out / "t5xxl_fp16.safetensors"),
        "t5xxl_fp8": _save(scaled_fp8(folder_weights(folder, "text_encoder_2")),
                           out / "t5xxl_fp8_e4m3fn_scaled.safetensors"),
        "ae": _save(vae_to_ldm(folder_weights(folder, "vae"), 4), out / "ae.safetensors"),
    }
    transformer = folder_weights(folder, "transformer")
    if transformer["x_embedder.weight"].shape[0] == 3072:
        bfl = flux_to_bfl(transformer)
        files["transformer"] = _save(bfl, out / "flux1-dev.safetensors")
        files["transformer_fp8"] = _save(scaled_fp8(bfl, new_format=True), out / "flux1-dev-fp8-scaled.safetensors")
    return files


def sd3_files(folder, out) -> dict[str, Path]:
    """Stability's SD3.5 all-in-one checkpoints (with and without T5) and its separate text encoders."""
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    clip_l, clip_g = (clip_file_layout(folder_weights(folder, n)) for n in ("text_encoder", "text_encoder_2"))
    t5 = folder_weights(folder, "text_encoder_3")
    base = {**_prefixed(sd3_to_mmdit(folder_weights(folder, "transformer")), "model.diffusion_model."),
            **_prefixed(vae_to_ldm(folder_weights(folder, "vae"), 4), "first_stage_model."),
            **_prefixed(clip_l, "text_encoders.clip_l.transformer."),
            **_prefixed(clip_g, "text_encoders.clip_g.transformer.")}
    return {
        "checkpoint": _save({**base, **_prefixed(t5, "text_encoders.t5xxl.transformer.")}, out / "sd3.5_medium.safetensors"),
        "checkpoint_no_t5": _save(base, out / "sd3.5_medium_no_t5.safetensors"),
        "clip_l": _save(clip_l, out / "clip_l.safetensors"),
        "clip_g": _save(clip_g, out / "clip_g.safetensors"),
        "t5xxl": _save(t5, out / "t5xxl_fp16.safetensors"),
    }


def sdxl_files(folder, out) -> dict[str, Path]:
    """An SDXL all-in-one checkpoint in Stability's layout (sd_xl_base_1.0.safetensors: SGM UNet, LDM VAE, CLIP-L
    as transformers saves it, OpenCLIP ViT-bigG in OpenCLIP's layout) and a separate VAE (sdxl_vae.safetensors)."""
    import json

    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    layers_per_block = json.loads(Path(folder, "unet", "config.json").read_text())["layers_per_block"]
    vae = vae_to_ldm(folder_weights(folder, "vae"), 4)
    clip_l = clip_file_layout(folder_weights(folder, "text_encoder"))
    open_clip = clip_to_open_clip(folder_weights(folder, "text_encoder_2"))
    checkpoint = {**_prefixed(unet_to_ldm(folder_weights(folder, "unet"), layers_per_block), "model.diffusion_model."),
                  **_prefixed(vae, "first_stage_model."), **_prefixed(clip_l, "conditioner.embedders.0.transformer."),
                  **_prefixed(open_clip, "conditioner.embedders.1.model.")}
    return {"checkpoint": _save(checkpoint, out / "sd_xl_base_1.0.safetensors"),
            "vae": _save(vae, out / "sdxl_vae.safetensors")}


def mistral_text_only(sd: dict) -> dict:
    """Only the language model of Mistral 3, named as a plain causal LM ("model.layers..."), the way
    ComfyUI's own Mistral code names it; the vision tower and projector that text-to-image never runs
    are left out."""
    prefix = "language_model."
    return {k[len(prefix):]: v for k, v in sd.items() if k.startswith(prefix + "model.")}


def flux2_files(folder, out) -> dict[str, Path]:
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    return {
        "transformer": _save(flux2_to_bfl(folder_weights(folder, "transformer")), out / "flux2_dev.safetensors"),
        "text_encoder": _save(folder_weights(folder, "text_encoder"), out / "mistral_3_small_flux2.safetensors"),
        "text_encoder_text_only": _save(mistral_text_only(folder_weights(folder, "text_encoder")),
                                        out / "mistral_3_small_flux2_text_only.safetensors"),
        "vae": _save(vae_to_ldm(folder_weights(folder, "vae"), 4), out / "flux2-vae.safetensors"),
    }


def flux2_klein_wide(out) -> Path:
    """A FLUX.2 [klein] 4B folder whose context embedder takes the real width 7680 (3 x Qwen3-4B's 2560: what
    tells a klein file from a FLUX.2 [dev] one), with a tiny transformer otherwise and a ~40 MB text encoder."""
    import tiny_models

    pipe, raw = tiny_models.flux2_klein("tiny", text_width=2560)
    return tiny_models.save(pipe, raw, out)


def qwen3_file_layout(sd: dict) -> dict:
    """ComfyUI's Qwen3 text encoder files (qwen_3_4b.safetensors): the language model as transformers names it
    ("model.embed_tokens", "model.layers.N...", "model.norm"), no lm_head (Qwen3-4B ties it to the embedding)."""
    return {k: v for k, v in sd.items() if k.startswith("model.")}


def flux2_klein_files(folder, out) -> dict[str, Path]:
    """Comfy-Org's FLUX.2 [klein] 4B files: flux-2-klein-4b.safetensors (BFL layout, the folder's dtype),
    flux-2-klein-4b-fp8.safetensors (ComfyUI's newer scaled fp8), qwen_3_4b.safetensors, flux2-vae.safetensors;
    and, for detection only, flux-2-klein-9b.safetensors: the 4B file with 9B's context width (3 x Qwen3-8B's
    4096)."""
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    bfl = flux2_to_bfl(folder_weights(folder, "transformer"))
    nine_b = dict(bfl, **{"txt_in.weight": torch.zeros(bfl["txt_in.weight"].shape[0], 3 * 4096)})
    return {
        "transformer": _save(bfl, out / "flux-2-klein-4b.safetensors"),
        "transformer_fp8": _save(scaled_fp8(bfl, new_format=True), out / "flux-2-klein-4b-fp8.safetensors"),
        "transformer_9b": _save(nine_b, out / "flux-2-klein-9b.safetensors"),
        "text_encoder": _save(qwen3_file_layout(folder_weights(folder, "text_encoder")), out / "qwen_3_4b.safetensors"),
        "vae": _save(vae_to_ldm(folder_weights(folder, "vae"), 4), out / "flux2-vae.safetensors"),
    }


# The parts of a Qwen2.5-VL file that only image inputs run: ComfyUI's Qwen25_7BVLI names its vision tower
# "visual." (visual.patch_embed.proj, visual.blocks.N.{norm1,norm2,attn.qkv,attn.proj,mlp.*_proj},
# visual.merger.{ln_q,mlp.0,mlp.2}) beside the language model's "model." (comfy/text_encoders/llama.py, qwen_vl.py).
QWEN_VISION_PREFIX = "visual."


def qwen_text_only(sd: dict) -> dict:
    """A Qwen2.5-VL text encoder file without its vision tower: what text to image runs."""
    return {k: v for k, v in sd.items() if not k.startswith(QWEN_VISION_PREFIX)}


def _qwen_text_encoder_and_vae(folder, out: Path) -> dict[str, Path]:
    """Qwen-Image's text encoder (vision tower included: transformers saves Qwen2.5-VL in the original
    "model." / "visual." layout, the one Comfy-Org's file has) and VAE files."""
    return {
        "text_encoder": _save(folder_weights(folder, "text_encoder"), out / "qwen_2.5_vl_7b_fp8_scaled.safetensors"),
        "vae": _save(vae_to_wan(folder_weights(folder, "vae")), out / "qwen_image_vae.safetensors"),
    }


def qwenimage_files(folder, out) -> dict[str, Path]:
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    return {
        "transformer": _save(folder_weights(folder, "transformer"), out / "qwen_image.safetensors"),
        **_qwen_text_encoder_and_vae(folder, out),
        "text_encoder_text_only": _save(qwen_text_only(folder_weights(folder, "text_encoder")),
                                        out / "qwen_2.5_vl_7b_text_only.safetensors"),
    }


# Comfy-Org's Qwen-Image-Edit-2509 / 2511 diffusion models: (file name, how its weights are stored).
QWEN_EDIT_FILES = {"2509": ("qwen_image_edit_2509_fp8_e4m3fn.safetensors", plain_fp8),
                   "2511": ("qwen_image_edit_2511_bf16.safetensors",
                            lambda sd: {k: v.to(torch.bfloat16) for k, v in sd.items()})}


def qwenimage_edit_files(folder, out, version: str) -> dict[str, Path]:
    """The Qwen-Image-Edit-`version` (2509 or 2511) diffusion model file of a QwenImageEditPlus folder, in the
    key layout of qwen_image.safetensors, with the text encoder (vision tower included) and VAE files."""
    name, store = QWEN_EDIT_FILES[version]
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    return {"transformer": _save(store(folder_weights(folder, "transformer")), out / name),
            **_qwen_text_encoder_and_vae(folder, out)}


# Comfy-Org's Qwen-Image-2512 diffusion models (the base model's keys): file name -> how its weights are stored.
QWEN_2512_FILES = {"qwen_image_2512_fp8_e4m3fn.safetensors": plain_fp8,
                   "qwen_image_2512_bf16.safetensors": lambda sd: {k: v.to(torch.bfloat16) for k, v in sd.items()}}


def qwenimage_2512_file(folder, out, name: str) -> Path:
    """The Qwen-Image-2512 diffusion model file `name` of a QwenImage folder (its name tells it from Qwen-Image)."""
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    return _save(QWEN_2512_FILES[name](folder_weights(folder, "transformer")), out / name)


def qwen_edit_2511_configs(folder) -> None:
    """Make a QwenImageEditPlus folder Qwen-Image-Edit-2511's: its transformer config sets zero_cond_t (the
    input images' tokens are modulated with timestep 0); the weights are the same as 2509's."""
    import json

    path = Path(folder, "transformer", "config.json")
    config = json.loads(path.read_text())
    config["zero_cond_t"] = True
    path.write_text(json.dumps(config, indent=2, sort_keys=True) + "\n")

def transformer_holding(folder, values) -> None:
    """Replace a folder's transformer weights by `values` of them (a function of its state dict), so that a file of
    that precision holds exactly the folder's weights."""
    component_holding(folder, "transformer", values)


def component_holding(folder, component: str, values) -> None:
    """`transformer_holding` for any diffusers component of a folder (a VAE)."""
    import json

    import diffusers

    path = Path(folder, component)
    model = getattr(diffusers, json.loads((path / "config.json").read_text())["_class_name"]).from_pretrained(path)
    model.load_state_dict(values(model.state_dict()))
    model.save_pretrained(path)


def bf16_valued_transformer(folder) -> None:
    """Round a folder's transformer weights to bf16 values (kept float32): a bf16 file of it
    (z_image_turbo_bf16.safetensors, qwen_image_2.1_bf16.safetensors) holds exactly the folder's weights."""
    transformer_holding(folder, lambda sd: {k: v.to(torch.bfloat16).float() for k, v in sd.items()})


def qwen3vl_file_layout(sd: dict) -> dict:
    """ComfyUI's Qwen3-VL files (its Qwen3VL module): the language model as "model." beside "visual."; transformers'
    Qwen3VLModel names it "language_model."."""
    return {"model." + k.removeprefix("language_model.") if k.startswith("language_model.") else k: v
            for k, v in sd.items()}


def krea2_turbo_folder(folder) -> None:
    """Make a Krea 2 folder the Turbo model its Comfy-Org files (`krea2_files`) are: is_distilled, a transformer and
    text encoder holding the weights their scaled fp8 files hold (so those load exactly the folder's model), and a
    VAE of Wan 2.1's block structure (`wan_sized_vae`)."""
    import json

    from diffusers import Krea2Transformer2DModel
    from transformers import Qwen3VLModel

    index = Path(folder, "model_index.json")
    index.write_text(json.dumps({**json.loads(index.read_text()), "is_distilled": True}, indent=2, sort_keys=True)
                     + "\n")
    wan_sized_vae(folder)
    for component, cls in (("transformer", Krea2Transformer2DModel), ("text_encoder", Qwen3VLModel)):
        model = cls.from_pretrained(Path(folder, component))
        model.load_state_dict(fp8_valued(model.state_dict()))
        model.save_pretrained(Path(folder, component))


def krea2_files(folder, out) -> dict[str, Path]:
    """Comfy-Org's Krea 2 files: krea2_turbo_fp8_scaled (Krea's original layout), qwen3vl_4b_fp8_scaled (ComfyUI's
    Qwen3-VL layout, vision tower included), both ComfyUI's newer scaled fp8, and qwen_image_vae (Wan 2.1 layout);
    also the diffusion model as ComfyUI's int8 ConvRot file (groups of 16: the tiny model is 32 wide)."""
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    transformer = krea2_layout(folder_weights(folder, "transformer"))
    return {
        "transformer": _save(scaled_fp8(transformer, new_format=True), out / "krea2_turbo_fp8_scaled.safetensors"),
        "transformer_int8_convrot": _save(comfy_quantized(transformer, "int8_convrot", 16),
                                          out / "krea2_turbo_int8_convrot.safetensors"),
        "text_encoder": _save(scaled_fp8(qwen3vl_file_layout(folder_weights(folder, "text_encoder")), new_format=True),
                              out / "qwen3vl_4b_fp8_scaled.safetensors"),
        "vae": _save(vae_to_wan(folder_weights(folder, "vae")), out / "qwen_image_vae.safetensors"),
    }


def zimage_files(folder, out) -> dict[str, Path]:
    """Comfy-Org's Z-Image-Turbo files: the diffusion model (bf16), the Qwen3-4B text encoder and FLUX.1's VAE."""
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    transformer = {k: v.to(torch.bfloat16) for k, v in zimage_to_comfy(folder_weights(folder, "transformer")).items()}
    return {
        "transformer": _save(transformer, out / "z_image_turbo_bf16.safetensors"),
        "text_encoder": _save(_prefixed(folder_weights(folder, "text_encoder"), "model."),
                              out / "qwen_3_4b.safetensors"),
        "vae": _save(vae_to_ldm(folder_weights(folder, "vae"), 4), out / "ae.safetensors"),
    }


def qwenimage21_files(folder, out) -> dict[str, Path]:
    """The Qwen-Image 2.1 files of ComfyUI's templates: qwen_image_2.1_bf16.safetensors (ComfyUI's layout: the fused
    SwiGLU `img_mlp.gate_up`, bf16; the folder needs `bf16_valued_transformer` for it to hold exactly the folder's
    weights), qwen3vl_8b_bf16.safetensors (Qwen3-VL with its vision tower, as transformers saves it) and
    qwen_image_2.1_vae_bf16.safetensors (diffusers' AutoencoderKLQwenImage21 layout); the text encoder and VAE in the
    folder's dtype, so they too hold exactly its weights. Also the diffusion model as ComfyUI's int8 ConvRot file
    (groups of 16: the tiny model is 32 wide)."""
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    transformer = qwen_image21_layout(folder_weights(folder, "transformer"))
    return {
        "transformer": _save({k: v.to(torch.bfloat16) for k, v in transformer.items()},
                             out / "qwen_image_2.1_bf16.safetensors"),
        "transformer_int8_convrot": _save(comfy_quantized(transformer, "int8_convrot", 16),
                                          out / "qwen_image_2.1_int8_convrot.safetensors"),
        "text_encoder": _save(folder_weights(folder, "text_encoder"), out / "qwen3vl_8b_bf16.safetensors"),
        "vae": _save(folder_weights(folder, "vae"), out / "qwen_image_2.1_vae_bf16.safetensors"),
    }
FLUX3_PREFIXES = {"x_embedders.": "emb_in.", "context_embedder.": "txt_in.", "mode_blocks.": "content_mode_blocks.",
                  "single_transformer_blocks.": "single_blocks."}
FLUX3_KEYS = {"timestep_embedder.linear_1.weight": "time_in.in_layer.weight",
              "timestep_embedder.linear_2.weight": "time_in.out_layer.weight",
              "target_timestep_embedder.linear_1.weight": "ref_time_in.in_layer.weight",
              "target_timestep_embedder.linear_2.weight": "ref_time_in.out_layer.weight",
              "proj_out.weight": "final_layer.image.linear.weight",
              "norm_out.linear.weight": "final_layer.image.adaLN_modulation.1.weight"}
FLUX3_BLOCK_PARTS = {"attn.to_q.weight": "q_proj.weight", "attn.to_k.weight": "k_proj.weight",
                     "attn.to_v.weight": "v_proj.weight", "attn.to_out.0.weight": "attn_out.weight",
                     "attn.norm_q.weight": "norm.query_norm.scale", "attn.norm_k.weight": "norm.key_norm.scale",
                     "ff.linear_in.weight": "mlp_in.weight", "ff.linear_out.weight": "mlp_out.weight"}


def flux3_to_bfl(sd: dict) -> dict:
    """FLUX 3's original (BFL) layout, what diffusers' convert_flux3_transformer_checkpoint_to_diffusers reads: emb_in.,
    txt_in., content_mode_blocks., single_blocks., `.lin.` modulations, time_in / ref_time_in, the final adaLN as
    [shift, scale]."""
    out = {}
    for key, value in sd.items():
        if key in FLUX3_KEYS:
            out[FLUX3_KEYS[key]] = _swap_halves(value) if key == "norm_out.linear.weight" else value
            continue
        suffix = next((part for part in FLUX3_BLOCK_PARTS if key.endswith(part)), None)
        if suffix:
            key = key[: -len(suffix)] + FLUX3_BLOCK_PARTS[suffix]
        key = key.replace(".linear.weight", ".lin.weight")
        prefix = next((p for p in FLUX3_PREFIXES if key.startswith(p)), None)
        out[FLUX3_PREFIXES[prefix] + key[len(prefix):] if prefix else key] = value
    return out


def flux3_files(folder, out) -> dict[str, Path]:
    """The FLUX 3 [klein] files of ComfyUI's templates: flux3-image-klein-base-bf16.safetensors (BFL's layout, bf16:
    the folder needs `bf16_valued_transformer` for it to hold exactly the folder's weights) and its int8 ConvRot file
    (groups of 16: the tiny model is 32 wide), the Qwen3-VL text encoder (its vision tower included, in the folder's
    dtype; also as int8 ConvRot, qwen3vl_4b_int8_convrot) and FLUX.2's VAE (flux2-vae, LDM layout)."""
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    transformer = flux3_to_bfl(folder_weights(folder, "transformer"))
    text_encoder = folder_weights(folder, "text_encoder")
    return {
        "transformer": _save({k: v.to(torch.bfloat16) for k, v in transformer.items()},
                             out / "flux3-image-klein-base-bf16.safetensors"),
        "transformer_int8_convrot": _save(comfy_quantized(transformer, "int8_convrot", 16),
                                          out / "flux3-image-klein-base-int8-convrot.safetensors"),
        "text_encoder": _save(text_encoder, out / "qwen3vl_4b.safetensors"),
        "text_encoder_int8_convrot": _save(comfy_quantized(text_encoder, "int8_convrot", 16),
                                           out / "qwen3vl_4b_int8_convrot.safetensors"),
        "vae": _save(vae_to_ldm(folder_weights(folder, "vae"), 4), out / "flux2-vae.safetensors"),
    }


def zimage_quantized_files(folder, out, convrot_group: int = 16) -> dict[str, dict[str, Path]]:
    """Z-Image's diffusion model and Qwen3 text encoder in every ComfyUI quantized format (QUANT_KINDS), as
    ComfyUI's model folders hold them: {kind: {"transformer": models/diffusion_models/z_image_turbo_<kind>,
    "text_encoder": models/text_encoders/qwen_3_4b_<kind>}}. The tiny model is 32 wide, so ConvRot rotates groups
    of `convrot_group` (a power of 4) instead of 256."""
    out = Path(out)
    (out / "diffusion_models").mkdir(parents=True, exist_ok=True)
    (out / "text_encoders").mkdir(parents=True, exist_ok=True)
    transformer = zimage_to_comfy(folder_weights(folder, "transformer"))
    text_encoder = _prefixed(folder_weights(folder, "text_encoder"), "model.")
    return {kind: {"transformer": _save(comfy_quantized(transformer, kind, convrot_group),
                                        out / "diffusion_models" / f"z_image_turbo_{kind}.safetensors"),
                   "text_encoder": _save(comfy_quantized(text_encoder, kind, convrot_group),
                                         out / "text_encoders" / f"qwen_3_4b_{kind}.safetensors")}
            for kind in QUANT_KINDS}


def flux1_kontext_files(folder, out) -> dict[str, Path]:
    """Comfy-Org's FLUX.1 Kontext diffusion model (BFL layout, ComfyUI's older scaled fp8) of a real-width
    folder (`flux1_kontext_wide`); its text encoders and VAE are FLUX.1-dev's."""
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    bfl = flux_to_bfl(folder_weights(folder, "transformer"))
    return {"transformer": _save(scaled_fp8(bfl), out / "flux1-dev-kontext_fp8_scaled.safetensors")}


def flux1_fill_files(folder, out) -> dict[str, Path]:
    """BFL's FLUX.1 Fill diffusion model (BFL layout, bf16, 384 input channels) of `flux1_fill_wide`'s folder;
    its text encoders and VAE are FLUX.1-dev's."""
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    return {"transformer": _save(flux_to_bfl(folder_weights(folder, "transformer")), out / "flux1-fill-dev.safetensors")}


def flux1_wide(out) -> Path:
    """A FLUX.1-dev folder whose transformer has FLUX's real width (24 x 128 = 3072) but one double and one
    single block, in bf16 (~1 GB), with tiny text encoders and VAE: the smallest FLUX.1 that diffusers'
    BFL converter (which hard-codes the width) can read."""
    import tiny_models
    from diffusers import FluxTransformer2DModel

    pipe, raw = tiny_models.flux1("tiny", dev=True)
    torch.manual_seed(0)
    pipe.transformer = FluxTransformer2DModel(
        patch_size=1, in_channels=64, num_layers=1, num_single_layers=1, attention_head_dim=128,
        num_attention_heads=24, joint_attention_dim=32, pooled_projection_dim=32, guidance_embeds=True,
        axes_dims_rope=(16, 56, 56)).to(torch.bfloat16)
    pipe.register_modules(transformer=pipe.transformer)
    return tiny_models.save(pipe, raw, out)


def _link_weights(src, dst):
    """copytree's copy function: weight files hard-linked (no second GB on disk), the rest copied (so that
    rewriting a config never changes the source folder's)."""
    if str(src).endswith(".safetensors"):
        try:
            return os.link(src, dst)
        except OSError:  # another file system
            pass
    return shutil.copy2(src, dst)


def flux1_kontext_wide(wide, out) -> Path:
    """A FLUX.1 Kontext folder from `flux1_wide`'s: Kontext has FLUX.1-dev's architecture, so the weights are
    the wide folder's (hard-linked); model_index.json is the one FluxKontextPipeline saves."""
    import tiny_models

    out = Path(out)
    shutil.copytree(wide, out, copy_function=_link_weights)
    (out / "model_index.json").unlink()
    pipe, _ = tiny_models.flux1_kontext("tiny")  # the wide folder's component classes
    pipe.save_config(out)
    tiny_models._fix_model_index(out)
    return out


def flux1_fill_wide(wide, out) -> Path:
    """A FLUX.1 Fill folder from `flux1_wide`'s: its transformer takes 384 input channels (a new input layer)
    and outputs 64, with the wide transformer's other weights; tiny text encoders and VAE as there."""
    import tiny_models
    from accelerate import init_empty_weights
    from diffusers import FluxTransformer2DModel

    pipe, raw = tiny_models.flux1_fill("tiny")  # tiny components as the wide folder's (same seeds)
    config = {**FluxTransformer2DModel.load_config(Path(wide, "transformer")), "in_channels": 384, "out_channels": 64}
    weights = folder_weights(wide, "transformer")
    torch.manual_seed(0)
    weights["x_embedder.weight"] = torch.nn.Linear(384, 3072, bias=False).weight.detach().to(torch.bfloat16)
    with init_empty_weights():
        transformer = FluxTransformer2DModel.from_config(config)
    transformer.load_state_dict(weights, strict=True, assign=True)
    pipe.register_modules(transformer=transformer)
    return tiny_models.save(pipe, raw, out)


# LTX-2: diffusers key part -> Lightricks' original (what diffusers' convert_ltx2_*_to_diffusers and its
# scripts/convert_ltx2_to_diffusers.py read), applied in order to each key
LTX2_TRANSFORMER_NAMES = (
    ("audio_proj_in.", "audio_patchify_proj."), ("proj_in.", "patchify_proj."),
    ("av_cross_attn_video_scale_shift.", "av_ca_video_scale_shift_adaln_single."),
    ("av_cross_attn_video_a2v_gate.", "av_ca_a2v_gate_adaln_single."),
    ("av_cross_attn_audio_scale_shift.", "av_ca_audio_scale_shift_adaln_single."),
    ("av_cross_attn_audio_v2a_gate.", "av_ca_v2a_gate_adaln_single."),
    ("video_a2v_cross_attn_scale_shift_table", "scale_shift_table_a2v_ca_video"),
    ("audio_a2v_cross_attn_scale_shift_table", "scale_shift_table_a2v_ca_audio"),
    ("prompt_adaln.", "prompt_adaln_single."),  # LTX-2.3's (audio_prompt_adaln too)
    (".norm_q.", ".q_norm."), (".norm_k.", ".k_norm."),
)
LTX2_CONNECTOR_NAMES = (("video_connector.", "video_embeddings_connector."),
                        ("audio_connector.", "audio_embeddings_connector."),
                        (".transformer_blocks.", ".transformer_1d_blocks."), (".norm_q.", ".q_norm."),
                        (".norm_k.", ".k_norm."))
LTX2_VOCODER_NAMES = (("upsamplers.", "ups."), ("resnets.", "resblocks."), ("conv_in.", "conv_pre."),
                      ("conv_out.", "conv_post."), ("act_out.", "act_post."),  # LTX-2.3's anti-aliased activations
                      (".downsample.filter", ".downsample.lowpass.filter"))
LTX2_STATISTICS = {"latents_mean": "per_channel_statistics.mean-of-means",
                   "latents_std": "per_channel_statistics.std-of-means"}


def _replaced(key: str, names) -> str:
    for d, o in names:
        key = key.replace(d, o)
    return key


def ltx2_transformer_to_original(sd: dict) -> dict:
    """LTX2VideoTransformer3DModel keys -> Lightricks' layout: patchify_proj, adaln_single / audio_adaln_single,
    av_ca_*_adaln_single, scale_shift_table_a2v_ca_*, q_norm / k_norm."""
    out = {}
    for key, value in sd.items():
        key = re.sub(r"^(audio_)?time_embed\.", lambda m: f"{m.group(1) or ''}adaln_single.", key)
        out[_replaced(key, LTX2_TRANSFORMER_NAMES)] = value
    return out


def ltx2_connectors_to_original(sd: dict) -> dict:
    """LTX2TextConnectors keys -> Lightricks' layout: the text projection (`text_embedding_projection.aggregate_embed`,
    top level in the checkpoint) and the video/audio embeddings connectors (inside the diffusion model)."""
    def projection_name(key):  # LTX-2's one projection, LTX-2.3's one per modality
        return re.sub(r"^(video_|audio_)?text_proj_in\.", lambda m: f"{m.group(1) or ''}aggregate_embed.", key)

    projection = {projection_name(k): v for k, v in sd.items() if "text_proj_in." in k}
    connectors = {_replaced(k, LTX2_CONNECTOR_NAMES): v for k, v in sd.items() if "text_proj_in." not in k}
    return {**_prefixed(projection, "text_embedding_projection."), **_prefixed(connectors, "model.diffusion_model.")}


# (diffusers' stage, the entry Lightricks' layout gives it): each stage and its down/upsampler one entry each
LTX2_VAE_STAGES = ((r"encoder\.down_blocks\.(\d+)\.downsamplers\.0\.", lambda i: f"encoder.down_blocks.{2 * i + 1}."),
                   (r"encoder\.down_blocks\.(\d+)\.", lambda i: f"encoder.down_blocks.{2 * i}."),
                   (r"decoder\.up_blocks\.(\d+)\.upsamplers\.0\.", lambda i: f"decoder.up_blocks.{2 * i + 1}."),
                   (r"decoder\.up_blocks\.(\d+)\.", lambda i: f"decoder.up_blocks.{2 * i + 2}."))


def _ltx2_vae_key(key: str) -> str:
    for pattern, stage in LTX2_VAE_STAGES:
        m = re.match(pattern, key)
        if m:
            return stage(int(m.group(1))) + key[m.end():]
    return key.replace("encoder.mid_block.", "encoder.down_blocks.8.").replace("decoder.mid_block.",
                                                                                "decoder.up_blocks.0.")


def ltx2_video_vae_to_original(sd: dict) -> dict:
    """AutoencoderKLLTX2Video keys -> Lightricks' layout: each encoder stage and its downsampler one `down_blocks.N`
    entry each (the mid block entry 8, as diffusers' converter reads a 4-stage encoder), the decoder's mid block
    `up_blocks.0` and then each upsampler and stage, res_blocks, the latent statistics as per_channel_statistics
    (with the two entries diffusers' converter drops)."""
    out = {LTX2_STATISTICS.get(key) or _ltx2_vae_key(key).replace(".resnets.", ".res_blocks."): value
           for key, value in sd.items()}
    out["per_channel_statistics.channel"] = torch.arange(sd["latents_mean"].shape[0])
    out["per_channel_statistics.mean-of-stds"] = torch.ones_like(sd["latents_std"])
    return out


def ltx2_audio_vae_to_original(sd: dict) -> dict:
    """AutoencoderKLLTX2Audio keys -> Lightricks' layout: diffusers' own but for the latent statistics."""
    return {LTX2_STATISTICS.get(key, key): value for key, value in sd.items()}


def ltx2_vocoder_to_original(sd: dict) -> dict:
    """LTX2Vocoder keys -> Lightricks' HiFi-GAN layout: conv_pre, ups, resblocks, conv_post; LTX2VocoderWithBWE's
    (LTX-2.3: vocoder., bwe_generator., mel_stft.) the same inside each, with act_post and downsample.lowpass."""
    return {_replaced(key, LTX2_VOCODER_NAMES): value for key, value in sd.items()}


def ltx2_files(folder, out, name: str = "ltx-2-19b-dev") -> dict[str, Path]:
    """LTX-2's files as ComfyUI's templates load them: the all-in-one checkpoint `name` (ltx-2-19b-dev, or
    ltx-2.3-22b-dev-fp8 of an LTX-2.3 folder: the diffusion model with the text connectors under model.diffusion_model.,
    the text projection, vae., audio_vae., vocoder.) and the Gemma 3 text encoder (gemma_3_12B_it in ComfyUI's
    layout, its vision tower included). An `-fp8` name holds the diffusion model's 2-D weights in ComfyUI's newer scaled
    fp8 (the folder needs `transformer_holding(folder, fp8_valued)` for it to hold exactly the folder's weights)."""
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    transformer = ltx2_transformer_to_original(folder_weights(folder, "transformer"))
    if name.endswith("-fp8"):
        transformer = scaled_fp8(transformer, new_format=True)
    checkpoint = {**_prefixed(transformer, "model.diffusion_model."),
                  **ltx2_connectors_to_original(folder_weights(folder, "connectors")),
                  **_prefixed(ltx2_video_vae_to_original(folder_weights(folder, "vae")), "vae."),
                  **_prefixed(ltx2_audio_vae_to_original(folder_weights(folder, "audio_vae")), "audio_vae."),
                  **_prefixed(ltx2_vocoder_to_original(folder_weights(folder, "vocoder")), "vocoder.")}
    return {"checkpoint": _save(checkpoint, out / f"{name}.safetensors"),
            "text_encoder": _save(gemma3_file_layout(folder_weights(folder, "text_encoder")),
                                  out / "gemma_3_12B_it.safetensors")}


LTX25_CONVROT_GROUP = 16  # the tiny LTX-2.5's widths (32, 64) are no multiple of ComfyUI's 256


def ltx25_files(folder, out) -> dict[str, Path]:
    """LTX-2.5's separate files as ComfyUI's templates load them: the diffusion model in int8 ConvRot with the
    connector blocks beside it under model.diffusion_model. (`transformer_holding(folder, ltx25_transformer_values)`
    afterwards makes the folder hold exactly what it loads as: quantizing dequantized weights again is not exact); the
    Gemma 4 text encoder in ComfyUI's
    layout (as Lightricks' packer writes it) carrying the text projection, small vision and audio embedders (which the
    tiny configs lack) and its tokenizer's files as tensors; the conv video VAE; the audio VAE carrying the vocoder."""
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    transformer = comfy_quantized(ltx2_transformer_to_original(folder_weights(folder, "transformer")), "int8_convrot",
                                  LTX25_CONVROT_GROUP)
    connectors = ltx2_connectors_to_original(folder_weights(folder, "connectors"))
    projection = {k: v for k, v in connectors.items() if k.startswith("text_embedding_projection.")}
    blocks = {k: v for k, v in connectors.items() if k not in projection}
    def as_tensor(file):
        return torch.tensor(list(Path(folder, "tokenizer", file).read_bytes()), dtype=torch.uint8)

    torch.manual_seed(0)
    embedders = {"vision_model.patch_dense.weight": torch.randn(8, 12),
                 "vision_model.pos_embedding": torch.randn(4, 2, 8),
                 "multi_modal_projector.embedding_projection.weight": torch.randn(32, 8),
                 "audio_projector.embedding_projection.weight": torch.randn(32, 8)}  # (the tiny configs have none)
    text_encoder = {**gemma3_file_layout(folder_weights(folder, "text_encoder")), **projection, **embedders,
                    "tokenizer_json": as_tensor("tokenizer.json"),
                    "hf_asset__tokenizer_config.json": as_tensor("tokenizer_config.json")}
    audio = {**_prefixed(ltx2_audio_vae_to_original(folder_weights(folder, "audio_vae")), "audio_vae."),
             **_prefixed(ltx2_vocoder_to_original(folder_weights(folder, "vocoder")), "vocoder.")}
    return {"transformer": _save({**_prefixed(transformer, "model.diffusion_model."), **blocks},
                                 out / "ltx-2.5-22b-distilled-transformer-comfy-int8-convrot.safetensors"),
            "text_encoder": _save(text_encoder, out / "gemma4-12b-with-proj-ltx-2.5.safetensors"),
            "vae": _save(ltx2_video_vae_to_original(folder_weights(folder, "vae")),
                         out / "ltx-2.5-video-vae-conv-bf16.safetensors"),
            "audio_vae": _save(audio, out / "ltx-2.5-audio-vae-bf16.safetensors")}


def ltx25_diffusion_decoder_vae_file(folder, out) -> Path:
    """The template's ltx-2.5-video-vae-bf16 from a tiny LTX-2.5 folder with a diffusion decoder
    (tiny_models.with_diffusion_decoder): the conv VAE's encoder and statistics, and the diffusion decoder under
    `decoder.` in its original names (diffusers' conversion script's renames reversed, q/k/v fused), with what the
    real file carries beside it: static gates beside the layers they gate (the layers divided by them, so folding
    gives the folder's weights back), a frame-type embedding and a preview head, which are not diffusers'."""
    encoder = {k: v for k, v in ltx2_video_vae_to_original(folder_weights(folder, "vae")).items()
               if not k.startswith("decoder.")}
    decoder = {}
    for key, value in folder_weights(folder, "diffusion_decoder").items():
        if key.startswith("latents_"):  # the statistics are the VAE's per_channel_statistics
            continue
        for new, old in ((".t_embedder.timestep_embedder.linear_1.", ".t_embedder.mlp.0."),
                         (".t_embedder.timestep_embedder.linear_2.", ".t_embedder.mlp.2."),
                         (".attn.to_out.0.", ".attn.proj."), (".attn.norm_q.", ".attn.q_norm."),
                         (".attn.norm_k.", ".attn.k_norm.")):
            key = key.replace(new, old)
        decoder[key] = value
    fused = {}
    for key, value in decoder.items():
        if ".attn.to_k." in key or ".attn.to_v." in key:
            continue
        if ".attn.to_q." in key:
            value = torch.cat([value, decoder[key.replace(".to_q.", ".to_k.")],
                               decoder[key.replace(".to_q.", ".to_v.")]])
            key = key.replace(".to_q.", ".qkv.")
        fused[key] = value
    generator = torch.Generator().manual_seed(0)
    for key in list(fused):
        for layer, gate in ((".attn.proj.weight", ".gate_msa"), (".mlp.w_down.weight", ".gate_mlp"),
                            (".context_proj.weight", ".gate_ctx")):
            if key.endswith(layer):
                name = key[:-len(layer)] + gate
                fused[name] = torch.rand(fused[key].shape[0], generator=generator) + 0.5
                fused[key] = fused[key] / fused[name][:, None]
                bias = key[:-len("weight")] + "bias"
                if bias in fused:
                    fused[bias] = fused[bias] / fused[name]
    extras = {"decoder.type_emb.weight": torch.randn(2, 8, generator=generator),
              "decoder.coarse_head.weight": torch.randn(3, 8, generator=generator)}
    return _save({**encoder, **fused, **extras}, Path(out) / "ltx-2.5-video-vae-bf16.safetensors")


def ltx25_transformer_values(sd: dict) -> dict:
    """What `ltx25_files`' int8 ConvRot diffusion model holds of a transformer's weights."""
    return comfy_valued(sd, "int8_convrot", LTX25_CONVROT_GROUP)


def gemma3_file_layout(sd: dict) -> dict:
    """Gemma3ForConditionalGeneration keys (as transformers saves them) -> ComfyUI's Gemma 3 file layout
    (comfy/text_encoders/lt.py): the language model as a plain causal LM ("model.layers..."), the SigLIP tower as
    "vision_model.", the projector as it is."""
    out = {}
    for key, value in sd.items():
        key = re.sub(r"^(model\.)?language_model\.(model\.)?", "model.", key)
        key = re.sub(r"^(model\.)?vision_tower\.(vision_model\.)?", "vision_model.", key)
        out[re.sub(r"^model\.multi_modal_projector\.", "multi_modal_projector.", key)] = value
    return out


# ------------------------------------------------------------------------------------------ MiniMax H3
# diffusers key prefix -> the original layout's (convert_minimax_h3_transformer_checkpoint_to_diffusers, inverted)
MINIMAX_H3_PREFIXES = (("transformer_blocks.", "blocks."), ("token_refiner.refiner_blocks.", "token_refiner.blocks."),
                       ("time_embedder.linear_1.", "time_embedder.proj_in."),
                       ("time_embedder.linear_2.", "time_embedder.proj_out."), ("proj_in.", "video_patch_proj."),
                       ("audio_proj_in.", "audio_patch_proj."), ("context_embedder.", "condition_proj."),
                       ("norm_out.norm.", "final_layer.norm."), ("norm_out.linear.", "final_layer.adaln_proj.linear."),
                       ("proj_out.", "final_layer.video_out."), ("audio_proj_out.", "final_layer.audio_out."))
MINIMAX_H3_PARTS = ((".attn.norm_q.", ".attn.q_norm."), (".attn.norm_k.", ".attn.k_norm."),
                    (".attn.to_out.0.", ".attn.out_proj."), (".ff.net.0.proj.", ".mlp.fc1."),
                    (".ff.net.2.", ".mlp.fc2."))
MINIMAX_H3_CONVROT_GROUP = 16  # the tiny model's widths (32) are no multiple of ComfyUI's 256


def minimax_h3_to_original(sd: dict) -> dict:
    """MiniMaxH3Transformer3DModel keys -> MiniMax's layout (ComfyUI's comfy/ldm/minimax/model.py, Comfy-Org's files):
    blocks.N, q/k/v fused into `attn.qkv_proj` stacked [q; k; v], `mlp.fc1` as [gate; value] (diffusers' SwiGLU reads
    [value; gate]), final_layer.*, and the rotary `rope.inv_freq` buffer (which diffusers' converter drops)."""
    out = {"rope.inv_freq": torch.ones(1)}
    for key, value in sd.items():
        if ".attn.to_k." in key or ".attn.to_v." in key:
            continue
        if ".attn.to_q." in key:
            value = torch.cat([value, sd[key.replace(".to_q.", ".to_k.")], sd[key.replace(".to_q.", ".to_v.")]])
            key = key.replace(".to_q.", ".qkv_proj.")
        if ".ff.net.0.proj." in key:
            value = _swap_halves(value)
        key = _replaced(key, MINIMAX_H3_PARTS)
        prefix = next(((new, old) for new, old in MINIMAX_H3_PREFIXES if key.startswith(new)), None)
        out[prefix[1] + key[len(prefix[0]):] if prefix else key] = value
    return out


def minimax_h3_files(folder, out) -> dict[str, Path]:
    """MiniMax H3's diffusion models as Comfy-Org's files hold them, from a tiny folder's transformer: bf16 without a
    prefix (minimax_h3_fl2va_bf16), int8 ConvRot under model.diffusion_model. (minimax_h3_fl2va_int8_convrot;
    `transformer_holding(folder, minimax_h3_int8_values)` then makes a folder hold what it loads as), and the pruned
    one (minimax_h3_fl2va_pruned_int8_convrot: that int8 file with `minimax_h3_curve_form` of what it loads as in place
    of its time embedder and AdaLN projections, those in float32, as ComfyUI keeps them)."""
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    original = minimax_h3_to_original(folder_weights(folder, "transformer"))
    int8 = comfy_quantized(original, "int8_convrot", MINIMAX_H3_CONVROT_GROUP)
    curve = minimax_h3_curve_form(comfy_valued(original, "int8_convrot", MINIMAX_H3_CONVROT_GROUP))
    pruned = {**{k: v for k, v in int8.items() if not k.startswith("time_embedder.") and ".adaln_proj." not in k},
              **{k: v for k, v in curve.items() if "adaln" in k}}
    bf16 = {k: v.to(torch.bfloat16) for k, v in original.items()}
    return {"transformer": _save(bf16, out / "minimax_h3_fl2va_bf16.safetensors"),
            "transformer_int8_convrot": _save(_prefixed(int8, "model.diffusion_model."),
                                              out / "minimax_h3_fl2va_int8_convrot.safetensors"),
            "transformer_pruned": _save(pruned, out / "minimax_h3_fl2va_pruned_int8_convrot.safetensors")}


def minimax_h3_curve_form(original: dict, rank: int | None = None, grid: int = 1025) -> dict:
    """A transformer in MiniMax's layout pruned to ComfyUI's curve form (how its comfy/ldm/minimax/model.py reads one):
    the curve g(t) = SiLU(time_embedder(t)) sampled at `grid` t in [0, 1], centred on its mean m and factored
    G - m = U S V^T; with V_r its leading `rank` right singular vectors, the file holds `adaln_t_table` (G - m) V_r and
    each AdaLN projection W V_r with W m folded into its bias, and no time embedder. Then W V_r c(t) + b' = W g(t) + b
    up to the rank-r truncation and the table's linear interpolation: exact at the full rank (the default; the
    released files use rank 8 of 2688)."""
    proj_in_w, proj_in_b = original["time_embedder.proj_in.weight"], original["time_embedder.proj_in.bias"]
    proj_out_w, proj_out_b = original["time_embedder.proj_out.weight"], original["time_embedder.proj_out.bias"]
    half = proj_in_w.shape[1] // 2
    t = torch.linspace(0, 1, grid, dtype=torch.float64)
    angles = t[:, None] * torch.exp(-math.log(10000.0) * torch.arange(half, dtype=torch.float64) / half)[None]
    sinusoids = torch.cat([torch.cos(angles), torch.sin(angles)], dim=-1)
    hidden = torch.nn.functional.silu(sinusoids @ proj_in_w.double().T + proj_in_b.double())
    curve = torch.nn.functional.silu(hidden @ proj_out_w.double().T + proj_out_b.double())
    mean = curve.mean(0)
    basis = torch.linalg.svd(curve - mean, full_matrices=False).Vh[:rank].T  # [width, rank]
    out = {k: v for k, v in original.items() if not k.startswith("time_embedder.")}
    out["adaln_t_table"] = ((curve - mean) @ basis).float()
    for key in [k for k in out if k.endswith(".adaln_proj.linear.weight")]:
        weight = out[key].double()
        out[key] = (weight @ basis).float()
        bias = key.replace(".weight", ".bias")
        out[bias] = (out[bias].double() + weight @ mean).float()
    return out


def minimax_h3_int8_values(sd: dict) -> dict:
    """What `minimax_h3_files`' int8 ConvRot diffusion model holds of a transformer's weights (rows quantize
    independently, so diffusers' layout holds the same values as the fused original)."""
    return comfy_valued(sd, "int8_convrot", MINIMAX_H3_CONVROT_GROUP)


# MiniMax H3's VAE files as ComfyUI's templates download them (Comfy-Org/MiniMax-H3): the video VAE in MiniMax's
# original names (ComfyUI's comfy/ldm/minimax/vae.py MiniMaxH3VideoVAE) with the latent statistics and the unused
# decoder.mask_token as buffers; its int8 ConvRot form quantizes only the ViT decoder's block linears (comfy/sd.py
# gives the quantized ops to the decoder only; x_embedder and proj_out are plain layers there); the audio VAE
# (comfy/ldm/minimax/audio_vae.py) in diffusers' names with each weight-normed conv folded into one `weight`.
# diffusers key pattern -> ComfyUI's (the inverse of runtime/families/minimax_h3_vae.py's renames), the first match wins
MINIMAX_H3_VIDEO_VAE_NAMES = (
    (r"^encoder\.down_blocks\.(\d+)\.resnets\.(\d+)\.conv_shortcut\.", r"encoder.down.\1.block.\2.nin_shortcut."),
    (r"^encoder\.down_blocks\.(\d+)\.resnets\.(\d+)\.", r"encoder.down.\1.block.\2."),
    (r"^encoder\.down_blocks\.(\d+)\.downsamplers\.0\.", r"encoder.down.\1.downsample."),
    (r"^decoder\.proj_in\.", "decoder.x_embedder."),
    (r"\.attn\.to_out\.0\.", ".attn.to_out."),
    (r"\.ff\.net\.0\.proj\.", ".ff.w1."),
    (r"\.ff\.net\.2\.", ".ff.w2."),
)
# the decoder's block linears in each layout: what the int8 ConvRot file quantizes
MINIMAX_H3_VAE_LINEARS = re.compile(r"^decoder\.transformer_blocks\.\d+\.(attn\.to_(qkv|q|k|v|out|out\.0)|"
                                    r"ff\.(w1|w2|net\.0\.proj|net\.2))\.weight$")


def _component_config(folder, component: str) -> dict:
    import json

    return json.loads(Path(folder, component, "config.json").read_text())


def minimax_h3_video_vae_to_comfy(sd: dict, config: dict) -> dict:
    """AutoencoderKLMiniMaxH3 weights in ComfyUI's layout: q/k/v fused per head ([q_h; k_h; v_h] for each head h:
    ComfyUI views to_qkv's output as (heads, 3 x head width) and chunks it), ff.w1 as [gate; up] (diffusers' SwiGLU
    reads [up; gate]), MiniMax's names, and the buffers ComfyUI's module saves: latents_mean / latents_std (the
    config's) and decoder.mask_token (zeros, unused)."""
    heads, width = config["decoder_num_attention_heads"], config["decoder_attention_head_dim"]
    out = {"latents_mean": torch.tensor(config["latents_mean"]), "latents_std": torch.tensor(config["latents_std"]),
           "decoder.mask_token": torch.zeros(1, 1, heads * width)}
    for key, value in sd.items():
        if ".attn.to_k." in key or ".attn.to_v." in key:
            continue
        if ".attn.to_q." in key:
            rest = value.shape[1:]
            parts = [sd[key.replace(".to_q.", f".to_{name}.")].reshape(heads, width, *rest) for name in "qkv"]
            value = torch.stack(parts, dim=1).reshape(3 * heads * width, *rest)
            key = key.replace(".attn.to_q.", ".attn.to_qkv.")
        if ".ff.net.0.proj." in key:
            value = _swap_halves(value)
        out[next((re.sub(p, r, key) for p, r in MINIMAX_H3_VIDEO_VAE_NAMES if re.search(p, key)), key)] = value
    return out


def minimax_h3_audio_vae_to_comfy(sd: dict, config: dict) -> dict:
    """AutoencoderKLMiniMaxH3Audio weights as ComfyUI's file holds them: each weight_g / weight_v pair as the one
    weight torch's weight_norm makes of it (dim 0), and the config's latent statistics as buffers."""
    out = {"latents_mean": torch.tensor(config["latents_mean"]), "latents_std": torch.tensor(config["latents_std"])}
    for key, value in sd.items():
        if key.endswith(".weight_g"):
            continue
        if key.endswith(".weight_v"):
            layer = key[: -len(".weight_v")]
            out[f"{layer}.weight"] = torch._weight_norm(value, sd[f"{layer}.weight_g"], 0)
        else:
            out[key] = value
    return out


MINIMAX_H3_TEXT_LAYERS = 50  # ComfyUI's file: Qwen3-VL 32B cut after the layer H3's blocks read


def minimax_h3_text_encoder_layout(sd: dict, layers: int = MINIMAX_H3_TEXT_LAYERS) -> dict:
    """Comfy-Org's MiniMax H3 text encoder (ComfyUI's comfy/text_encoders/minimax.py: Qwen3-VL 32B "truncated to 50
    layers", no final norm) from a Qwen3VLForConditionalGeneration state dict: ComfyUI's Qwen3-VL names (`model.`
    language model beside `visual.`), its first `layers` decoder layers, no `model.norm`, no `lm_head` (None: all)."""
    out = {}
    for key, value in sd.items():
        if key.startswith("lm_head.") or (layers is not None and key == "model.language_model.norm.weight"):
            continue
        key = key.replace("model.language_model.", "model.", 1).replace("model.visual.", "visual.", 1)
        layer = re.match(r"model\.layers\.(\d+)\.", key)
        if layers is None or not layer or int(layer.group(1)) < layers:
            out[key] = value
    return out


def minimax_h3_vae_files(folder, out) -> dict[str, Path]:
    """MiniMax H3's VAE files from a tiny folder: the video VAE in fp16 (minimax_h3_video_vae_fp16) and with its
    decoder's block linears int8 ConvRot (minimax_h3_video_vae_int8_convrot; groups of 16, the tiny decoder is 32
    wide; the rest fp16), and the audio VAE in fp32 (minimax_h3_audio_vae_fp32). `component_holding` with
    `minimax_h3_video_vae_values` / `minimax_h3_audio_vae_values` makes a folder hold what they load as."""
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    video = minimax_h3_video_vae_to_comfy(folder_weights(folder, "vae"), _component_config(folder, "vae"))
    fp16 = {k: v.to(torch.float16) for k, v in video.items()}
    linears = {k: v for k, v in fp16.items() if MINIMAX_H3_VAE_LINEARS.match(k)}
    int8 = {**fp16, **comfy_quantized(linears, "int8_convrot", MINIMAX_H3_CONVROT_GROUP)}
    audio = minimax_h3_audio_vae_to_comfy(folder_weights(folder, "audio_vae"), _component_config(folder, "audio_vae"))
    return {"vae_fp16": _save(fp16, out / "minimax_h3_video_vae_fp16.safetensors"),
            "vae_int8_convrot": _save(int8, out / "minimax_h3_video_vae_int8_convrot.safetensors"),
            "audio_vae": _save({k: v.float() for k, v in audio.items()}, out / "minimax_h3_audio_vae_fp32.safetensors")}


def minimax_h3_video_vae_values(precision: str):
    """What `minimax_h3_vae_files`' video VAE file of `precision` ("fp16", "int8_convrot") holds of a folder's
    AutoencoderKLMiniMaxH3 weights, in float32 (rows quantize independently, so the split q/k/v and the swapped w1
    halves hold the fused layers' values)."""
    def values(sd: dict) -> dict:
        sd = {k: v.to(torch.float16).float() for k, v in sd.items()}
        if precision == "int8_convrot":
            sd.update(comfy_valued({k: v for k, v in sd.items() if MINIMAX_H3_VAE_LINEARS.match(k)}, "int8_convrot",
                                   MINIMAX_H3_CONVROT_GROUP))
        return sd

    return values


def minimax_h3_audio_vae_values(sd: dict) -> dict:
    """A folder's audio VAE weights as its folded file gives them back: each weight_v the folded weight itself and
    weight_g its norm over every dim but 0 (the same weights; the split of the original g and v is not in the file)."""
    out = dict(sd)
    for key in sd:
        if key.endswith(".weight_v"):
            layer = key[: -len(".weight_v")]
            weight = torch._weight_norm(sd[key], sd[f"{layer}.weight_g"], 0)
            out[key] = weight
            out[f"{layer}.weight_g"] = weight.flatten(1).norm(dim=1).reshape(-1, *[1] * (weight.dim() - 1))
    return out


def minimax_h3_text_encoder_files(folder, out) -> dict[str, Path]:
    """MiniMax H3's text encoder as Comfy-Org's qwen3vl_32b_minimax_h3_nvfp4_awq holds it (50 layers in ComfyUI's
    layout; the language model's linears nvfp4 with AWQ pre-scales, where they fit comfy-kitchen's layout, their JSON
    with `full_precision_matrix_mult`; the token embedding int8_tensorwise; the rest, vision tower included, bf16: the
    350 nvfp4 + 1 int8 layers third-party checks count in the real file, unverified), and the
    folder's whole text encoder in that layout (every layer and the final norm: a Qwen3-VL file that is not cut), bf16."""
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    sd = folder_weights(folder, "text_encoder")
    whole = {k: v.to(torch.bfloat16) for k, v in minimax_h3_text_encoder_layout(sd, None).items()}
    import json

    cut = minimax_h3_text_encoder_layout(sd)
    language = {k: v for k, v in cut.items() if k.startswith("model.layers.")}  # the vision tower stays bf16
    embed = {"model.embed_tokens.weight": cut["model.embed_tokens.weight"]}
    quantized = {**{k: v.to(torch.bfloat16) for k, v in cut.items() if k not in language and k not in embed},
                 **comfy_quantized(embed, "int8"), **comfy_quantized(language, "nvfp4_awq")}
    nvfp4 = json.dumps({"format": "nvfp4", "full_precision_matrix_mult": True}).encode()
    quantized.update({k: torch.tensor(list(nvfp4), dtype=torch.uint8) for k in quantized
                      if k.startswith("model.layers.") and k.endswith(".comfy_quant")})
    return {"text_encoder": _save(quantized,
                                  out / "qwen3vl_32b_minimax_h3_nvfp4_awq.safetensors"),
            "text_encoder_whole": _save(whole, out / "qwen3vl_32b_bf16.safetensors")}
