"""LTX-2 (Lightricks): text to video and image to video, with a sound track.

One audio-video transformer denoises the video latents and the audio latents together; a Gemma 3 text encoder
(every layer's hidden states) feeds both branches through the text connectors. The video VAE is 32x spatial and 8x
temporal (frames are 8k + 1), the audio VAE decodes mel spectrograms and the vocoder makes the waveform, returned
beside the frames as `audio` [B, 2, T] at the vocoder's `output_sampling_rate`. LTX2Pipeline makes video from text;
LTX2ImageToVideoPipeline (made from the loaded components with `from_pipe`) starts from the Sampler's image, which
it re-encodes through H.264 (`image_crf`, with PyAV) as the model was trained. LTX2ConditionPipeline (from_pipe too)
runs first/last frame to video: the Sampler's image and last image pinned as keyframes. All are called with
`frame_rate` = the family's fps (24, diffusers' default), which the model conditions on.
"""

import contextlib

from ..errors import UserInputError
from .base import (FIRSTLAST2VIDEO, IMAGE2VIDEO, INCONTEXT2VIDEO, TEXT2VIDEO, Family, FileKind, FileSlot, FileVariant,
                   LatentDecoder, MemoryModel, ReferenceModel, TaskPipeline, TwoStage)
from .components import attention_shape, diffusers_detection_keys

# Lightricks' all-in-one checkpoints (ltx-2-19b-dev, ltx-2.3-22b-dev-fp8) hold every part but the text encoder, each
# told by a key of its own layout. diffusers' single-file converters read LTX-2's transformer and VAEs; LTX-2.3 renamed
# its prompt modulation and added two decoder stages, which diffusers 0.42.1's converters leave as they are, so those
# keys are renamed here as diffusers' scripts/convert_ltx2_to_diffusers.py (--version 2.3) does; that script's renames
# also give the text connectors and the vocoder (diffusers has no single-file converter for either).
PROMPT_MODULATION_NAMES = ((r"^(audio_)?prompt_adaln_single\.", r"\1prompt_adaln."),)
DECODER_STAGE_4_NAMES = ((r"^decoder\.up_blocks\.7\.", "decoder.up_blocks.3.upsamplers.0."),
                         (r"^decoder\.up_blocks\.8\.", "decoder.up_blocks.3."))
CONNECTOR_BLOCKS = ("model.diffusion_model.video_embeddings_connector.",
                    "model.diffusion_model.audio_embeddings_connector.")
CONNECTOR_NAMES = ((r"^model\.diffusion_model\.(video|audio)_embeddings_connector\.", r"\1_connector."),
                   (r"^(video_|audio_)?aggregate_embed\.", r"\1text_proj_in."),  # LTX-2.3: one per modality
                   (r"\.transformer_1d_blocks\.", ".transformer_blocks."), (r"\.q_norm\.", ".norm_q."),
                   (r"\.k_norm\.", ".norm_k."))
# LTX-2's HiFi-GAN; LTX-2.3's vocoder with bandwidth extension nests two of them (vocoder., bwe_generator.) beside
# its mel STFT, with anti-aliased activations
VOCODER_NAMES = ((r"(^|\.)conv_pre\.", r"\1conv_in."), (r"(^|\.)conv_post\.", r"\1conv_out."),
                 (r"(^|\.)ups\.", r"\1upsamplers."), (r"(^|\.)resblocks\.", r"\1resnets."),
                 (r"(^|\.)act_post\.", r"\1act_out."), (r"\.downsample\.lowpass\.", ".downsample."))


def renamed(state: dict, rules) -> dict:
    """state with every matching rule ((pattern, replacement)) applied to each key, in order."""
    import re

    out = {}
    for key, value in state.items():
        for pattern, replacement in rules:
            key = re.sub(pattern, replacement, key)
        out[key] = value
    return out


def transformer_to_diffusers(state: dict) -> dict:
    """diffusers' converter, after LTX-2.3's prompt modulation renames."""
    from diffusers.loaders.single_file_utils import convert_ltx2_transformer_to_diffusers

    return convert_ltx2_transformer_to_diffusers(renamed(state, PROMPT_MODULATION_NAMES))


def video_vae_to_diffusers(state: dict) -> dict:
    """diffusers' converter (three decoder stages), then LTX-2.3's fourth."""
    from diffusers.loaders.single_file_utils import convert_ltx2_vae_to_diffusers

    return renamed(convert_ltx2_vae_to_diffusers(dict(state)), DECODER_STAGE_4_NAMES)


# its transformer's audio-to-video gate (a diffusion-model file's own key, without ComfyUI's prefix), and diffusers'
# detection keys for model type "ltx2" (an all-in-one checkpoint: its VAEs' statistics)
TRANSFORMER = FileKind("ltx2_transformer", "an LTX-2 diffusion model", lambda: (
    "av_ca_a2v_gate_adaln_single.emb.timestep_embedder.linear_1.weight", *diffusers_detection_keys("ltx2")),
    to_diffusers=transformer_to_diffusers)


def encoder_to_diffusers(state: dict) -> dict:
    """The conv encoder and latent statistics of a diffusion-decoder VAE file, as the conv VAE's (the same
    encoder); its decoder is the latent decoder's (`diffusion_decoder_from_file`)."""
    return video_vae_to_diffusers({k: v for k, v in state.items() if not k.startswith("decoder.")})


# the template's ltx-2.5-video-vae-bf16: the conv encoder with LTX-2.5's diffusion decoder (ComfyUI's
# CausalDiffusionVAE): the VAE without a conv decoder, the diffusion decoder (LATENT_DECODER) decodes
DIFFUSION_DECODER_VAE = FileKind(
    "ltx25_diffusion_decoder_vae", "LTX-2.5's diffusion-decoder VAE", lambda: ("decoder.conv_in_x_t.weight",),
    to_diffusers=encoder_to_diffusers, lacks=("decoder",))
VIDEO_VAE = FileKind("ltx2_video_vae", "an LTX-2 video VAE", lambda: (
    "per_channel_statistics.mean-of-stds", "decoder.mid_block.resnets.0.conv1.conv.weight"),
    to_diffusers=video_vae_to_diffusers)
AUDIO_VAE = FileKind("ltx2_audio_vae", "an LTX-2 audio VAE", lambda: ("decoder.mid.block_1.conv1.conv.weight",))
VOCODER = FileKind("ltx2_vocoder", "an LTX-2 vocoder", lambda: ("conv_pre.weight", "vocoder.conv_pre.weight"),
                   converter=lambda checkpoint, config: renamed(checkpoint, VOCODER_NAMES))
# in a checkpoint under "text_embedding_projection." (the projection), the connector blocks beside it
CONNECTORS = FileKind("ltx2_connectors", "LTX-2's text connectors", lambda: (
    "aggregate_embed.weight", "video_aggregate_embed.weight"),
    converter=lambda checkpoint, config: renamed(checkpoint, CONNECTOR_NAMES))
GEMMA3_NAMES = ((r"^model\.", "model.language_model."), (r"^vision_model\.", "model.vision_tower."),
                (r"^multi_modal_projector\.", "model.multi_modal_projector."))
# LTX-2.5's Gemma 4 encoder (gemma4-12b-with-proj-ltx-2.5), told apart from Gemma 3 (which shares its layer norms) by
# each layer's scalar. ComfyUI's file (as Lightricks' packer writes it) names its language model as a plain causal LM
# ("model.layers"), its small vision and audio embedders "vision_model.", "multi_modal_projector.", "audio_projector.",
# carries its tokenizer's files as tensors ("tokenizer_json", "hf_asset__<file>": the configs give the tokenizer) and
# the text projection (the connectors' slot reads it there)
GEMMA4_NAMES = ((r"^model\.", "model.language_model."), (r"^vision_model\.", "model.embed_vision."),
                (r"^multi_modal_projector\.", "model.embed_vision.multimodal_embedder."),
                (r"^audio_projector\.", "model.embed_audio."))
GEMMA4_TOKENIZER_TENSORS = ("tokenizer_json", "hf_asset__")


def gemma4_to_transformers(cls, config, state: dict) -> dict:
    """ComfyUI's Gemma 4 file in Gemma4UnifiedForConditionalGeneration's names, without its tokenizer tensors, and
    without the embedders its configs have none of (LTX-2.5 never feeds it images or sound)."""
    state = renamed({k: v for k, v in state.items() if not k.startswith(GEMMA4_TOKENIZER_TENSORS)}, GEMMA4_NAMES)
    absent = tuple(prefix for prefix, part in (("model.embed_vision.", config.vision_config),
                                               ("model.embed_audio.", config.audio_config)) if part is None)
    return {k: v for k, v in state.items() if not k.startswith(absent)}


GEMMA4 = FileKind("gemma4", "a Gemma 4 text encoder", lambda: (
    "model.layers.0.layer_scalar", "model.language_model.layers.0.layer_scalar"),
    to_transformers=gemma4_to_transformers)
# ComfyUI's Gemma 3 files (comfy/text_encoders/lt.py) name the language model as a plain causal LM ("model.layers"),
# the SigLIP tower "vision_model."; transformers' and its older layout follow
GEMMA3 = FileKind("gemma3", "a Gemma 3 text encoder", lambda: (
    "model.layers.0.pre_feedforward_layernorm.weight", "model.language_model.layers.0.pre_feedforward_layernorm.weight",
    "language_model.model.layers.0.pre_feedforward_layernorm.weight"),
    to_transformers=lambda cls, config, state: renamed(state, GEMMA3_NAMES))


def first_frame_latents(pipe, latents, height, width):
    """LTX-2's step latents are packed tokens [B, seq, C] (already normalised, as ComfyUI's LTXV latents): unpacked
    with the pipeline's own helper to [B, C, frames, h, w]; the first latent frame is the preview."""
    patch, patch_t = pipe.transformer_spatial_patch_size, pipe.transformer_temporal_patch_size
    h = height // pipe.vae_spatial_compression_ratio // patch
    w = width // pipe.vae_spatial_compression_ratio // patch
    frames = latents.shape[1] // (h * w)
    return pipe._unpack_latents(latents, frames, h, w, patch, patch_t)[:, :, 0]


def first_last_conditions(first, last) -> dict:
    """LTX2ConditionPipeline's `conditions` for a first and a last frame. Its index is a latent frame index (negative
    ones count from the end, as diffusers' own example pins the last frame with -1): the last pixel frame's index,
    frames - 1, is past the latent frames, and diffusers skips such a condition with only a warning."""
    from diffusers.pipelines.ltx2.pipeline_ltx2_condition import LTX2VideoCondition

    return {"conditions": [LTX2VideoCondition(frames=first, index=0), LTX2VideoCondition(frames=last, index=-1)]}


def sound_rate(pipe) -> int:
    """The waveform's rate: the vocoder's output rate (its config's)."""
    return pipe.vocoder.config.output_sampling_rate


def vae_shape(config) -> tuple[int, int, int, int]:
    """AutoencoderKLLTX2Video: (spatial, temporal factor, decoder width at full resolution, pixel patch), as diffusers
    computes the factors from the config."""
    scaling = config.get("spatio_temporal_scaling", (True, True, True, True))
    if isinstance(scaling, bool):
        scaling = (scaling,) * 4
    patch, patch_t = config.get("patch_size", 4), config.get("patch_size_t", 1)
    spatial = config.get("spatial_compression_ratio") or patch * 2 ** sum(scaling)
    temporal = config.get("temporal_compression_ratio") or patch_t * 2 ** sum(scaling)
    return spatial, temporal, (config.get("decoder_block_out_channels") or (256,))[0], patch


def upsampler_config(state_dict) -> dict:
    """LTX2LatentUpsamplerModel's config read off a single file's shapes (the original checkpoint's keys are diffusers'
    own: its converter loads them as they are), for x2 spatial upscalers: ComfyUI's ltx-2.3-spatial-upscaler-x2-*."""
    first = state_dict["initial_conv.weight"]
    mid = first.shape[0]
    rational = "upsampler.conv.weight" in state_dict
    upsampler = state_dict["upsampler.conv.weight" if rational else "upsampler.0.weight"]
    if upsampler.shape[0] != 4 * mid:  # x2 in each direction: 4 channel groups shuffled into space
        raise UserInputError("this latent upscaler is not an x2 spatial one (its upsampling layer has "
                             f"{upsampler.shape[0] // mid} channel groups, not 4): use a spatial-upscaler-x2 file.")
    return dict(in_channels=first.shape[1], mid_channels=mid, dims=first.ndim - 2,
                num_blocks_per_stage=len({key.split(".")[1] for key in state_dict if key.startswith("res_blocks.")}),
                spatial_upsample=True, temporal_upsample=False, use_rational_resampler=rational,
                rational_spatial_scale=2.0)


@contextlib.contextmanager
def sigmas_as_given(pipe):
    """The pipeline's scheduler without dynamic shifting or a terminal shift while a call runs: its `sigmas` are
    used as they are, as diffusers' recipes run the distilled schedules; the loaded one is back for the next run."""
    from diffusers import FlowMatchEulerDiscreteScheduler

    scheduler = pipe.scheduler
    pipe.scheduler = FlowMatchEulerDiscreteScheduler.from_config(scheduler.config, use_dynamic_shifting=False,
                                                                 shift_terminal=None)
    try:
        yield
    finally:
        pipe.scheduler = scheduler


def two_stages(pipe, upsample, kwargs: dict, run):
    """diffusers' documented two-stage recipe (docs api/pipelines/ltx2, "Two-stages Generation"), at the asked size:
    the first stage at half width and height as latents (video and audio), the video latents upscaled x2, then the
    refine on its distilled sigmas as they are (`run` runs a call with sigmas in `sigmas_as_given`), renoised with the
    first, at guidance 1, from both latents. The first stage's generator goes on into the refine, as in the recipe."""
    from diffusers.pipelines.ltx2.utils import STAGE_2_DISTILLED_SIGMA_VALUES as SIGMAS

    first = run(pipe, dict(kwargs, width=kwargs["width"] // 2, height=kwargs["height"] // 2, output_type="latent"), 0)
    upscaled = upsample(latents=first.frames, output_type="latent", return_dict=False)[0]
    return run(pipe, dict(kwargs, latents=upscaled, audio_latents=first.audio, num_inference_steps=len(SIGMAS),
                          sigmas=SIGMAS, noise_scale=SIGMAS[0], guidance_scale=1.0), 1)


TWO_STAGE = TwoStage(
    upsampler_module="diffusers.pipelines.ltx2.latent_upsampler",
    upsampler_class="LTX2LatentUpsamplerModel",
    upsample_pipeline="LTX2LatentUpsamplePipeline",
    subfolder="latent_upsampler",  # Lightricks/LTX-2's
    key="post_upsample_res_blocks.0.conv1.weight",
    comfy_file="ltx-2.3-spatial-upscaler-x2-1.0.safetensors",
    file_config=upsampler_config,
    refine_steps=3,  # len(STAGE_2_DISTILLED_SIGMA_VALUES)
    run=two_stages,
)


def diffusion_decode(pipe, decode_pipe, output, generator):
    """LTX-2.5's native decode (diffusers' LTX2VideoDiffusionDecodePipeline docs; its modular route's decode step):
    the video latents the pipeline returns with output_type="latent" (denormalized already) through the diffusion
    decoder, which draws the noise it denoises from the call's generator, after the sampling's draws; the sound
    latents through the audio VAE and the vocoder as the pipeline decodes them. Under model CPU offload the audio
    models go back to the host after."""
    from diffusers.pipelines.ltx2.pipeline_output import LTX2PipelineOutput

    frames = decode_pipe(output.frames, generator=generator, output_type="pt", denormalize=False).frames
    mel = pipe.audio_vae.decode(output.audio.to(pipe.audio_vae.dtype), return_dict=False)[0]
    audio = pipe.vocoder(mel)
    pipe.maybe_free_model_hooks()
    return LTX2PipelineOutput(frames=frames, audio=audio)


# the diffusion decoder's original names -> diffusers' (diffusers' scripts/convert_ltx2_diffusion_vae_to_diffusers.py);
# its fused qkv is split apart
DIFFUSION_DECODER_NAMES = ((r"\.t_embedder\.mlp\.0\.", ".t_embedder.timestep_embedder.linear_1."),
                           (r"\.t_embedder\.mlp\.2\.", ".t_embedder.timestep_embedder.linear_2."),
                           (r"\.attn\.proj\.", ".attn.to_out.0."), (r"\.attn\.q_norm\.", ".attn.norm_q."),
                           (r"\.attn\.k_norm\.", ".attn.norm_k."))


# static AdaLN gates some files carry beside the layer they gate: folded into it (the decoder's residuals are
# ungated), as diffusers' conversion script and Lightricks' loader do
GATED_LAYERS = {".attn.to_out.0.weight": ".gate_msa", ".attn.to_out.0.bias": ".gate_msa",
                ".mlp.w_down.weight": ".gate_mlp",
                ".context_proj.weight": ".gate_ctx", ".context_proj.bias": ".gate_ctx"}


def diffusion_decoder_from_file(state: dict) -> dict:
    """LTX2VideoDiffusionDecoderModel's state dict from a diffusion-decoder VAE file (its `decoder.` keys and latent
    statistics), renamed as diffusers' conversion script does, its gates folded in; what diffusers' decoder has no
    parameter for is not the decoder's (the preview heads `coarse_*`, the frame-type embedding `type_emb`)."""
    out = {"latents_mean": state["per_channel_statistics.mean-of-means"],
           "latents_std": state["per_channel_statistics.std-of-means"]}
    decoder = renamed({k: v for k, v in state.items() if k.startswith("decoder.") and ".coarse_" not in k
                       and not k.startswith("decoder.type_emb")}, DIFFUSION_DECODER_NAMES)
    gates = {k: decoder.pop(k) for k in list(decoder) if k.endswith(tuple(set(GATED_LAYERS.values())))}
    for key, value in decoder.items():
        layer = next((layer for layer in GATED_LAYERS if key.endswith(layer)), None)
        gate = gates.get(key[:-len(layer)] + GATED_LAYERS[layer]) if layer else None
        if gate is not None:
            value = ((gate[:, None] if value.ndim == 2 else gate).float() * value.float()).to(value.dtype)
        if ".attn.qkv." in key:
            for name, part in zip(("to_q", "to_k", "to_v"), value.chunk(3)):
                out[key.replace(".qkv.", f".{name}.")] = part
        else:
            out[key] = value
    return out


def diffusion_decoder_bytes(config: dict, width: int, height: int, frames: int) -> int:
    """What the diffusion decoder's last stage needs: its neighborhood attention over every pixel patch of the video
    runs as FlexAttention, which TorchTPU lowers to attention with a dense tokens x tokens bias (bf16) made from a
    boolean mask (one byte each), as a flex call outside torch.compile also makes; the earlier stages have fewer
    tokens. (NATTEN's kernel, on some GPUs, needs none of it: not used here.)"""
    patch = config.get("patch_size", 4)
    tokens = frames * (height // patch) * (width // patch)
    return 3 * tokens * tokens


LATENT_DECODER = LatentDecoder(
    component="diffusion_decoder",  # Lightricks/LTX-2.5-Diffusers'
    model_class="LTX2VideoDiffusionDecoderModel",
    decode_pipeline="LTX2VideoDiffusionDecodePipeline",
    slot="vae",  # the template's ltx-2.5-video-vae-bf16 carries it beside the conv encoder
    file_kind=DIFFUSION_DECODER_VAE,
    file_prefixes=("decoder.", "per_channel_statistics."),
    from_file=diffusion_decoder_from_file,
    run_bytes=diffusion_decoder_bytes,
    instead="ltx-2.5-video-vae-conv-bf16.safetensors",
    decode=diffusion_decode,
    words="LTX-2.5's diffusion decoder",
)


def context_parallel_plan(config) -> dict:
    """The `_cp_plan` for an LTX2VideoTransformer3DModel of this config: diffusers' (0.42.1) fails on 2 ranks.

    It splits the video tokens and the text, and the video rotary tables as (B, tokens, D); but a "split" rotary
    table (LTX-2's rope_type) is (B, heads, tokens, D/2), left whole (a 2-vs-4 size mismatch in the first
    attention), the per-token timestep (image to video) and the video's table for audio-video attention
    (`cross_attn_rope`) are not split, and the text attention masks, expanded per head by the attention processor,
    cannot pass Ulysses attention (it keeps all heads of a mask). Here only the video tokens are split: the per-token
    timestep and both video rotary tables with them, the video output gathered. The audio tokens and the text stay
    whole on every rank (no audio token count to divide); the attentions over them run outside CP
    (`CP_LOCAL_ATTENTION`), and the audio's attention over the video tokens (`video_to_audio_attn`) runs Ulysses
    with every rank's whole audio as its queries (duplicated keys leave attention unchanged). Measured on the tiny
    transformer, 2 ranks, both rope types: its video and audio outputs equal one process's (max diff 0.0 on CPU)."""
    from diffusers.models._modeling_parallel import ContextParallelInput, ContextParallelOutput

    def split(dim, dims, output):
        return ContextParallelInput(split_dim=dim, expected_dims=dims, split_output=output)

    # rotary tables (cos, sin): (B, heads, tokens, D/2) for "split", (B, tokens, D) for "interleaved"
    table = split(2, 4, True) if config.get("rope_type", "interleaved") == "split" else split(1, 3, True)
    return {
        "": {"hidden_states": split(1, 3, False), "timestep": split(1, 2, False)},  # timestep: when per token
        "rope": {0: table, 1: table},
        "cross_attn_rope": {0: table, 1: table},
        "proj_out": ContextParallelOutput(gather_dim=1, expected_dims=3),
    }


def tensor_parallel_plan(config) -> dict:
    """A `_tp_plan` for an LTX2VideoTransformer3DModel of this config (diffusers 0.42.1 gives it none), as Wan's
    (runtime/families/wan.py): its q/k norms span all heads (`rms_norm_across_heads`), so the query and key
    projections stay whole; each attention's value projection is sharded per head (every rank a 1/tp slice of each
    head's value channels, PackedColwiseParallel) and its output projection takes that slice (PackedRowwiseParallel,
    all-reduced); the video and the audio FFNs colwise in, rowwise out. The per-head gates of LTX-2.3's gated attention
    and its perturbed attention's value pass-through act per head, so they take the slices as they are. The video
    attentions have the video heads, the audio ones and both cross-modal attentions the audio heads."""
    from diffusers.hooks.tensor_parallel import PackedColwiseParallel, PackedRowwiseParallel

    video, audio = [1] * config["num_attention_heads"], [1] * config["audio_num_attention_heads"]
    plan = {}
    for attention, heads in (("attn1", video), ("attn2", video), ("audio_attn1", audio), ("audio_attn2", audio),
                             ("audio_to_video_attn", audio), ("video_to_audio_attn", audio)):
        plan[f"transformer_blocks.*.{attention}.to_v"] = PackedColwiseParallel(heads)
        plan[f"transformer_blocks.*.{attention}.to_out.0"] = PackedRowwiseParallel(heads)
    for ffn in ("ff", "audio_ff"):
        plan[f"transformer_blocks.*.{ffn}.net.0.proj"] = "colwise"
        plan[f"transformer_blocks.*.{ffn}.net.2"] = "rowwise"
    return plan


# the text attentions, and the audio's self-attention and the video's attention over it: their keys are whole
CP_LOCAL_ATTENTION = ("attn2", "audio_attn2", "audio_attn1", "audio_to_video_attn")

# The published configs, for the docs' table of what fits each chip: Gemma 3 12B (google/gemma-3-12b-it's text and
# vision configs) for both; LTX-2's 19B audio-video transformer and video VAE (32x spatial, 8x temporal), its
# connectors, audio VAE and vocoder at diffusers' defaults; LTX-2.3's 22B (diffusers' convert_ltx2_to_diffusers.py
# --version 2.3: gated attention and prompt modulation in the transformer, 8-layer gated connectors with a
# projection per modality, the 4-stage VAE, the vocoder with bandwidth extension), also with its transformer's linear
# layers kept in int8 or fp8 (1 byte per weight), as a File Loader keeps ltx-2.3-22b-dev-fp8's.
GEMMA3_12B = ("transformers", "Gemma3ForConditionalGeneration", dict(
    text_config=dict(hidden_size=3840, intermediate_size=15360, num_hidden_layers=48, num_attention_heads=16,
                     num_key_value_heads=8, head_dim=256, vocab_size=262208),
    vision_config=dict(hidden_size=1152, intermediate_size=4304, num_hidden_layers=27, num_attention_heads=16,
                       patch_size=14, image_size=896)))
LTX23 = {
    "text_encoder": GEMMA3_12B,
    "connectors": ("diffusers.pipelines.ltx2.connectors", "LTX2TextConnectors", dict(
        video_connector_num_attention_heads=32, video_connector_num_layers=8, video_gated_attn=True,
        audio_connector_num_attention_heads=32, audio_connector_attention_head_dim=64, audio_connector_num_layers=8,
        audio_gated_attn=True, rope_type="split", per_modality_projections=True, proj_bias=True)),
    "transformer": ("diffusers", "LTX2VideoTransformer3DModel", dict(
        num_attention_heads=32, attention_head_dim=128, audio_num_attention_heads=32, num_layers=48, patch_size=1,
        patch_size_t=1, rope_type="split", gated_attn=True, cross_attn_mod=True, audio_gated_attn=True,
        audio_cross_attn_mod=True, use_prompt_embeddings=False, perturbed_attn=True)),
    "vae": ("diffusers", "AutoencoderKLLTX2Video", dict(
        block_out_channels=(256, 512, 1024, 1024), decoder_block_out_channels=(256, 512, 512, 1024),
        layers_per_block=(4, 6, 4, 2, 2), decoder_layers_per_block=(4, 6, 4, 2, 2),
        decoder_spatio_temporal_scaling=(True, True, True, True), decoder_inject_noise=(False,) * 5,
        upsample_type=("spatiotemporal", "spatiotemporal", "temporal", "spatial"), upsample_residual=(False,) * 4,
        upsample_factor=(2, 2, 1, 2), spatial_compression_ratio=32, temporal_compression_ratio=8,
        decoder_causal=False)),
    "audio_vae": ("diffusers", "AutoencoderKLLTX2Audio", {}),
    "vocoder": ("diffusers.pipelines.ltx2.vocoder", "LTX2VocoderWithBWE", {})}
# LTX-2.5: LTX-2.3's parts with Gemma 4 12B (its published shape: 48 layers of 3840, a 262K vocabulary, 11.95B
# parameters; its attention and FFN widths are not published here, so Gemma 3 12B's, which give 11.8B; text only, its
# small vision and audio embedders left out), the video FFN without bias and the keyframe position embedding; its
# diffusion decoder (0.42B at diffusers' defaults, loaded beside the pipeline) is not counted.
GEMMA4_12B = ("transformers", "Gemma4UnifiedForConditionalGeneration", dict(text_config=dict(
    vocab_size=262144, hidden_size=3840, intermediate_size=15360, num_hidden_layers=48, num_attention_heads=16,
    num_key_value_heads=8, head_dim=256, global_head_dim=256, sliding_window=1024)))
LTX25 = {**LTX23, "text_encoder": GEMMA4_12B, "transformer": (*LTX23["transformer"][:2], dict(
    LTX23["transformer"][2], ff_bias=False, use_keyframes_abs_pos_embedding=True))}
REFERENCE_MODELS = {
    "LTX-2 (19B)": ReferenceModel({
        "text_encoder": GEMMA3_12B,
        "connectors": ("diffusers.pipelines.ltx2.connectors", "LTX2TextConnectors", {}),
        "transformer": ("diffusers", "LTX2VideoTransformer3DModel", dict(
            num_attention_heads=32, attention_head_dim=128, audio_num_attention_heads=32, num_layers=48, patch_size=1,
            patch_size_t=1, rope_type="split")),
        "vae": ("diffusers", "AutoencoderKLLTX2Video", dict(
            spatial_compression_ratio=32, temporal_compression_ratio=8, decoder_causal=False)),
        "audio_vae": ("diffusers", "AutoencoderKLLTX2Audio", {}),
        "vocoder": ("diffusers.pipelines.ltx2.vocoder", "LTX2Vocoder", {})}),
    "LTX-2.3 (22B)": ReferenceModel(LTX23),
    "LTX-2.3 (22B), int8/fp8 transformer": ReferenceModel(LTX23, quantized={"transformer": 1}),
    # the template's files: the transformer and the Gemma 4 encoder in int8 ConvRot, both kept int8
    "LTX-2.5 (22B), int8 transformer and text encoder": ReferenceModel(LTX25, quantized={"transformer": 1,
                                                                                         "text_encoder": 1}),
}

# Not measured for LTX-2: MemoryModel's defaults (measured on Wan's DiT blocks) with its FFN 4x the hidden width;
# the audio branch's tokens are few beside the video's and are not counted. The VAE decodes every frame at once.
MEMORY = MemoryModel(denoiser_shape=attention_shape(4.0), vae_shape=vae_shape, reference_models=REFERENCE_MODELS)

# What ComfyUI's LTX-2.5 templates load beside the transformer (ltx-2.5-22b-distilled-transformer-comfy-int8-convrot),
# by component
LTX25_TEXT_ENCODER = "gemma4-12b-with-proj-ltx-2.5-comfy-int8-convrot.safetensors"
LTX25_AUDIO_VAE = "ltx-2.5-audio-vae-bf16.safetensors"
LTX25_FILES = {"text_encoder": LTX25_TEXT_ENCODER,
               "connectors": f"the projection in {LTX25_TEXT_ENCODER}, the blocks in the transformer file",
               "vae": "ltx-2.5-video-vae-conv-bf16.safetensors, or the diffusion-decoder ltx-2.5-video-vae-bf16",
               "audio_vae": LTX25_AUDIO_VAE,
               "vocoder": f"the vocoder in {LTX25_AUDIO_VAE}"}

# LTX2ConditionPipeline reads the tokenizer's padding side when from_pipe makes it (the other two read it when called,
# after setting it to left): Gemma's tokenizers pad on the left, so all three unpad the prompt alike whatever ran first.
FIRST_LAST = TaskPipeline("LTX2ConditionPipeline", images=2, first_last=first_last_conditions, keyframes=1)


def in_context_conditions(reference, first, downscale: int) -> dict:
    """LTX2InContextPipeline's reference video (IC-LoRA's condition: clean, at 1/downscale of the video's size, as its
    IC-LoRA was trained) and, with an image, the first frame pinned as LTX2ConditionPipeline pins it."""
    from diffusers.pipelines.ltx2.pipeline_ltx2_condition import LTX2VideoCondition
    from diffusers.pipelines.ltx2.pipeline_ltx2_ic_lora import LTX2ReferenceCondition

    kwargs = {"reference_conditions": [LTX2ReferenceCondition(frames=reference)],
              "reference_downscale_factor": downscale}
    if first is not None:
        kwargs["conditions"] = [LTX2VideoCondition(frames=first, index=0)]
    return kwargs


IN_CONTEXT = TaskPipeline("LTX2InContextPipeline", images=1, in_context=in_context_conditions)

FAMILY = Family(
    name="LTX-2",
    model_classes={
        "LTX2Pipeline": {TEXT2VIDEO: TaskPipeline("LTX2Pipeline"),
                         IMAGE2VIDEO: TaskPipeline("LTX2ImageToVideoPipeline", images=1), FIRSTLAST2VIDEO: FIRST_LAST,
                         INCONTEXT2VIDEO: IN_CONTEXT},
        "LTX2ImageToVideoPipeline": {IMAGE2VIDEO: TaskPipeline("LTX2ImageToVideoPipeline", images=1),
                                     FIRSTLAST2VIDEO: FIRST_LAST, INCONTEXT2VIDEO: IN_CONTEXT},
    },
    takes_negative_prompt=True,
    guidance_kwarg="guidance_scale",
    guidance_hint=("3.0 (LTX-2.3's video CFG); the audio guidance (7.0), the modality guidance and the "
                   "spatio-temporal guidance stay at the pipeline's defaults"),
    size_multiple=32,  # VAE 32 x patch 1
    default_steps=30,
    latent_grid=first_frame_latents,
    # ComfyUI 0.3.75 has no LTX-2 latent format: LTX-Video's (the same 128 channels, normalised as LTX-2's) is the
    # closest for previews
    comfy_latent_format="LTXV",
    comfy_latent=None,  # video: the Video Sampler has no LATENT
    denoiser_kind=TRANSFORMER,
    # all-in-one checkpoints (LTX-2.3's: its own configs, told by the name as ComfyUI's templates name it)
    denoiser_files=("ltx-2.3-22b-dev-fp8.safetensors",
                    "ltx-2.5-22b-distilled-transformer-comfy-int8-convrot.safetensors",
                    "ltx-2-19b-dev-fp8.safetensors", "ltx-2-19b-dev.safetensors"),
    file_variants=(
        # Lightricks/LTX-2.3 holds the single files only; diffusers' own examples load its diffusers layout from here
        FileVariant("LTX2Pipeline", "diffusers/LTX-2.3-Diffusers", name_contains=("ltx-2.3", "ltx_2.3")),
        # LTX-2.5 ships its parts as separate files: the transformer (with the connector blocks), a Gemma 4 encoder
        # carrying the text projection, the video VAE, the audio VAE carrying the vocoder
        FileVariant("LTX2Pipeline", "Lightricks/LTX-2.5-Diffusers", name_contains=("ltx-2.5", "ltx_2.5"),
                    slot_kinds={"text_encoder": GEMMA4}, comfy_files=LTX25_FILES),
    ),
    file_slots=(
        FileSlot("text_encoder", GEMMA3, "gemma_3_12B_it_fp4_mixed.safetensors"),
        FileSlot("connectors", CONNECTORS, "the checkpoint's text connectors", "text_embedding_projection.",
                 checkpoint_also=CONNECTOR_BLOCKS, carried_by="text_encoder"),
        FileSlot("vae", VIDEO_VAE, "the checkpoint's VAE", "vae."),
        FileSlot("audio_vae", AUDIO_VAE, "the checkpoint's audio VAE", "audio_vae."),
        FileSlot("vocoder", VOCODER, "the checkpoint's vocoder", "vocoder.", carried_by="audio_vae"),
    ),
    default_config_repo="Lightricks/LTX-2",  # diffusers' DIFFUSERS_DEFAULT_PIPELINE_PATHS["ltx2-dev"]
    memory=MEMORY,
    default_negative_prompt="",
    fps=24.0,
    fps_kwarg="frame_rate",
    temporal_factor=8,
    default_frames=121,
    sound_rate=sound_rate,
    two_stage=TWO_STAGE,
    latent_decoder=LATENT_DECODER,  # LTX-2.5's, where its picked VAE file carries it
    cp_plan=context_parallel_plan,  # diffusers' leaves the audio branch out
    cp_local_attention=CP_LOCAL_ATTENTION,
    sigmas_as_given=sigmas_as_given,  # its distilled schedules (DISTILLED_SIGMA_VALUES, ComfyUI's ManualSigmas)
    tp_plan=tensor_parallel_plan,  # diffusers gives its transformer none
)
