"""File kinds that several families share (text encoders and VAEs), and the key helpers for the rest."""

from __future__ import annotations

from .base import FileKind, MemoryModel


def diffusers_detection_keys(name: str) -> tuple[str, ...]:
    """diffusers' own single-file detection keys for model type `name`, without a checkpoint prefix."""
    from diffusers.loaders.single_file_utils import CHECKPOINT_KEY_NAMES

    keys = CHECKPOINT_KEY_NAMES[name]
    return tuple(k for k in ([keys] if isinstance(keys, str) else keys) if not k.startswith("model.diffusion_model."))


CLIP = FileKind("clip", "a CLIP text encoder", lambda: ("text_model.embeddings.position_embedding.weight",
                                                        "embeddings.position_embedding.weight"))
T5 = FileKind("t5", "a T5 text encoder", lambda: ("encoder.block.0.layer.0.SelfAttention.q.weight",))
KL_VAE = FileKind("kl_vae", "a FLUX.1/SD3 VAE", lambda: ("encoder.down.0.block.0.conv1.weight",
                                                         "encoder.down_blocks.0.resnets.0.conv1.weight"))
def wan_vae_to_diffusers(checkpoint, config):
    """diffusers' converter of Wan 2.1's VAE layout, for a class of that VAE `from_single_file` does not take."""
    from diffusers.loaders.single_file_utils import convert_wan_vae_to_diffusers

    return convert_wan_vae_to_diffusers(checkpoint)


WAN_VAE = FileKind("wan_vae", "a Wan 2.1 / QwenImage VAE", lambda: (
    "decoder.middle.0.residual.0.gamma", "decoder.mid_block.resnets.0.residual.0.gamma"),
    converter=wan_vae_to_diffusers)


# --- memory models (runtime/memory_plan.py): readers of the configs that several families share


def kl_vae_shape(config) -> tuple[int, int, int, int]:
    """An AutoencoderKL's (FLUX.1/SD3/SDXL, FLUX.2's): it halves the size at each block but the last, one frame."""
    widths = config.get("block_out_channels") or (128, 256, 512, 512)
    return 2 ** (len(widths) - 1), 1, widths[0], 1


def wan_vae_shape(config) -> tuple[int, int, int, int]:
    """Wan's VAEs (and QwenImage's, Wan 2.1's): their configs name the factors; Wan 2.2's decodes at half resolution
    and unpatchifies 2x2."""
    return (config.get("scale_factor_spatial", 8), config.get("scale_factor_temporal", 4),
            config.get("decoder_base_dim") or config.get("base_dim", 96), config.get("patch_size") or 1)


def attention_shape(ffn_ratio: float, packed: int = 0):
    """A DiT's (config -> hidden, FFN, patch) with `num_attention_heads` x `attention_head_dim` channels and an FFN
    `ffn_ratio` (or its config's `mlp_ratio`) times as wide; its patch is its config's `patch_size`, or `packed` x
    `packed` latent pixels for a pipeline that packs the latents into tokens itself (FLUX's 2x2)."""
    def shape(config):
        hidden = config["num_attention_heads"] * config["attention_head_dim"]
        side = packed or config.get("patch_size", 1)
        return hidden, int(hidden * config.get("mlp_ratio", ffn_ratio)), (1, side, side)

    return shape


def image_memory(denoiser_shape, vae_shape=kl_vae_shape) -> MemoryModel:
    """An image family's memory model: one frame, decoded whole; the per-token and per-pixel constants are the ones
    measured for Wan's DiT blocks and VAEs (MemoryModel's defaults), not measured for the family itself."""
    return MemoryModel(denoiser_shape=denoiser_shape, vae_shape=vae_shape)
QWEN3 = FileKind("qwen3", "a Qwen3 text encoder", lambda: (  # q_norm/k_norm: Qwen3 has them, Qwen2.5 and Mistral not
    "model.layers.0.self_attn.q_norm.weight", "layers.0.self_attn.q_norm.weight"))
# Qwen3-VL (the text encoder of Krea 2 and Qwen-Image 2.1): its text model has Qwen3's q_norm, so it is told by the vision tower's DeepStack
# mergers, which Qwen3 has not (ComfyUI's files: "model." language model beside "visual."; transformers': "model.visual.")
QWEN3VL = FileKind("qwen3vl", "a Qwen3-VL text encoder", lambda: (
    "visual.deepstack_merger_list.0.linear_fc1.weight", "model.visual.deepstack_merger_list.0.linear_fc1.weight"),
    text_only_prefix=("model.", "language_model."))
