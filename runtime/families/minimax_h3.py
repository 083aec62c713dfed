"""MiniMax H3 (MiniMax): text to video and first/last frame to video, with a stereo sound track. diffusers runs it only
as modular blocks (`MiniMaxH3Blocks`): its folders have a modular_model_index.json and no model_index.json.

One audio-video transformer (`MiniMaxH3Transformer3DModel`) denoises the video and audio latents together, fed by a
Qwen3-VL text encoder (its 50th layer's hidden states, one prompt per call). The video VAE is 16x spatial with 17-frame
clips (frames are 17n + 5, latent frames 5n + 2), the audio VAE decodes 40 latents per second to 32 kHz stereo, returned
beside the frames as `audio` [1, 2, T]. It is guidance-distilled: no guidance, no negative prompt. It makes 5 to 15 s
at 24 fps: diffusers rounds a frame count up to the next 17n + 5 and takes 124 to 345 frames; the pack takes those
counts as they are (what is asked is what is made).

The blocks' workflows: t2va (text), fl2va (a first frame, a last frame, or both: image to video and first/last frame to
video here) and ref2va (ordered image, video and audio references, run by a second transformer, `transformer_ref`,
as large as the first). Only t2va/fl2va's components load (`ModularBlocks.loaded_workflows`); ref2va is not built yet.

Single files: the File Loader reads Comfy-Org's unpruned fl2va diffusion models (bf16, int8 ConvRot) with diffusers' own
converter ("stacked" q/k/v, as every published single file is). Comfy-Org's "pruned" files are another form of the
model (ComfyUI's curve form: `adaln_t_table`, a 1025 x 8 table of the timestep curve interpolated linearly, replaces the
time embedder, and each AdaLN projection is cut to that rank-8 basis), which diffusers' class does not run and which
cannot be turned back into its weights (the full projections are gone): refused. diffusers has no converter for its VAEs
nor its Qwen3-VL text encoder, so those come from the configs folder's weights (`Family.folder_components`).
"""

from .base import (FIRSTLAST2VIDEO, IMAGE2VIDEO, TEXT2VIDEO, Family, FileKind, FrameRule, MemoryModel, ModularBlocks,
                   TaskPipeline)
from .components import diffusers_detection_keys

PIPELINE = "MiniMaxH3ModularPipeline"
WORKFLOWS = {TEXT2VIDEO: "t2va", IMAGE2VIDEO: "fl2va", FIRSTLAST2VIDEO: "fl2va"}

# "token_refiner.blocks.0.attn.qkv_proj.weight" in the original (and ComfyUI's) layout, diffusers' names beside it
TRANSFORMER = FileKind("minimax_h3_transformer", "a MiniMax H3 diffusion model", lambda: (
    *diffusers_detection_keys("minimax-h3"), "token_refiner.refiner_blocks.0.attn.to_q.weight"))
UNPRUNED = "minimax_h3_fl2va_int8_convrot.safetensors"  # Comfy-Org's unpruned files: this and the bf16 one


def first_last(first, last) -> dict:
    """The fl2va blocks take the first and the last frame as PIL images (diffusers stretches or cover-crops them onto
    the canvas)."""
    return {"image": first, "last_image": last}


def first_latent_frame(pipe, latents, height, width):
    """The loop's video latents are [B, 24, latent frames, h, w]: the first latent frame is the preview."""
    return latents[:, :, 0]


def denoiser_shape(config) -> tuple:
    """MiniMaxH3Transformer3DModel: (hidden width, FFN width, patch (t, h, w))."""
    return config["hidden_size"], config["ffn_dim"], tuple(config.get("patch_size", (1, 2, 2)))


def vae_shape(config) -> tuple:
    """AutoencoderKLMiniMaxH3: 16x spatial, 4x temporal (17-frame clips), its first stage's width, no pixel patch.
    Not measured: the memory model's defaults."""
    return 16, 4, (config.get("block_out_channels") or (128,))[0], 1


def sound_rate(pipe) -> int:
    return pipe.audio_vae.config.sampling_rate


FAMILY = Family(
    name="MiniMax H3",
    model_classes={PIPELINE: {TEXT2VIDEO: TaskPipeline(PIPELINE), IMAGE2VIDEO: TaskPipeline(PIPELINE, images=1),
                              FIRSTLAST2VIDEO: TaskPipeline(PIPELINE, images=2, first_last=first_last)}},
    modular={PIPELINE: ModularBlocks("MiniMaxH3Blocks", PIPELINE, WORKFLOWS, unguided=True,
                                     loaded_workflows=("t2va", "fl2va"),
                                     outputs={"frames": "videos", "audio": "audio"})},
    takes_negative_prompt=False,
    guidance_kwarg="guidance_scale",  # not passed: the blocks take none (ModularBlocks.unguided)
    guidance_hint="none: it is guidance-distilled",
    size_multiple=32,  # VAE 16 x patch 2
    default_steps=30,
    latent_grid=first_latent_frame,
    comfy_latent_format="Wan21",  # none fits its 24 channels: previews are left out (logged once)
    comfy_latent=None,
    denoiser_kind=TRANSFORMER,
    denoiser_files=("minimax_h3_fl2va_bf16.safetensors", UNPRUNED),
    file_slots=(),
    folder_components=("text_encoder", "vae", "audio_vae"),
    default_config_repo="MiniMaxAI/MiniMax-H3",
    diffusers_model_types=("minimax-h3",),
    unsupported_keys={"adaln_t_table": f"it is a pruned MiniMax H3 (ComfyUI's curve form: a table of the timestep "
                                       f"curve replaces the time embedder, each AdaLN projection is cut to its rank-8 "
                                       f"basis), which diffusers' MiniMaxH3Transformer3DModel does not run and which "
                                       f"cannot be turned back into its weights. Pick the unpruned {UNPRUNED} or "
                                       f"minimax_h3_fl2va_bf16.safetensors (Comfy-Org/MiniMax-H3)"},
    # ref2va's transformer has fl2va's keys and shapes: only its name tells it
    unsupported_files={"ref2va": f"reference to video (ref2va, its own transformer) is not built yet; pick the fl2va "
                                 f"model ({UNPRUNED}) for text, image and first/last frame to video"},
    memory=MemoryModel(denoiser_shape=denoiser_shape, vae_shape=vae_shape),
    fps=24.0,
    temporal_factor=4,  # the VAE's temporal compression; its counts are `frame_rule`'s
    frame_rule=FrameRule(17, 5, 124, 345, "5 to 15 s at 24 fps, each 17-frame clip of the video VAE"),
    default_frames=124,
    sound_rate=sound_rate,
    context_parallel=False,  # diffusers has a `_cp_plan`; the mesh checks do not count its 5n + 2 latent frames yet
)
