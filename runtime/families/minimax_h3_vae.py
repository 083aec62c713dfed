"""MiniMax H3's VAE files as ComfyUI reads them (Comfy-Org/MiniMax-H3: minimax_h3_video_vae_fp16 and _int8_convrot,
minimax_h3_audio_vae_fp32), converted to diffusers' AutoencoderKLMiniMaxH3 / AutoencoderKLMiniMaxH3Audio. diffusers
0.42.1 has no single-file converter for either class (neither has FromOriginalModelMixin), so these are the File
Loader's own (`FileKind.converter`: they need the class's config).

Sources: ComfyUI's comfy/ldm/minimax/vae.py and audio_vae.py (the module trees its files load into, strict) and the
VAE branches of comfy/sd.py (detection keys); diffusers' scripts/convert_minimax_h3_to_diffusers.py (the renames and
tensor changes from MiniMax's original video VAE, whose names ComfyUI keeps). Not confirmed: no Comfy-Org file was
read (their headers included); what they hold is taken from the module trees ComfyUI loads them into strictly (the
buffers `latents_mean`, `latents_std`, `decoder.mask_token` and the audio VAE's `filter`s among them). Tested with
tiny files written in that layout (tools/tiny_single_files.minimax_h3_vae_files, tests/test_minimax_h3_vae_files.py).
"""

from __future__ import annotations

import re

from .base import FileKind

# MiniMax's original video VAE names (ComfyUI's MiniMaxH3VideoVAE) -> diffusers' (convert_video_vae_key's renames)
VIDEO_VAE_RULES = (
    (r"^encoder\.down\.(\d+)\.block\.(\d+)\.nin_shortcut\.", r"encoder.down_blocks.\1.resnets.\2.conv_shortcut."),
    (r"^encoder\.down\.(\d+)\.block\.(\d+)\.", r"encoder.down_blocks.\1.resnets.\2."),
    (r"^encoder\.down\.(\d+)\.downsample\.", r"encoder.down_blocks.\1.downsamplers.0."),
    (r"^decoder\.x_embedder\.", "decoder.proj_in."),
    (r"\.attn\.to_out\.", ".attn.to_out.0."),
    (r"\.ff\.w1\.", ".ff.net.0.proj."),
    (r"\.ff\.w2\.", ".ff.net.2."),
)
# ComfyUI keeps the masked-autoencoding training's `decoder.mask_token` buffer "so the checkpoint loads without
# leftover keys"; its decoder never reads it, and diffusers' class has none (the converter drops it too)
VIDEO_VAE_DROPPED = ("decoder.mask_token",)
# Both files carry the latent statistics as top-level buffers; diffusers keeps them in the config. A file whose
# statistics are not the configs folder's is another VAE than the one the configs describe: refused, not dropped
# silently (the pipeline normalises the latents with the config's). Compared within bf16's rounding, as a file of
# any precision is read in the run's dtype.
LATENT_STATISTICS = ("latents_mean", "latents_std")
STATISTICS_TOLERANCE = 2 ** -7


def _checked_statistics(checkpoint: dict, config, words: str) -> None:
    """Pop the file's latents_mean / latents_std, refusing values that are not the config's."""
    import torch

    for name in LATENT_STATISTICS:
        value = checkpoint.pop(name, None)
        want = config.get(name)
        if value is None or want is None:
            continue
        want = torch.tensor(want, dtype=torch.float32)
        if value.shape != want.shape or not torch.allclose(value.float(), want, rtol=STATISTICS_TOLERANCE,
                                                          atol=STATISTICS_TOLERANCE * 1e-3):
            shown = [round(v, 4) for v in value.float().flatten()[:3].tolist()]
            raise ValueError(f"its {name} ({shown}... {len(value.flatten())} channels) is not the configs folder's "
                             f"{words} config's ({[round(v, 4) for v in want[:3].tolist()]}... {len(want)}): the file "
                             f"and the configs are of two different VAEs")


def video_vae_to_diffusers(checkpoint: dict, config) -> dict:
    """A MiniMax H3 video VAE file (ComfyUI's layout = MiniMax's original names) in AutoencoderKLMiniMaxH3's layout.

    - renames (VIDEO_VAE_RULES): the encoder's `down.L.block.M` -> `down_blocks.L.resnets.M` (`nin_shortcut` ->
      `conv_shortcut`), `down.L.downsample` -> `down_blocks.L.downsamplers.0`, the ViT decoder's `x_embedder` ->
      `proj_in`, `attn.to_out` -> `attn.to_out.0`, `ff.w1` / `ff.w2` -> `ff.net.0.proj` / `ff.net.2`;
    - `attn.to_qkv` (weight and bias) is per head [q k v] (ComfyUI views its output as (heads, 3 x head width) and
      chunks it in three): de-interleaved by head, split into `to_q` / `to_k` / `to_v`;
    - `ff.w1`'s halves swap: the original computes silu(first half) x second half, diffusers' SwiGLU
      second half x silu(first) (diffusers' converter, "[gate; up]" -> "[up; gate]"; ComfyUI's fused "swiglu" input
      activation was not read, its file has the original's tensors);
    - `decoder.mask_token` is dropped, the latent statistics checked against the config and dropped.
    Everything else (conv_in, norm_out, conv_out, quant_conv, post_quant_conv, register_tokens, the blocks' norms and
    scale1/scale2, proj_out) keeps its name."""
    import torch

    heads, width = config["decoder_num_attention_heads"], config["decoder_attention_head_dim"]
    _checked_statistics(checkpoint, config, "vae")
    out = {}
    for key, value in checkpoint.items():
        if key in VIDEO_VAE_DROPPED:
            continue
        if ".attn.to_qkv." in key:
            start, end = key.split(".attn.to_qkv.")
            rest = value.shape[1:]
            per_head = value.reshape(heads, 3 * width, *rest)
            for name, part in zip("qkv", per_head.split(width, dim=1)):
                out[f"{start}.attn.to_{name}.{end}"] = part.reshape(heads * width, *rest).contiguous()
            continue
        new = key
        for pattern, replacement in VIDEO_VAE_RULES:
            new = re.sub(pattern, replacement, new)
        if ".ff.w1." in key:
            gate, up = value.chunk(2, dim=0)
            value = torch.cat([up, gate], dim=0)
        out[new] = value
    return out


def audio_vae_to_diffusers(checkpoint: dict, config) -> dict:
    """A MiniMax H3 audio VAE file (ComfyUI's: diffusers' names, each weight-normed conv's weight folded into a plain
    `weight`) in AutoencoderKLMiniMaxH3Audio's layout, which keeps torch's weight_norm (`weight_g` / `weight_v`,
    dim 0: diffusers passes none): weight_v = W and weight_g = W's norm over every dim but 0, so that
    weight_g x weight_v / |weight_v| is W again. The split of the original's own g and v is gone from the file (only
    their product was kept); this one gives the same weights. Which convs are weight-normed is the class's (built
    from the config on the meta device). The latent statistics are checked against the config and dropped; the
    Kaiser `filter` buffers keep their names and values (ComfyUI registers them as persistent buffers and loads
    strict, so its file carries them; one ComfyUI copy read, comfyanonymous/ComfyUI@2266077, exponentiates the
    upsampler's filter when it runs, Comfy-Org/ComfyUI@7b30bf3 and diffusers do not: the filters are taken as the
    Kaiser filters diffusers builds, which the tiny files hold)."""
    import torch
    from accelerate import init_empty_weights
    from diffusers import AutoencoderKLMiniMaxH3Audio

    _checked_statistics(checkpoint, config, "audio_vae")
    with init_empty_weights():
        expected = set(AutoencoderKLMiniMaxH3Audio.from_config(config).state_dict())
    out = {}
    for key, value in checkpoint.items():
        layer = key.removesuffix(".weight")
        if key.endswith(".weight") and f"{layer}.weight_g" in expected:
            out[f"{layer}.weight_v"] = value
            out[f"{layer}.weight_g"] = torch.norm_except_dim(value.float(), 2, 0).to(value.dtype)
        else:
            out[key] = value
    return out


# ComfyUI's comfy/sd.py tells the video VAE by `decoder.transformer_blocks.0.scale1` with
# `encoder.down.5.block.0.conv1.weight`, the audio VAE by `pre_block.attn.zero_k_bias`: keys of both layouts, which
# no other kind's files have. The video VAE's original layout also has the FLUX.1/SD3 VAE's `encoder.down.0.block.0`
# keys: its kind comes before that one in families.FILE_KINDS.
VIDEO_VAE = FileKind("minimax_h3_video_vae", "a MiniMax H3 video VAE", lambda: (
    "decoder.transformer_blocks.0.attn.to_qkv.weight", "decoder.transformer_blocks.0.scale1"),
    converter=video_vae_to_diffusers, dequantized=True)
AUDIO_VAE = FileKind("minimax_h3_audio_vae", "a MiniMax H3 audio VAE", lambda: ("pre_block.attn.zero_k_bias",),
                     converter=audio_vae_to_diffusers)
