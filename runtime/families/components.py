"""File kinds that several families share (text encoders and VAEs), and the key helpers for the rest."""

from __future__ import annotations

from .base import FileKind


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
WAN_VAE = FileKind("wan_vae", "a Wan 2.1 / QwenImage VAE", lambda: (
    "decoder.middle.0.residual.0.gamma", "decoder.mid_block.resnets.0.residual.0.gamma"))
QWEN3 = FileKind("qwen3", "a Qwen3 text encoder", lambda: (  # q_norm/k_norm: Qwen3 has them, Qwen2.5 and Mistral not
    "model.layers.0.self_attn.q_norm.weight", "layers.0.self_attn.q_norm.weight"))
