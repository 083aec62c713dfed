"""MiniMax H3 (MiniMax): text to video and first/last frame to video, with a stereo sound track. diffusers runs it only
as modular blocks (`MiniMaxH3Blocks`): its folders have a modular_model_index.json and no model_index.json.

One audio-video transformer (`MiniMaxH3Transformer3DModel`) denoises the video and audio latents together, fed by a
Qwen3-VL text encoder (its 50th layer's hidden states, one prompt per call). The video VAE is 16x spatial with 17-frame
clips (frames are 17n + 5, latent frames 5n + 2), the audio VAE decodes 40 latents per second to 32 kHz stereo, returned
beside the frames as `audio` [1, 2, T]. It is guidance-distilled: no guidance, no negative prompt. It makes 5 to 15 s
at 24 fps: diffusers rounds a frame count up to the next 17n + 5 and takes 124 to 345 frames; the pack takes those
counts as they are (what is asked is what is made).

The blocks' workflows: t2va (text), fl2va (a first frame, a last frame, or both: image to video and first/last frame to
video here) and ref2va (reference to video: ordered pictures, videos and sound clips, the TPU Video Reference node's
chain), run by a second transformer, `transformer_ref`, as large as the first. A model loads one partition
(`ModularBlocks.partitions`): t2va/fl2va's `transformer`, or for a reference run ref2va's `transformer_ref` in its place
(the run's info says so), never both.

Single files: the File Loader reads Comfy-Org's fl2va diffusion models (bf16, int8 ConvRot) with diffusers' own
converter ("stacked" q/k/v, as every published single file is), and its "pruned" ones, the templates' (ComfyUI's curve
form: `adaln_t_table`, the time embedding's curve sampled on a grid, replaces the time embedder, and each AdaLN
projection is cut to that curve's rank-8 basis), as diffusers' class with those modules swapped (`CURVE_FORM`). Its
video VAE (fp16 or int8 ConvRot, dequantized on load) and audio VAE files are converted by the pack (minimax_h3_vae.py:
diffusers has no converter for them).

The text encoder file (Comfy-Org's qwen3vl_32b_minimax_h3_nvfp4_awq, ComfyUI's Qwen3-VL layout with the vision tower,
its language model's linears nvfp4 with AWQ pre-scales) is Qwen3-VL 32B cut after decoder layer 50, the layer H3 reads
(ComfyUI's comfy/text_encoders/minimax.py): no layers 51 to 64, no final norm, no lm_head. diffusers' blocks read
`hidden_states[50]` and refuse a text encoder of <= 50 layers (a 50-layer stack's last hidden state is normed), so the
slot's `layers_read` has the loader build the text encoder with the file's 50 layers only while its config keeps the
folder's count (64): its hidden states are each layer's raw output (transformers' tie of the last one to the normed
output off) and the missing norm is an identity, so `hidden_states[50]` is the whole model's and no layer past 50 is
built or run, random or not (single_file._cut_text_model). A whole Qwen3-VL 32B file loads as it is; one of fewer than
50 layers is refused.

Parallelism: context parallelism with diffusers' `_cp_plan` (its packed sequence's length depends on the prompt: split
unevenly where the ranks do not divide it, `cp_any_length`; the token refiner's text attention runs outside it), or
tensor parallelism with the family's plan (`tensor_parallel_plan`: diffusers gives the class none), for whichever
partition loads; a replica is one or the other, never both (refused when planned).
"""

import functools

from .base import (AUDIO, FIRSTLAST2VIDEO, IMAGE, IMAGE2VIDEO, REFERENCE2VIDEO, TEXT2VIDEO, VIDEO, CanvasRule, Family,
                   FileKind, FileSlot, FrameRule, MemoryModel, ModelForm, ModularBlocks, ReferenceModel, ReferenceRule,
                   TaskPipeline)
from .components import QWEN3VL, diffusers_detection_keys
from .minimax_h3_vae import AUDIO_VAE, VIDEO_VAE

PIPELINE = "MiniMaxH3ModularPipeline"
WORKFLOWS = {TEXT2VIDEO: "t2va", IMAGE2VIDEO: "fl2va", FIRSTLAST2VIDEO: "fl2va", REFERENCE2VIDEO: "ref2va"}
# diffusers' limits (MiniMaxH3Ref2VASetupStep: a video is read at 2 fps, its frames merged in pairs, so 13 frames at
# 24 fps at least), its audio VAE's rate, the release's picture short edge (reference_image_short_edge) and canvas
# (canvas_short_edge, canvas_max_pixels)
REFERENCE_RULE = ReferenceRule(most={IMAGE: 9, VIDEO: 3, AUDIO: 3}, total=12, sound_rate=32_000, picture_edge=2048,
                               canvas_edge=768, canvas_pixels=768 * 1344, fps=24.0, least_video_frames=13)


def curve_form_model(cls, config, weights):
    """The empty MiniMaxH3Transformer3DModel in ComfyUI's curve form (comfy/ldm/minimax/model.py, `adaln_curve_grid`):
    its time embedder is the file's `adaln_t_table` [grid, rank], a curve interpolated linearly at t in [0, 1] (t
    itself, not its sinusoids), and each AdaLN projection (the blocks' and the output norm's) takes that curve's rank
    coordinates as they are, without the SiLU diffusers' projections apply to a time embedding, in float32 (as ComfyUI
    keeps them). Built from the class with `time_embed_dim` = rank, then those modules swapped: the blocks,
    attention, rotary embedding and heads are diffusers' own."""
    import torch
    from accelerate import init_empty_weights

    grid, rank = weights["adaln_t_table"].shape
    timestep_curve, curve_modulation, curve_norm_out = _curve_classes()
    with init_empty_weights():
        model = cls.from_config({**config, "time_embed_dim": rank})
    model.time_proj = torch.nn.Identity()  # the curve takes t itself, not its sinusoids
    model.time_embedder = timestep_curve(grid, rank)
    for block in model.transformer_blocks:
        block.adaln_proj.__class__ = curve_modulation
    model.norm_out.__class__ = curve_norm_out
    model._keep_in_fp32_modules = [*cls._keep_in_fp32_modules, "adaln_proj", "norm_out"]
    return model


def curve_form_weights(checkpoint, config) -> dict:
    """A curve-form file's weights in that model's layout: diffusers' converter for everything but the table (its
    renames also take `blocks.N.adaln_proj.linear` and `final_layer.adaln_proj.linear` to diffusers' names), the table
    as the curve's."""
    from diffusers.loaders.single_file_utils import convert_minimax_h3_transformer_checkpoint_to_diffusers

    table = checkpoint.pop("adaln_t_table")
    state = convert_minimax_h3_transformer_checkpoint_to_diffusers(checkpoint, config)
    return {**state, "time_embedder.table": table}


@functools.cache
def _curve_classes():
    """The curve form's modules (torch and diffusers imported only when one is loaded)."""
    import torch
    from diffusers.models.transformers.transformer_minimax_h3 import (MiniMaxH3AdaLayerNormModulation,
                                                                      MiniMaxH3AdaLayerNormOut)

    class TimestepCurve(torch.nn.Module):
        """t in [0, 1] -> its point on the sampled curve, interpolated linearly between the table's two nearest rows
        (t clamped to the ends)."""

        def __init__(self, grid: int, rank: int):
            super().__init__()
            self.register_buffer("table", torch.empty(grid, rank, dtype=torch.float32))

        def forward(self, timestep):
            position = timestep.to(torch.float32).clamp(0.0, 1.0) * (self.table.shape[0] - 1)
            lower = position.floor().long().clamp(max=self.table.shape[0] - 2)
            return torch.lerp(self.table[lower], self.table[lower + 1], (position - lower).unsqueeze(1))

    class CurveModulation(MiniMaxH3AdaLayerNormModulation):
        """A block's AdaLN projection of the curve's coordinates: diffusers' own, without the SiLU."""

        def forward(self, temb):
            temb = self.linear(temb.to(self.linear.weight.dtype)).view(-1, 6 * self.hidden_size)
            return temb.chunk(6, dim=-1)

    class CurveNormOut(MiniMaxH3AdaLayerNormOut):
        """The output norm's shift and scale from the curve's coordinates: diffusers' own, without the SiLU."""

        def forward(self, hidden_states, temb, timestep_indices):
            shift, scale = self.linear(temb.to(self.linear.weight.dtype)).chunk(2, dim=-1)
            hidden_states = self.norm(hidden_states)
            return hidden_states * (1.0 + scale.index_select(0, timestep_indices)) + shift.index_select(
                0, timestep_indices)

    return TimestepCurve, CurveModulation, CurveNormOut


# ComfyUI's pruned files ("curve form"): the table replaces the time embedder, each AdaLN projection is cut to its rank
CURVE_FORM = ModelForm("adaln_t_table", curve_form_model, curve_form_weights)
# "token_refiner.blocks.0.attn.qkv_proj.weight" in the original (and ComfyUI's) layout, diffusers' names beside it
TRANSFORMER = FileKind("minimax_h3_transformer", "a MiniMax H3 diffusion model", lambda: (
    *diffusers_detection_keys("minimax-h3"), "token_refiner.refiner_blocks.0.attn.to_q.weight"), forms=(CURVE_FORM,))
UNPRUNED = "minimax_h3_fl2va_int8_convrot.safetensors"  # Comfy-Org's unpruned files: this and the bf16 one
TEXT_ENCODER = "qwen3vl_32b_minimax_h3_nvfp4_awq.safetensors"  # Comfy-Org's: 50 layers, no final norm, vision tower
TEXT_LAYER = 50  # its blocks' text_encoder_layer: they read hidden_states[50], the output of decoder layer 50


def first_last(first, last) -> dict:
    """The fl2va blocks take the first and the last frame as PIL images (diffusers stretches or cover-crops them onto
    the canvas)."""
    return {"image": first, "last_image": last}


def references(given) -> dict:
    """ref2va takes diffusers' reference objects in the prompt's order: a picture as an [H, W, 3] array, a video's
    frames with their rate and its sound, a sound clip with its rate (the blocks resample them to 24 fps and to their
    audio VAE's rate, and put each on a canvas of its own)."""
    import torch
    from diffusers.modular_pipelines.minimax_h3 import (MiniMaxH3AudioReference, MiniMaxH3ImageReference,
                                                        MiniMaxH3VideoReference)

    def sound(reference):
        return None if reference.audio is None else torch.tensor(reference.audio)

    made = {IMAGE: lambda r: MiniMaxH3ImageReference(image=r.frames[0]),
            VIDEO: lambda r: MiniMaxH3VideoReference(frames=r.frames, fps=r.fps, audio=sound(r),
                                                     sample_rate=r.sample_rate or None),
            AUDIO: lambda r: MiniMaxH3AudioReference(audio=sound(r), sample_rate=r.sample_rate)}
    return {"references": [made[reference.kind](reference) for reference in given]}


def tensor_parallel_plan(config) -> dict:
    """A `_tp_plan` for a MiniMaxH3Transformer3DModel of this config (diffusers 0.42.1 gives it none), for both
    partitions (`transformer`, `transformer_ref`: one class, one config shape).

    Its attention (self-attention over the one packed sequence, no cross-attention, no gate, unfused to_q/to_k/to_v)
    normalises q and k per head (RMSNorm over attention_head_dim), but its processor reshapes them by `attn.heads`,
    the whole count: a column shard of to_q/to_k would leave every rank all heads at a fraction of their width, whose
    per-head norms, rotary angles and q k^T are not those of the whole heads. So to_q/to_k stay whole, as Wan's
    (runtime/families/wan.py), and what is sharded is exact:
    - each attention's value projection per head (PackedColwiseParallel, one block per head): every rank keeps a
      1/tp slice of each head's value channels (values take no rotary), and attention gives that slice of each head's
      output (softmax(q k^T) v is linear in v's channels); `to_out.0` takes it (PackedRowwiseParallel, the same
      blocks) and all-reduces;
    - the SwiGLU FFN: `ff.net.0.proj` holds the value half then the gate half (diffusers' SwiGLU chunks it in two),
      so it is split per half (PackedColwiseParallel([1, 1])): each rank a 1/tp slice of both, which its own SiLU gate
      multiplies; `ff.net.2` rowwise, all-reduced.
    Both for the 50 blocks and the text's token refiner blocks (the same attention and FFN, no AdaLN). Whole on every
    rank: q/k and their norms, each block's AdaLN projection (`adaln_proj.linear`, 2688 -> 6 x 3 x 5376: 13.0B of the
    33.1B; its output is cut into six hidden-wide parameters that each multiply the whole residual, and its input, the
    shared timestep embedding, is whole: neither a column nor a row shard of it is exact), the input projections, the
    time embedder, norm_out and the output heads. The blocks are one per head: the plan depends on the head count, and
    tp must divide the heads and each head's width (56 x 128: tp 2, 4, 8). q k^T is computed whole on every rank: this
    plan saves weights, not attention time. 48.4% of the release's 33.1B parameters are sharded
    (tests/test_memory_plan.py)."""
    from diffusers.hooks.tensor_parallel import PackedColwiseParallel, PackedRowwiseParallel

    per_head = [1] * config["num_attention_heads"]
    plan = {}
    for blocks in ("transformer_blocks", "token_refiner.refiner_blocks"):
        plan[f"{blocks}.*.attn.to_v"] = PackedColwiseParallel(per_head)
        plan[f"{blocks}.*.attn.to_out.0"] = PackedRowwiseParallel(per_head)
        plan[f"{blocks}.*.ff.net.0.proj"] = PackedColwiseParallel([1, 1])  # SwiGLU: value half, gate half
        plan[f"{blocks}.*.ff.net.2"] = "rowwise"
    return plan


def first_latent_frame(pipe, latents, height, width):
    """The loop's video latents are [B, 24, latent frames, h, w]: the first latent frame is the preview."""
    return latents[:, :, 0]


def denoiser_shape(config) -> tuple:
    """MiniMaxH3Transformer3DModel: (width, FFN width, patch (t, h, w)); its attention (heads x head width, 7168) is
    wider than its residual stream (hidden_size, 5376): the wider one counts, on the high side."""
    width = max(config["hidden_size"], config["num_attention_heads"] * config["attention_head_dim"])
    return width, config["ffn_dim"], tuple(config.get("patch_size", (1, 2, 2)))


def vae_shape(config) -> tuple:
    """AutoencoderKLMiniMaxH3: 16x spatial, 4x temporal (17-frame clips: `latent_frames` counts them), its first
    stage's width, no pixel patch. Not measured: the memory model's defaults; its decoder (a ViT over 256-pixel tiles
    of one clip) holds less than that width at full resolution."""
    return 16, 4, (config.get("block_out_channels") or (128,))[0], 1


def latent_frames(frames: int) -> int:
    """17n + 5 frames make 5n + 2 latent frames (124 -> 37; diffusers' video_latent_num_frames)."""
    return (frames - 5) // 17 * 5 + 2


# The release's configs for the docs' table (runtime/memory_plan.py). The transformer, the VAE and the audio VAE are
# diffusers 0.42.1's class defaults (its default repo is MiniMaxAI/MiniMax-H3): 33.12B parameters, 61.7 GiB in bf16
# (the 66.3 GB of Comfy-Org's minimax_h3_fl2va_bf16 file), 2.60B (its 5.21 GB fp16 video VAE) and 0.15B (its 605 MB
# fp32 audio VAE) match the released files. One partition loads per run (t2va/fl2va: `transformer`). The text encoder
# is Qwen3-VL 32B's published shape (33.4B): a folder's weights all load though the blocks read its 50th layer (its
# 50-layer file loads those only).
QWEN3_VL_32B = ("transformers", "Qwen3VLForConditionalGeneration", dict(
    text_config=dict(vocab_size=151936, hidden_size=5120, intermediate_size=25600, num_hidden_layers=64,
                     num_attention_heads=64, num_key_value_heads=8, head_dim=128),
    vision_config=dict(depth=27, hidden_size=1152, intermediate_size=4304, num_heads=16, out_hidden_size=5120,
                       patch_size=16, deepstack_visual_indexes=[8, 16, 24]),
    tie_word_embeddings=False))
H3 = {"text_encoder": QWEN3_VL_32B,
      "transformer": ("diffusers", "MiniMaxH3Transformer3DModel", dict(
          num_attention_heads=56, attention_head_dim=128, hidden_size=5376, num_layers=50, ffn_dim=14336,
          text_dim=5120, patch_size=[1, 2, 2])),
      "vae": ("diffusers", "AutoencoderKLMiniMaxH3", {}), "audio_vae": ("diffusers", "AutoencoderKLMiniMaxH3Audio", {})}
CANVASES = ((1344, 768), (768, 768))  # its default canvas (16:9, 768 short edge) and 1:1
REFERENCE_MODELS = {
    "MiniMax H3 (2 x 33B partitions, one loaded), bf16": ReferenceModel(H3, sizes=CANVASES, frames=124),
    # the transformer and the text encoder with every linear layer kept int8 (a File Loader's int8 files, when the
    # pack reads this family's files)
    "MiniMax H3, int8 transformer and text encoder": ReferenceModel(
        H3, quantized={"transformer": 1, "text_encoder": 1}, sizes=CANVASES, frames=124),
}


def sound_rate(pipe) -> int:
    return pipe.audio_vae.config.sampling_rate


FAMILY = Family(
    name="MiniMax H3",
    model_classes={PIPELINE: {TEXT2VIDEO: TaskPipeline(PIPELINE), IMAGE2VIDEO: TaskPipeline(PIPELINE, images=1),
                              FIRSTLAST2VIDEO: TaskPipeline(PIPELINE, images=2, first_last=first_last),
                              REFERENCE2VIDEO: TaskPipeline(PIPELINE, references=references)}},
    modular={PIPELINE: ModularBlocks("MiniMaxH3Blocks", PIPELINE, WORKFLOWS, unguided=True,
                                     partitions=(("t2va", "fl2va"), ("ref2va",)),
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
    # the text encoder: ComfyUI's Qwen3-VL 32B cut after layer 50 (the layer its blocks read): single_file._cut_text_model
    file_slots=(FileSlot("text_encoder", QWEN3VL, TEXT_ENCODER, layers_read=TEXT_LAYER),
                FileSlot("vae", VIDEO_VAE, "minimax_h3_video_vae_int8_convrot.safetensors"),
                FileSlot("audio_vae", AUDIO_VAE, "minimax_h3_audio_vae_fp32.safetensors")),
    default_config_repo="MiniMaxAI/MiniMax-H3",
    diffusers_model_types=("minimax-h3",),
    # ref2va's transformer has fl2va's keys and shapes: only its name tells it
    unsupported_files={"ref2va": f"reference to video's own transformer is not read from a file yet (a reference run "
                                 f"loads transformer_ref from the configs folder's weights); pick the fl2va model "
                                 f"({UNPRUNED})"},
    memory=MemoryModel(denoiser_shape=denoiser_shape, vae_shape=vae_shape, latent_frames=latent_frames,
                       reference_models=REFERENCE_MODELS),
    fps=24.0,
    temporal_factor=4,  # the VAE's temporal compression; its counts are `frame_rule`'s
    frame_rule=FrameRule(17, 5, 124, 345, "5 to 15 s at 24 fps, each 17-frame clip of the video VAE"),
    default_frames=124,
    sound_rate=sound_rate,
    reference_rule=REFERENCE_RULE,
    # its blocks' canvas (canvas_short_edge, canvas_max_pixels, the 1:4 to 4:1 check), which they apply only to a size
    # they pick themselves: the pack always passes one, so it holds it to the same canvas
    canvas_rule=CanvasRule(768, 768 * 1344, 4.0, "the canvas its blocks pick sizes on"),
    partition_denoisers=("transformer_ref",),  # sharded under tp like `transformer` (Family.denoisers)
    tp_plan=tensor_parallel_plan,  # diffusers gives its transformer none
    cp_any_length=True,  # its text's tokens are not padded: the packed sequence's length depends on the prompt
    cp_local_attention=("token_refiner",),  # the text's own attention, before it joins the sequence
)
