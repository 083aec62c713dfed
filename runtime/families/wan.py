"""Wan 2.2 (Alibaba Wan): text to video and image to video.

- T2V A14B and I2V A14B: two 14B experts, `transformer` for the high-noise steps and `transformer_2` for the rest
  (diffusers switches at `boundary_ratio` x 1000 of the timesteps); Wan 2.1's VAE (16 channels, 8x spatial).
  I2V A14B is a WanImageToVideoPipeline (the first frame's latents join the noise); T2V takes no image.
- TI2V-5B: one transformer, Wan 2.2's VAE (48 channels, 16x spatial) and `expand_timesteps` (a timestep per
  latent token, the first frame's tokens kept clean): the same model makes video from text and from an image,
  through WanImageToVideoPipeline built with `from_pipe`.
Frames are 4k + 1 (the VAE's temporal factor 4 plus the first frame). A UMT5-XXL text encoder.
"""

import dataclasses

from .base import (IMAGE2VIDEO, TEXT2VIDEO, Family, FileKind, FileSlot, FileVariant, MemoryModel, ReferenceModel,
                   TaskPipeline)
from .components import WAN_VAE, diffusers_detection_keys, wan_vae_shape

TRANSFORMER = FileKind("wan_transformer", "a Wan diffusion model", lambda: (
    *diffusers_detection_keys("wan"), "condition_embedder.time_proj.weight"))
# UMT5 keeps a relative attention bias in every layer (T5 only in the first): told by the second layer's
UMT5 = FileKind("umt5", "a UMT5 text encoder (Wan)", lambda: (
    "encoder.block.1.layer.0.SelfAttention.relative_attention_bias.weight",))
# Wan 2.2 VAE (ComfyUI's comfy/ldm/wan/vae2_2.py, Wan2.2_VAE.pth) -> AutoencoderKLWan(is_residual=True): the
# mapping of diffusers' scripts/convert_wan_to_diffusers.py (convert_vae_22), which diffusers' package lacks.
# Each down/up block is a Sequential of resnets then its resampler; AvgDown3D / DupUp3D shortcuts hold no weights.
WAN22_VAE_RULES = (
    (r"^(encoder|decoder)\.conv1\.", r"\1.conv_in."),
    (r"^conv1\.", "quant_conv."),
    (r"^conv2\.", "post_quant_conv."),
    (r"^(encoder|decoder)\.head\.0\.", r"\1.norm_out."),
    (r"^(encoder|decoder)\.head\.2\.", r"\1.conv_out."),
    (r"^(encoder|decoder)\.middle\.1\.", r"\1.mid_block.attentions.0."),
    (r"^(encoder|decoder)\.middle\.0\.", r"\1.mid_block.resnets.0."),
    (r"^(encoder|decoder)\.middle\.2\.", r"\1.mid_block.resnets.1."),
    (r"^encoder\.downsamples\.(\d+)\.downsamples\.\d+\.(resample|time_conv)\.",
     r"encoder.down_blocks.\1.downsampler.\2."),
    (r"^encoder\.downsamples\.(\d+)\.downsamples\.(\d+)\.", r"encoder.down_blocks.\1.resnets.\2."),
    (r"^decoder\.upsamples\.(\d+)\.upsamples\.\d+\.(resample|time_conv)\.",
     r"decoder.up_blocks.\1.upsampler.\2."),
    (r"^decoder\.upsamples\.(\d+)\.upsamples\.(\d+)\.", r"decoder.up_blocks.\1.resnets.\2."),
)
WAN_RESNET_PARTS = (("residual.0.", "norm1."), ("residual.2.", "conv1."), ("residual.3.", "norm2."),
                    ("residual.6.", "conv2."), ("shortcut.", "conv_shortcut."))


def wan22_vae_to_diffusers(state: dict) -> dict:
    """A Wan 2.2 VAE file's state dict (wan2.2_vae.safetensors) in diffusers' AutoencoderKLWan layout."""
    import re

    out = {}
    for key, value in state.items():
        new = key
        for pattern, replacement in WAN22_VAE_RULES:
            new, found = re.subn(pattern, replacement, key)
            if found:
                break
        if ".resnets." in new:
            new = next((new.replace(f".{old}", f".{part}", 1) for old, part in WAN_RESNET_PARTS if f".{old}" in new),
                       new)
        out[new] = value
    return out


# Wan 2.2's VAE (TI2V-5B): Wan 2.1's keys plus residual up blocks
# (its first up block always upsamples: `upsamples.0.upsamples.N` there, `up_blocks.0.upsampler` in diffusers';
# Wan 2.1's are `upsamples.3` and `up_blocks.0.upsamplers.0`). diffusers' Wan VAE converter reads only Wan 2.1's
# layout: wan22_vae_to_diffusers converts this one.
WAN22_VAE = FileKind("wan22_vae", "a Wan 2.2 VAE (TI2V-5B)", lambda: (
    "decoder.upsamples.0.upsamples.0.residual.2.weight", "decoder.up_blocks.0.upsampler.resample.1.weight"),
    to_diffusers=wan22_vae_to_diffusers)


def tensor_parallel_plan(config) -> dict:
    """diffusers' `_tp_plan` for a WanTransformer3DModel of this config (diffusers 0.42.1 gives it none).

    Wan's q/k norms span all heads (`rms_norm_across_heads`: norm_q/norm_k/norm_added_k are inner_dim wide), so
    to_q/to_k/add_k_proj stay whole: a column shard would normalise over its own slice. What is sharded:
    - the FFN, colwise in (`ffn.net.0.proj`) and rowwise out (`ffn.net.2`), as FLUX's;
    - the value and output projections of both attentions: every rank keeps all heads of q and k but a 1/tp slice
      of each head's value channels (PackedColwiseParallel, one block per head), so attention gives that slice of
      each head's output (softmax(q k^T) v is linear in v's channels), and `to_out.0` (PackedRowwiseParallel, the
      same blocks) takes it and all-reduces. The blocks are one per head: the plan depends on the head count.
    q k^T is computed whole on every rank: this plan saves weights, not attention time (context parallelism splits
    that). 69.0% of a 14B expert's parameters are sharded, 75.5% of the 5B's (tests/test_memory_plan.py)."""
    from diffusers.hooks.tensor_parallel import PackedColwiseParallel, PackedRowwiseParallel

    per_head = [1] * config["num_attention_heads"]
    plan = {}
    for attention in ("attn1", "attn2"):
        plan[f"blocks.*.{attention}.to_v"] = PackedColwiseParallel(per_head)
        plan[f"blocks.*.{attention}.to_out.0"] = PackedRowwiseParallel(per_head)
    if config.get("added_kv_proj_dim"):  # Wan 2.1 I2V's image keys/values join attn2 (its key norm spans heads too)
        plan["blocks.*.attn2.add_v_proj"] = PackedColwiseParallel(per_head)
    plan["blocks.*.ffn.net.0.proj"] = "colwise"
    plan["blocks.*.ffn.net.2"] = "rowwise"
    return plan


def first_frame_latents(pipe, latents, height, width):
    """Wan's latents are (B, C, frames, h, w), already in the normalised space ComfyUI's Wan latent formats read:
    the first frame is the preview."""
    return latents[:, :, 0]


def transformer_shape(config):
    """WanTransformer3DModel's hidden and FFN widths and its (t, h, w) patch."""
    return config["num_attention_heads"] * config["attention_head_dim"], config["ffn_dim"], tuple(config["patch_size"])


# The published configs of the Wan 2.2 models (Wan-AI/Wan2.2-T2V-A14B-Diffusers, Wan2.2-TI2V-5B-Diffusers), for the
# table in docs/parallelism.md; a user's model is planned from its own folder's configs.
UMT5_XXL = ("transformers", "UMT5EncoderModel", dict(
    vocab_size=256384, d_model=4096, d_kv=64, d_ff=10240, num_layers=24, num_heads=64, feed_forward_proj="gated-gelu",
    relative_attention_num_buckets=32))
A14B_TRANSFORMER = ("diffusers", "WanTransformer3DModel", dict(
    patch_size=[1, 2, 2], num_attention_heads=40, attention_head_dim=128, in_channels=16, out_channels=16,
    text_dim=4096, freq_dim=256, ffn_dim=13824, num_layers=40, cross_attn_norm=True, qk_norm="rms_norm_across_heads",
    eps=1e-6))
REFERENCE_MODELS = {
    "Wan 2.2 A14B (T2V/I2V)": ReferenceModel({
        "text_encoder": UMT5_XXL, "transformer": A14B_TRANSFORMER, "transformer_2": A14B_TRANSFORMER,
        "vae": ("diffusers", "AutoencoderKLWan", {})}),
    "Wan 2.2 TI2V-5B": ReferenceModel({
        "text_encoder": UMT5_XXL,
        "transformer": ("diffusers", "WanTransformer3DModel", dict(
            patch_size=[1, 2, 2], num_attention_heads=24, attention_head_dim=128, in_channels=48, out_channels=48,
            text_dim=4096, freq_dim=256, ffn_dim=14336, num_layers=30, cross_attn_norm=True,
            qk_norm="rms_norm_across_heads", eps=1e-6)),
        "vae": ("diffusers", "AutoencoderKLWan", dict(
            base_dim=160, decoder_base_dim=256, z_dim=48, in_channels=12, out_channels=12, patch_size=2,
            scale_factor_spatial=16, is_residual=True))}, settings={"expand_timesteps": True}),
}

# Measured on CPU at real widths: one block of each Wan transformer in bf16 at 2048 and 4096 tokens takes ~15.6 bytes
# per hidden channel and ~2.4 bytes per FFN channel per token (12 and 2 working-dtype tensors, rounded up); Wan 2.1's
# and 2.2's VAEs decoding 9 frames at 128 and 256 pixels square ~10.6 and ~11.4 KB per output pixel. The VAE decodes
# one latent frame (4 video frames) at a time with a cache of the previous frames: 16 full-resolution tensors of the
# decoder's width per 4-frame chunk (measured ~13.8).
MEMORY = MemoryModel(denoiser_shape=transformer_shape, vae_shape=wan_vae_shape, hidden_tensors=12, ffn_tensors=2,
                     vae_chunk_frames=4, vae_tensors=16, reference_models=REFERENCE_MODELS)

TI2V_5B = {  # what expand_timesteps (Wan 2.2 TI2V-5B) changes
    "model_classes": {"WanPipeline": {TEXT2VIDEO: TaskPipeline("WanPipeline"),
                                      IMAGE2VIDEO: TaskPipeline("WanImageToVideoPipeline", images=1)},
                      "WanImageToVideoPipeline": {IMAGE2VIDEO: TaskPipeline("WanImageToVideoPipeline", images=1)}},
    "size_multiple": 32,  # VAE 16 x patch 2
    "comfy_latent_format": "Wan22",
    "fps": 24.0,
    "default_frames": 121,
    # a timestep per token: the (tokens, 6, hidden) fp32 modulation and its sum in a block; Wan 2.2's VAE decodes at
    # half resolution then unpatchifies 2x2, and its lower stages weigh more (measured ~22.2 tensors of its top width)
    "memory": dataclasses.replace(MEMORY, modulation_bytes=2 * 6 * 4, vae_tensors=24),
    # one diffusion model (no low-noise expert) and Wan 2.2's VAE
    "file_slots": (FileSlot("text_encoder", UMT5, "umt5_xxl_fp8_e4m3fn_scaled.safetensors"),
                   FileSlot("vae", WAN22_VAE, "wan2.2_vae.safetensors")),
}

FAMILY = Family(
    name="Wan 2.2",
    model_classes={
        "WanPipeline": {TEXT2VIDEO: TaskPipeline("WanPipeline")},
        "WanImageToVideoPipeline": {IMAGE2VIDEO: TaskPipeline("WanImageToVideoPipeline", images=1)},
    },
    takes_negative_prompt=True,
    guidance_kwarg="guidance_scale",
    size_multiple=16,  # VAE 8 x patch 2
    default_steps=40,
    latent_grid=first_frame_latents,
    comfy_latent_format="Wan21",
    comfy_latent=None,  # video: the Video Sampler has no LATENT (yet)
    denoiser_kind=TRANSFORMER,
    denoiser_files=("wan2.2_t2v_high_noise_14B_fp8_scaled.safetensors", "wan2.2_i2v_high_noise_14B_fp8_scaled.safetensors",
                    "wan2.2_ti2v_5B_fp16.safetensors"),
    file_slots=(
        # the low-noise expert of the A14B models (its own diffusion-model file); TI2V-5B has none (TI2V_5B's slots)
        FileSlot("transformer_2", TRANSFORMER, "wan2.2_t2v_low_noise_14B_fp8_scaled.safetensors",
                 not_named=("high_noise",)),
        FileSlot("text_encoder", UMT5, "umt5_xxl_fp8_e4m3fn_scaled.safetensors"),
        FileSlot("vae", WAN_VAE, "wan_2.1_vae.safetensors"),
    ),
    default_config_repo="Wan-AI/Wan2.2-T2V-A14B-Diffusers",
    memory=MEMORY,
    # (no diffusers_model_types: diffusers' Wan model types name Wan 2.1's repos, whose configs are not Wan 2.2's)
    file_variants=(  # Comfy-Org's names: wan2.2_ti2v_5B_fp16, wan2.2_i2v_{high,low}_noise_14B_fp8_scaled
        FileVariant("WanPipeline", "Wan-AI/Wan2.2-TI2V-5B-Diffusers", name_contains=("ti2v",),
                    settings={"expand_timesteps": True}),
        FileVariant("WanImageToVideoPipeline", "Wan-AI/Wan2.2-I2V-A14B-Diffusers", name_contains=("i2v",),
                    comfy_files={"transformer_2": "wan2.2_i2v_low_noise_14B_fp8_scaled.safetensors"}),
    ),
    unsupported_files={part: "Wan 2.1's single files are not supported yet: load a Wan 2.1 diffusers folder (e.g. "
                             "`hf download Wan-AI/Wan2.1-T2V-14B-Diffusers --local-dir ComfyUI/models/diffusers/"
                             "Wan2.1-T2V-14B-Diffusers`) with the TPU Loader" for part in ("wan2.1", "wan2_1", "wan21")},
    extra_denoisers=("transformer_2",),
    lora_targets={"high_noise": ("transformer",), "low_noise": ("transformer_2",),
                  "both": ("transformer", "transformer_2")},
    extra_denoiser_words="the low-noise expert of Wan 2.2 A14B",
    guidance_hint="1.0 (no CFG) with 4-step LoRAs; without them 4.0 (A14B) or 5.0 (5B)",
    tp_plan=tensor_parallel_plan,
    default_negative_prompt="",
    fps=16.0,
    temporal_factor=4,
    default_frames=81,
    setting_changes=(("expand_timesteps", TI2V_5B),),
)
