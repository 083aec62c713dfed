#!/usr/bin/env python3
"""Build real diffusers pipelines with random weights and locally built tokenizers, fully offline.

No model hub can be reached here, so tests, the offline demo and benchmarks use pipelines built by this
script and saved with ``save_pretrained``; ``DiffusionPipeline.from_pretrained(folder)`` loads them offline.

    python tools/tiny_models.py OUT_DIR [--only flux1-schnell,sd3,...] [--size tiny|bench]

size="tiny":  1-3 MB per pipeline; a 64x64 image samples in about a second on CPU.
size="bench": the transformer has the real layer widths but only one or two blocks, so the transformer's
              compute dominates a step while it stays about 1.5 GB in float32. Text encoders and VAEs stay
              small; only their output widths match what the transformer expects.

The edit/fill models (flux1-kontext, flux1-fill, qwenimage-edit, qwenimage-edit-plus) reuse their base model's
components: Kontext is FLUX.1-dev's, Fill widens the transformer's input to 384 channels, the Qwen edit models add
a Qwen2-VL processor (the text encoder's vision tower then runs on the input images).

Every VAE uses 4 down blocks, so vae_scale_factor is 8 as in the real models: image sizes must be
multiples of 16.
Every component is built right after torch.manual_seed(...), so a given set of versions of torch,
diffusers, transformers, tokenizers and sentencepiece writes byte-identical files in any process.
Works both as a script and when imported by path (it uses no package-relative imports).
"""
from __future__ import annotations

import argparse
import collections
import io
import json
import re
import tempfile
import time
from pathlib import Path

import torch

# Each tiny model and the model class (model_index.json's _class_name) it is: its family is
# runtime/families' family of that class.
MODEL_CLASSES = {"flux1-schnell": "FluxPipeline", "flux1-dev": "FluxPipeline", "sd3": "StableDiffusion3Pipeline",
                 "flux2": "Flux2Pipeline", "qwenimage": "QwenImagePipeline", "flux1-kontext": "FluxKontextPipeline",
                 "flux1-fill": "FluxFillPipeline", "qwenimage-edit": "QwenImageEditPipeline",
                 "qwenimage-edit-plus": "QwenImageEditPlusPipeline", "flux2-klein": "Flux2KleinPipeline",
                 "sdxl": "StableDiffusionXLPipeline", "zimage": "ZImagePipeline",
                 "wan22-t2v-a14b": "WanPipeline", "wan22-i2v-a14b": "WanImageToVideoPipeline",
                 "wan22-ti2v-5b": "WanPipeline", "wan21-t2v": "WanPipeline", "wan21-i2v": "WanImageToVideoPipeline",
                 "qwenimage21": "QwenImage21Pipeline", "krea2": "Krea2Pipeline",
                 "qwenimage21-turbo": "QwenImage21Pipeline", "flux3": "Flux3ModularPipeline",
                 "flux3-distilled": "Flux3DistilledModularPipeline", "ltx2": "LTX2Pipeline",
                 "ltx23": "LTX2Pipeline", "ltx25": "LTX2Pipeline"}
FAMILIES = tuple(MODEL_CLASSES)
SIZES = ("tiny", "bench")

# Training text for the tokenizers: prompt-like words and every printable ASCII character, so that
# no character of a normal prompt maps to <unk>.
CORPUS = [
    "a photo of a cat sitting on a red chair",
    "a painting of a squirrel eating a burger",
    "an astronaut riding a horse on the moon",
    "a dog is dancing in the rain, high quality, detailed, 4k",
    "portrait of a woman, cinematic lighting, sharp focus, masterpiece",
    "landscape with mountains and a lake at sunset, photorealistic",
    "ABCDEFGHIJKLMNOPQRSTUVWXYZ abcdefghijklmnopqrstuvwxyz 0123456789",
    "! \" # $ % & ' ( ) * + , - . / : ; < = > ? @ [ \\ ] ^ _ ` { | } ~",
]


# ----------------------------------------------------------------------------------------- tokenizers
# Each builder returns (tokenizer, raw_files). raw_files ({name: bytes}) are the vocabulary files the
# tokenizer was read from; transformers 5 saves only tokenizer.json, so they are written next to it for
# the slow tokenizers of transformers 4.


def _clip_byte_chars() -> list[str]:
    """CLIP's (GPT-2's) 256 byte symbols, in CLIP's vocab order: printable bytes first as themselves,
    then the other bytes as chr(256 + n)."""
    printable = [*range(ord("!"), ord("~") + 1), *range(ord("¡"), ord("¬") + 1), *range(ord("®"), ord("ÿ") + 1)]
    others = [b for b in range(256) if b not in printable]
    return [chr(b) for b in printable] + [chr(256 + n) for n in range(len(others))]


def _clip_merges(n_merges: int = 200) -> list[tuple[str, str]]:
    """Learn CLIP-style BPE merges (words end in '</w>') from CORPUS, in pure Python so it is
    deterministic; ties are broken by the pair itself."""
    counts = collections.Counter(re.findall(r"[a-z]+", " ".join(CORPUS).lower()))
    words = {w: list(w[:-1]) + [w[-1] + "</w>"] for w in counts}
    merges = []
    for _ in range(n_merges):
        pairs = collections.Counter()
        for w, symbols in words.items():
            for pair in zip(symbols, symbols[1:]):
                pairs[pair] += counts[w]
        if not pairs:
            break
        best = min(pairs, key=lambda p: (-pairs[p], p))
        merges.append(best)
        for w, symbols in words.items():
            merged, i = [], 0
            while i < len(symbols):
                if tuple(symbols[i:i + 2]) == best:
                    merged.append(symbols[i] + symbols[i + 1])
                    i += 2
                else:
                    merged.append(symbols[i])
                    i += 1
            words[w] = merged
    return merges


def clip_tokenizer(pad_token: str = "<|endoftext|>"):
    """CLIPTokenizer read from a vocab.json + merges.txt in CLIP's layout (256 byte symbols, the same
    with '</w>', the merges, then <|startoftext|> and <|endoftext|>)."""
    from transformers import CLIPTokenizer

    base = _clip_byte_chars()
    merges = _clip_merges()
    tokens = base + [c + "</w>" for c in base] + ["".join(m) for m in merges] + ["<|startoftext|>", "<|endoftext|>"]
    vocab = {t: i for i, t in enumerate(dict.fromkeys(tokens))}
    raw = {
        "vocab.json": json.dumps(vocab).encode(),
        "merges.txt": ("#version: 0.2\n" + "".join(f"{a} {b}\n" for a, b in merges)).encode(),
    }
    with tempfile.TemporaryDirectory(prefix="tiny_tok_") as d:
        for name, data in raw.items():
            Path(d, name).write_bytes(data)
        tok = CLIPTokenizer.from_pretrained(d, model_max_length=77, pad_token=pad_token)
    return tok, raw


def t5_tokenizer(vocab_size: int = 150):
    """T5TokenizerFast from a sentencepiece unigram model trained on CORPUS (pad=0, eos=1, unk=2 as in
    T5, plus the 100 <extra_id_*> tokens). One thread keeps the training deterministic."""
    import sentencepiece as spm
    from transformers import T5TokenizerFast

    buf = io.BytesIO()
    spm.SentencePieceTrainer.train(
        sentence_iterator=iter(CORPUS * 10), model_writer=buf, vocab_size=vocab_size, model_type="unigram",
        pad_id=0, eos_id=1, unk_id=2, bos_id=-1, pad_piece="<pad>", eos_piece="</s>", unk_piece="<unk>",
        hard_vocab_limit=False, character_coverage=1.0, num_threads=1, minloglevel=2,
    )
    raw = {"spiece.model": buf.getvalue()}
    with tempfile.TemporaryDirectory(prefix="tiny_tok_") as d:
        Path(d, "spiece.model").write_bytes(raw["spiece.model"])
        tok = T5TokenizerFast.from_pretrained(d, model_max_length=512)
    return tok, raw


def _byte_level_bpe(vocab_size: int, specials: list[str], corpus: list[str], pre_tokenizer):
    """A tokenizers.Tokenizer with byte-level BPE trained on `corpus` (every byte is in the alphabet,
    so nothing is ever unknown)."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    tk = Tokenizer(models.BPE())
    tk.pre_tokenizer = pre_tokenizer
    tk.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, special_tokens=specials, show_progress=False,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tk.train_from_iterator(corpus, trainer)
    return tk


# Mistral-Small-3.1's first special tokens, at their real ids (<s>=1, </s>=2, [IMG]=10, <pad>=11).
MISTRAL_SPECIALS = ["<unk>", "<s>", "</s>", "[INST]", "[/INST]", "[AVAILABLE_TOOLS]", "[/AVAILABLE_TOOLS]",
                    "[TOOL_RESULTS]", "[/TOOL_RESULTS]", "[TOOL_CALLS]", "[IMG]", "<pad>", "[IMG_BREAK]",
                    "[IMG_END]", "[PREFIX]", "[MIDDLE]", "[SUFFIX]", "[SYSTEM_PROMPT]", "[/SYSTEM_PROMPT]"]

# Flux2Pipeline calls apply_chat_template with a system and a user message whose content is a list of
# {"type": "text", ...} parts; plain string contents are accepted too.
MISTRAL_CHAT_TEMPLATE = (
    "{{ bos_token }}{% for message in messages %}"
    "{% if message['content'] is string %}{% set parts = [{'type': 'text', 'text': message['content']}] %}"
    "{% else %}{% set parts = message['content'] %}{% endif %}"
    "{% if message['role'] == 'system' %}[SYSTEM_PROMPT]{% for c in parts %}{{ c['text'] }}{% endfor %}[/SYSTEM_PROMPT]"
    "{% elif message['role'] == 'user' %}[INST]{% for c in parts %}{% if c['type'] == 'text' %}{{ c['text'] }}"
    "{% else %}[IMG]{% endif %}{% endfor %}[/INST]"
    "{% else %}{% for c in parts %}{{ c['text'] }}{% endfor %}{{ eos_token }}{% endif %}{% endfor %}"
)


def mistral_tokenizer(vocab_size: int = 512):
    """FLUX.2's text tokenizer: a Tekken-like byte-level BPE with Mistral's special tokens and a chat
    template. The real repository stores a PixtralProcessor, which transformers 5 only builds with
    torchvision; text-to-image needs nothing but apply_chat_template, so a plain tokenizer is saved."""
    from tokenizers import pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    tk = _byte_level_bpe(vocab_size, MISTRAL_SPECIALS, CORPUS * 10,
                         pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True))
    tok = PreTrainedTokenizerFast(tokenizer_object=tk, bos_token="<s>", eos_token="</s>", unk_token="<unk>",
                                  pad_token="<pad>", model_max_length=131072)
    tok.chat_template = MISTRAL_CHAT_TEMPLATE
    return tok, {}


QWEN_SPECIALS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>", "<|object_ref_start|>", "<|object_ref_end|>",
                 "<|box_start|>", "<|box_end|>", "<|quad_start|>", "<|quad_end|>", "<|vision_start|>",
                 "<|vision_end|>", "<|vision_pad|>", "<|image_pad|>", "<|video_pad|>"]
# QwenImagePipeline's prompt template up to the user's text, and the Edit pipelines' (Edit and Edit Plus).
QWEN_TEMPLATE_PREFIX = ("<|im_start|>system\nDescribe the image by detailing the color, shape, size, texture, "
                        "quantity, text, spatial relationships of the objects and background:<|im_end|>\n"
                        "<|im_start|>user\n")
QWEN_EDIT_TEMPLATE_PREFIX = ("<|im_start|>system\nDescribe the key features of the input image (color, shape, size, "
                             "texture, objects, background), then explain how the user's text instruction should "
                             "alter or modify the image. Generate a new image that meets the user's requirements "
                             "while maintaining consistency with the original input where appropriate.<|im_end|>\n"
                             "<|im_start|>user\n")
QWEN_SPLIT_REGEX = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*"
                    r"|\s*[\r\n]+|\s+(?!\S)|\s+")


def qwen_tokenizer(vocab_size: int = 700):
    """Byte-level BPE with Qwen2's split regex and special tokens (the vision ones included, which the Edit
    pipelines' templates and the processor use). QwenImagePipeline drops the first 34 tokens of the encoded
    prompt (its template prefix), the Edit pipelines the first 64 (theirs); both prefixes are trained into the
    vocabulary often enough that they also encode to 34 and 64 tokens here."""
    from tokenizers import Regex, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    prefixes = [re.sub(r"<\|im_(start|end)\|>", "", p) for p in (QWEN_TEMPLATE_PREFIX, QWEN_EDIT_TEMPLATE_PREFIX)]
    tk = _byte_level_bpe(vocab_size, QWEN_SPECIALS, CORPUS * 10 + prefixes * 50, pre_tokenizers.Sequence([
        pre_tokenizers.Split(Regex(QWEN_SPLIT_REGEX), behavior="isolated"),
        pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
    ]))
    tok = PreTrainedTokenizerFast(tokenizer_object=tk, eos_token="<|im_end|>", pad_token="<|endoftext|>",
                                  model_max_length=32768)
    return tok, {}


# Qwen3's chat template as Flux2KleinPipeline uses it (a user message, the generation prompt, thinking off).
QWEN3_CHAT_TEMPLATE = (
    "{% for message in messages %}<|im_start|>{{ message['role'] }}\n{{ message['content'] }}<|im_end|>\n"
    "{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n"
    "{% if enable_thinking is defined and enable_thinking is false %}<think>\n\n</think>\n\n{% endif %}{% endif %}"
)


def qwen3_tokenizer():
    """The Qwen tokenizer (`qwen_tokenizer`) with Qwen3's chat template."""
    tok, raw = qwen_tokenizer()
    tok.chat_template = QWEN3_CHAT_TEMPLATE
    return tok, raw


# ------------------------------------------------------------------------------------ text encoders
def clip_text_model(tok, hidden: int, with_projection: bool, seed: int = 0):
    """2-layer CLIP text encoder; its pooled output (and projection) is `hidden` wide."""
    from transformers import CLIPTextConfig, CLIPTextModel, CLIPTextModelWithProjection

    cfg = CLIPTextConfig(
        vocab_size=len(tok), hidden_size=hidden, intermediate_size=37, num_hidden_layers=2,
        num_attention_heads=4, max_position_embeddings=77, projection_dim=hidden, hidden_act="quick_gelu",
        bos_token_id=tok.bos_token_id, eos_token_id=tok.eos_token_id, pad_token_id=tok.pad_token_id,
    )
    torch.manual_seed(seed)
    return (CLIPTextModelWithProjection if with_projection else CLIPTextModel)(cfg)


def t5_encoder(tok, d_model: int):
    """2-layer T5 v1.1-style encoder (gated-gelu, like t5-xxl); its output is `d_model` wide, while the
    attention and feed-forward stay narrow."""
    from transformers import T5Config, T5EncoderModel

    cfg = T5Config(
        vocab_size=len(tok), d_model=d_model, d_kv=8, d_ff=37, num_layers=2, num_heads=4,
        relative_attention_num_buckets=8, relative_attention_max_distance=32, feed_forward_proj="gated-gelu",
        pad_token_id=0, eos_token_id=1, decoder_start_token_id=0,
    )
    torch.manual_seed(0)
    return T5EncoderModel(cfg)


# --------------------------------------------------------------------------------------------- VAEs
def flux_sd3_vae(scaling_factor: float, shift_factor: float):
    """16-channel AutoencoderKL like FLUX.1's / SD3's, with narrow blocks."""
    from diffusers import AutoencoderKL

    torch.manual_seed(0)
    return AutoencoderKL(
        in_channels=3, out_channels=3, down_block_types=("DownEncoderBlock2D",) * 4,
        up_block_types=("UpDecoderBlock2D",) * 4, block_out_channels=(8, 16, 16, 16), layers_per_block=1,
        latent_channels=16, norm_num_groups=8, sample_size=64, scaling_factor=scaling_factor,
        shift_factor=shift_factor, use_quant_conv=False, use_post_quant_conv=False, force_upcast=False,
    )


# ---------------------------------------------------------------------------------------- pipelines
# Each builder returns (pipeline, {tokenizer_subfolder: raw_files}).


def flux1(size: str, dev: bool, in_channels: int = 64):
    """FLUX.1-schnell / FLUX.1-dev (dev adds the guidance embedding and dynamic shifting).
    bench: the real width (24 heads x 128 = 3072, T5 width 4096, CLIP pooled width 768) with one double
    block and no single block (~394M parameters, 1.6 GB; one more single block would add 141M).
    in_channels: the transformer's packed input channels (FLUX.1-Fill: 384); its output stays 64."""
    from diffusers import FlowMatchEulerDiscreteScheduler, FluxPipeline, FluxTransformer2DModel

    bench = size == "bench"
    out_channels = None if in_channels == 64 else 64  # None: as in_channels (the real FLUX.1-dev config)
    tok, tok_raw = clip_tokenizer()
    tok2, tok2_raw = t5_tokenizer()
    te = clip_text_model(tok, hidden=768 if bench else 32, with_projection=False)
    te2 = t5_encoder(tok2, d_model=4096 if bench else 32)
    torch.manual_seed(0)
    if bench:
        transformer = FluxTransformer2DModel(
            patch_size=1, in_channels=in_channels, out_channels=out_channels, num_layers=1, num_single_layers=0,
            attention_head_dim=128, num_attention_heads=24, joint_attention_dim=4096, pooled_projection_dim=768,
            guidance_embeds=dev, axes_dims_rope=(16, 56, 56),
        )
    else:
        transformer = FluxTransformer2DModel(
            patch_size=1, in_channels=in_channels, out_channels=out_channels, num_layers=1, num_single_layers=1,
            attention_head_dim=16, num_attention_heads=2, joint_attention_dim=32, pooled_projection_dim=32,
            guidance_embeds=dev, axes_dims_rope=(4, 6, 6),
        )
    vae = flux_sd3_vae(scaling_factor=0.3611, shift_factor=0.1159)
    # The real scheduler configs: schnell has a fixed shift of 1, dev shifts with the image size.
    scheduler = FlowMatchEulerDiscreteScheduler(
        shift=3.0 if dev else 1.0, use_dynamic_shifting=dev, base_shift=0.5, max_shift=1.15,
        base_image_seq_len=256, max_image_seq_len=4096,
    )
    pipe = FluxPipeline(scheduler=scheduler, vae=vae, text_encoder=te, tokenizer=tok, text_encoder_2=te2,
                        tokenizer_2=tok2, transformer=transformer)
    return pipe, {"tokenizer": tok_raw, "tokenizer_2": tok2_raw}


def flux1_kontext(size: str):
    """FLUX.1 Kontext (image editing): FLUX.1-dev's architecture and components (guidance embedding, dynamic
    shifting); the pipeline appends the input image's latents to the transformer's image tokens."""
    from diffusers import FluxKontextPipeline

    pipe, raw = flux1(size, dev=True)
    return FluxKontextPipeline(**pipe.components), raw


def flux1_fill(size: str):
    """FLUX.1 Fill (inpainting/outpainting): FLUX.1-dev whose transformer takes 384 packed channels, as
    FLUX.1-Fill-dev: 64 of the noisy latents, 64 of the masked image's latents and 256 of the mask (the
    8x8 pixel mask under each latent, packed 2x2), and outputs 64."""
    from diffusers import FluxFillPipeline

    pipe, raw = flux1(size, dev=True, in_channels=384)
    components = {k: v for k, v in pipe.components.items() if k not in ("image_encoder", "feature_extractor")}
    return FluxFillPipeline(**components), raw


def sd3(size: str):
    """Stable Diffusion 3.5: CLIP-L + CLIP-G (with projection) + T5, MMDiT with RMS qk-norm.
    tiny: SD3.5-large-like, 4 heads x 8. bench: SD3.5-medium-like (24 heads x 64 = 1536, dual attention
    in the first block, pooled 768+1280, T5 width 4096), 2 blocks; pos_embed_max_size is 128 instead of
    384 (images up to 2048 px) because that buffer is saved and would weigh 0.9 GB."""
    from diffusers import FlowMatchEulerDiscreteScheduler, SD3Transformer2DModel, StableDiffusion3Pipeline

    bench = size == "bench"
    tok, tok_raw = clip_tokenizer()
    tok2, tok2_raw = clip_tokenizer(pad_token="!")  # the CLIP-G tokenizer pads with "!"
    tok3, tok3_raw = t5_tokenizer()
    # CLIP-L and CLIP-G have different widths as in the real model (768 / 1280); SD3 zero-pads their
    # concatenated hidden states to the T5 width, so T5 must be at least as wide as both together.
    clip_l, clip_g, t5_width = (768, 1280, 4096) if bench else (32, 64, 96)
    te = clip_text_model(tok, hidden=clip_l, with_projection=True, seed=0)
    te2 = clip_text_model(tok2, hidden=clip_g, with_projection=True, seed=1)
    te3 = t5_encoder(tok3, d_model=t5_width)
    torch.manual_seed(0)
    if bench:
        transformer = SD3Transformer2DModel(
            sample_size=128, patch_size=2, in_channels=16, out_channels=16, num_layers=2, attention_head_dim=64,
            num_attention_heads=24, joint_attention_dim=t5_width, caption_projection_dim=1536,
            pooled_projection_dim=clip_l + clip_g, pos_embed_max_size=128, qk_norm="rms_norm",
            dual_attention_layers=(0,),
        )
    else:
        transformer = SD3Transformer2DModel(
            sample_size=8, patch_size=2, in_channels=16, out_channels=16, num_layers=2, attention_head_dim=8,
            num_attention_heads=4, joint_attention_dim=t5_width, caption_projection_dim=32,
            pooled_projection_dim=clip_l + clip_g, pos_embed_max_size=32, qk_norm="rms_norm",
        )
    vae = flux_sd3_vae(scaling_factor=1.5305, shift_factor=0.0609)
    scheduler = FlowMatchEulerDiscreteScheduler(shift=3.0)
    pipe = StableDiffusion3Pipeline(scheduler=scheduler, vae=vae, text_encoder=te, tokenizer=tok,
                                    text_encoder_2=te2, tokenizer_2=tok2, text_encoder_3=te3, tokenizer_3=tok3,
                                    transformer=transformer)
    return pipe, {"tokenizer": tok_raw, "tokenizer_2": tok2_raw, "tokenizer_3": tok3_raw}


def flux2(size: str):
    """FLUX.2-dev layout: Mistral3ForConditionalGeneration text encoder, AutoencoderKLFlux2 (32 latent
    channels, patchified to 128), Flux2Transformer2DModel fed with 3 stacked text-encoder layers.
    The text encoder has 30 layers so the pipeline's default text_encoder_out_layers=(10, 20, 30) work.
    bench: FLUX.2-dev's own width (48 x 128 = 6144, text width 15360) is 2.3B parameters even with one
    block of each kind, so FLUX.2-klein-4B's width is used (24 x 128 = 3072, text width 3 x 2560 = 7680,
    mlp_ratio 3) with one double block and no single block (~451M parameters, 1.8 GB)."""
    from diffusers import Flux2Pipeline
    from transformers import Mistral3Config, Mistral3ForConditionalGeneration

    bench = size == "bench"
    tok, _ = mistral_tokenizer()
    hidden = 2560 if bench else 32
    cfg = Mistral3Config(
        text_config={
            "model_type": "mistral", "vocab_size": len(tok), "hidden_size": hidden, "intermediate_size": 64,
            "num_hidden_layers": 30, "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 8,
            "max_position_embeddings": 1024, "rope_theta": 1000000000.0, "sliding_window": None,
            "bos_token_id": 1, "eos_token_id": 2, "pad_token_id": 11,
        },
        vision_config={
            "model_type": "pixtral", "hidden_size": 16, "num_hidden_layers": 1, "num_attention_heads": 2,
            "intermediate_size": 32, "image_size": 64, "patch_size": 8, "head_dim": 8,
        },
        image_token_index=tok.convert_tokens_to_ids("[IMG]"), spatial_merge_size=1, vision_feature_layer=-1,
    )
    torch.manual_seed(0)
    te = Mistral3ForConditionalGeneration(cfg)
    transformer = flux2_transformer(bench, 3 * hidden, guidance_embeds=True)
    pipe = Flux2Pipeline(scheduler=flux2_scheduler(), vae=flux2_vae(), text_encoder=te, tokenizer=tok,
                         transformer=transformer)
    return pipe, {}


def flux2_transformer(bench: bool, context_width: int, guidance_embeds: bool):
    """FLUX.2's Flux2Transformer2DModel ([dev] has the guidance embedding, [klein] none). bench: klein-4B's width
    (24 x 128 = 3072, mlp_ratio 3) with one double block and no single block; tiny: 2 x 16, one block of each."""
    from diffusers import Flux2Transformer2DModel

    torch.manual_seed(0)
    heads, head_dim, single, axes = (24, 128, 0, (32, 32, 32, 32)) if bench else (2, 16, 1, (4, 4, 4, 4))
    return Flux2Transformer2DModel(patch_size=1, in_channels=128, num_layers=1, num_single_layers=single,
                                   attention_head_dim=head_dim, num_attention_heads=heads,
                                   joint_attention_dim=context_width, mlp_ratio=3.0, axes_dims_rope=axes,
                                   guidance_embeds=guidance_embeds)


def flux2_vae():
    """FLUX.2's AutoencoderKLFlux2 (32 latent channels, patchified to 128; FLUX.2 [klein] has the same), narrow."""
    from diffusers import AutoencoderKLFlux2

    torch.manual_seed(0)
    return AutoencoderKLFlux2(
        in_channels=3, out_channels=3, down_block_types=("DownEncoderBlock2D",) * 4,
        up_block_types=("UpDecoderBlock2D",) * 4, block_out_channels=(8, 16, 16, 16), layers_per_block=1,
        latent_channels=32, norm_num_groups=8, sample_size=64, use_quant_conv=True, use_post_quant_conv=True,
    )


def flux2_scheduler():
    from diffusers import FlowMatchEulerDiscreteScheduler

    return FlowMatchEulerDiscreteScheduler(
        shift=3.0, use_dynamic_shifting=True, base_shift=0.5, max_shift=1.15, base_image_seq_len=256,
        max_image_seq_len=4096, time_shift_type="exponential",
    )


def flux2_klein(size: str, text_width: int | None = None):
    """FLUX.2 [klein] 4B layout (distilled: is_distilled, so guidance runs no CFG): a Qwen3ForCausalLM text
    encoder with 27 layers (the pipeline stacks layers 9, 18 and 27), AutoencoderKLFlux2, and a
    Flux2Transformer2DModel without a guidance embedding whose context input is 3 x the encoder's width.
    text_width: the encoder's hidden size (tiny: 16; 2560 = Qwen3-4B's gives the real context width 7680 that
    tells a klein single file from a FLUX.2 [dev] one, with a tiny transformer and a ~40 MB encoder).
    bench: FLUX.2-klein-4B's own width (24 x 128 = 3072, text width 7680, mlp_ratio 3) with one double block
    and no single block."""
    from diffusers import Flux2KleinPipeline
    from transformers import Qwen3Config, Qwen3ForCausalLM

    bench = size == "bench"
    tok, raw = qwen3_tokenizer()
    hidden = text_width or (2560 if bench else 16)
    ids = tok.convert_tokens_to_ids
    cfg = Qwen3Config(
        vocab_size=len(tok), hidden_size=hidden, intermediate_size=16, num_hidden_layers=27, num_attention_heads=2,
        num_key_value_heads=2, head_dim=8, max_position_embeddings=1024, tie_word_embeddings=True,
        bos_token_id=ids("<|endoftext|>"), eos_token_id=ids("<|im_end|>"), pad_token_id=ids("<|endoftext|>"),
    )
    torch.manual_seed(0)
    te = Qwen3ForCausalLM(cfg)
    transformer = flux2_transformer(bench, 3 * hidden, guidance_embeds=False)
    pipe = Flux2KleinPipeline(scheduler=flux2_scheduler(), vae=flux2_vae(), text_encoder=te, tokenizer=tok,
                              transformer=transformer, is_distilled=True)
    return pipe, {}


def qwen_image_vae():
    """The tiny Qwen-Image VAE (16 latent channels, 8x), which Krea 2 uses too."""
    from diffusers import AutoencoderKLQwenImage

    return AutoencoderKLQwenImage(base_dim=8, z_dim=16, dim_mult=[1, 1, 2, 2], num_res_blocks=1,
                                  temperal_downsample=[False, True, True], latents_mean=[0.0] * 16,
                                  latents_std=[1.0] * 16)


def qwenimage(size: str):
    """Qwen-Image: Qwen2.5-VL text encoder (its last hidden state is the transformer's text input),
    AutoencoderKLQwenImage, QwenImageTransformer2DModel.
    bench: the real width (24 heads x 128 = 3072, text width 3584) with one block (~380M parameters,
    1.5 GB; a second block would add 340M); the text encoder has Qwen2.5-VL-7B's attention shape
    (28 heads x 128, 4 KV heads) but one layer with a tiny MLP."""
    from diffusers import (FlowMatchEulerDiscreteScheduler, QwenImagePipeline,
                           QwenImageTransformer2DModel)
    from transformers import Qwen2_5_VLConfig, Qwen2_5_VLForConditionalGeneration

    bench = size == "bench"
    tok, _ = qwen_tokenizer()
    ids = tok.convert_tokens_to_ids
    if bench:  # Qwen2.5-VL fixes head_dim = hidden / heads; mrope_section must sum to head_dim / 2
        hidden, layers, heads, kv_heads, mrope = 3584, 1, 28, 4, [16, 24, 24]
    else:
        hidden, layers, heads, kv_heads, mrope = 16, 2, 2, 2, [1, 1, 2]
    cfg = Qwen2_5_VLConfig(
        text_config={
            "vocab_size": len(tok), "hidden_size": hidden, "intermediate_size": 32, "num_hidden_layers": layers,
            "num_attention_heads": heads, "num_key_value_heads": kv_heads,
            "rope_parameters": {"rope_type": "default", "rope_theta": 1000000.0, "mrope_section": mrope},
            "bos_token_id": ids("<|endoftext|>"), "eos_token_id": ids("<|im_end|>"),
            "pad_token_id": ids("<|endoftext|>"),
        },
        vision_config={"depth": 1, "hidden_size": 16, "intermediate_size": 16, "num_heads": 2,
                       "out_hidden_size": hidden},
        vision_start_token_id=ids("<|vision_start|>"), vision_end_token_id=ids("<|vision_end|>"),
        image_token_id=ids("<|image_pad|>"), video_token_id=ids("<|video_pad|>"),
    )
    torch.manual_seed(0)
    te = Qwen2_5_VLForConditionalGeneration(cfg)
    torch.manual_seed(0)
    vae = qwen_image_vae()
    torch.manual_seed(0)
    if bench:
        transformer = QwenImageTransformer2DModel(
            patch_size=2, in_channels=64, out_channels=16, num_layers=1, attention_head_dim=128,
            num_attention_heads=24, joint_attention_dim=hidden, guidance_embeds=False, axes_dims_rope=(16, 56, 56),
        )
    else:
        transformer = QwenImageTransformer2DModel(
            patch_size=2, in_channels=64, out_channels=16, num_layers=2, attention_head_dim=16,
            num_attention_heads=2, joint_attention_dim=hidden, guidance_embeds=False, axes_dims_rope=(8, 4, 4),
        )
    scheduler = FlowMatchEulerDiscreteScheduler(
        shift=1.0, use_dynamic_shifting=True, base_shift=0.5, max_shift=0.9, base_image_seq_len=256,
        max_image_seq_len=8192, shift_terminal=0.02, time_shift_type="exponential",
    )
    pipe = QwenImagePipeline(scheduler=scheduler, vae=vae, text_encoder=te, tokenizer=tok, transformer=transformer)
    return pipe, {}


# Qwen2-VL's image processor (Qwen-Image-Edit's processor/preprocessor_config.json): 14-px patches, two
# frames per temporal patch, 2x2 merged into one <|image_pad|> token; CLIP's mean and std.
QWEN_VL_IMAGE_PROCESSOR = {
    "do_convert_rgb": True, "do_normalize": True, "do_rescale": True, "do_resize": True,
    "image_mean": [0.48145466, 0.4578275, 0.40821073], "image_std": [0.26862954, 0.26130258, 0.27577711],
    "merge_size": 2, "patch_size": 14, "resample": 3, "rescale_factor": 1 / 255, "temporal_patch_size": 2,
}


def qwen_vl_processor(tok):
    """Qwen2VLProcessor from the tiny Qwen tokenizer and Qwen2-VL's image and video processors with their
    real settings (min_pixels 56x56, max_pixels 12845056 as in Qwen-Image-Edit): it expands each
    <|image_pad|> of the text to one token per 2x2 merged patch of its image."""
    from transformers import Qwen2VLImageProcessor, Qwen2VLProcessor, Qwen2VLVideoProcessor

    image_processor = Qwen2VLImageProcessor(**QWEN_VL_IMAGE_PROCESSOR, min_pixels=3136, max_pixels=12845056)
    video_processor = Qwen2VLVideoProcessor(**QWEN_VL_IMAGE_PROCESSOR, min_pixels=3136, max_pixels=12845056)
    return Qwen2VLProcessor(image_processor=image_processor, tokenizer=tok, video_processor=video_processor)


def qwenimage_edit(size: str, plus: bool):
    """Qwen-Image-Edit (one input image) / Qwen-Image-Edit-2509 and 2511 (Plus: several): the Qwen-Image
    components plus the Qwen2-VL processor. The text encoder runs its vision tower on the input images
    (Plus resizes them to ~384x384 first, Edit to ~1 MP); diffusers has the VAE encode each at ~1 MP
    whatever the output size, so on CPU a 64x64 edit with 2 steps takes ~5 s per input image (the VAE
    encode and the transformer over the image's 4096 latent tokens; the vision tower is negligible)."""
    from diffusers import QwenImageEditPipeline, QwenImageEditPlusPipeline

    pipe, raw = qwenimage(size)
    cls = QwenImageEditPlusPipeline if plus else QwenImageEditPipeline
    return cls(**pipe.components, processor=qwen_vl_processor(pipe.tokenizer)), raw


def sdxl(size: str):
    """Stable Diffusion XL: CLIP-L (penultimate hidden states) + OpenCLIP-bigG-like CLIP with projection (its
    pooled output feeds the UNet's added conditioning), UNet2DConditionModel with SDXL's block types, "text_time"
    added embedding and linear projections, a 4-channel VAE with force_upcast (SDXL's VAE overflows in fp16).
    tiny: 2 UNet blocks (32, 64 channels), transformer depth 1 and 2. bench: SDXL's real widths (320, 640, 1280
    channels, heads of 64, text width 768 + 1280 = 2048) with one resnet and one transformer block per level
    (~0.6B parameters, 2.4 GB)."""
    from diffusers import AutoencoderKL, EulerDiscreteScheduler, StableDiffusionXLPipeline, UNet2DConditionModel

    bench = size == "bench"
    tok, tok_raw = clip_tokenizer()
    tok2, tok2_raw = clip_tokenizer(pad_token="!")  # OpenCLIP's tokenizer pads with "!"
    clip_l, clip_g = (768, 1280) if bench else (32, 64)
    te = clip_text_model(tok, hidden=clip_l, with_projection=False, seed=0)
    te2 = clip_text_model(tok2, hidden=clip_g, with_projection=True, seed=1)
    torch.manual_seed(0)
    if bench:
        unet = UNet2DConditionModel(
            sample_size=128, block_out_channels=(320, 640, 1280), layers_per_block=1,
            down_block_types=("DownBlock2D", "CrossAttnDownBlock2D", "CrossAttnDownBlock2D"),
            up_block_types=("CrossAttnUpBlock2D", "CrossAttnUpBlock2D", "UpBlock2D"), transformer_layers_per_block=1,
            attention_head_dim=(5, 10, 20), cross_attention_dim=clip_l + clip_g, use_linear_projection=True,
            addition_embed_type="text_time", addition_time_embed_dim=256,
            projection_class_embeddings_input_dim=6 * 256 + clip_g,
        )
    else:
        unet = UNet2DConditionModel(
            sample_size=8, block_out_channels=(32, 64), layers_per_block=1,
            down_block_types=("DownBlock2D", "CrossAttnDownBlock2D"),
            up_block_types=("CrossAttnUpBlock2D", "UpBlock2D"),
            transformer_layers_per_block=(1, 2), attention_head_dim=(2, 4), cross_attention_dim=clip_l + clip_g,
            use_linear_projection=True, addition_embed_type="text_time", addition_time_embed_dim=8,
            projection_class_embeddings_input_dim=6 * 8 + clip_g, norm_num_groups=32,
        )
    torch.manual_seed(0)
    vae = AutoencoderKL(
        in_channels=3, out_channels=3, down_block_types=("DownEncoderBlock2D",) * 4,
        up_block_types=("UpDecoderBlock2D",) * 4, block_out_channels=(8, 16, 16, 16), layers_per_block=1,
        latent_channels=4, norm_num_groups=8, sample_size=64, scaling_factor=0.13025, force_upcast=True,
    )
    scheduler = EulerDiscreteScheduler(  # SDXL base's scheduler config
        beta_start=0.00085, beta_end=0.012, beta_schedule="scaled_linear", num_train_timesteps=1000,
        steps_offset=1, timestep_spacing="leading", prediction_type="epsilon", interpolation_type="linear",
        use_karras_sigmas=False,
    )
    pipe = StableDiffusionXLPipeline(vae=vae, text_encoder=te, text_encoder_2=te2, tokenizer=tok, tokenizer_2=tok2,
                                     unet=unet, scheduler=scheduler, add_watermarker=False)
    return pipe, {"tokenizer": tok_raw, "tokenizer_2": tok2_raw}


def zimage(size: str):
    """Z-Image-Turbo: a Qwen3 text encoder (Qwen3Model, as in Tongyi-MAI/Z-Image-Turbo's model_index; its
    second-to-last hidden state is the transformer's text input), FLUX.1's VAE, ZImageTransformer2DModel and
    Turbo's scheduler (fixed shift 3).
    bench: the real width (30 heads x 128 = 3840, text width 2560) with one main block and one noise and one
    context refiner block (~540M parameters, 2.2 GB); the text encoder has Qwen3-4B's width but one layer."""
    from diffusers import FlowMatchEulerDiscreteScheduler, ZImagePipeline, ZImageTransformer2DModel
    from transformers import Qwen3Config, Qwen3Model

    bench = size == "bench"
    tok, _ = qwen3_tokenizer()
    ids = tok.convert_tokens_to_ids
    hidden, layers, heads, kv_heads, head_dim = (2560, 2, 32, 8, 128) if bench else (32, 2, 2, 1, 16)
    cfg = Qwen3Config(vocab_size=len(tok), hidden_size=hidden, intermediate_size=64, num_hidden_layers=layers,
                      num_attention_heads=heads, num_key_value_heads=kv_heads, head_dim=head_dim,
                      max_position_embeddings=1024, bos_token_id=ids("<|endoftext|>"),
                      eos_token_id=ids("<|im_end|>"), pad_token_id=ids("<|endoftext|>"))
    torch.manual_seed(0)
    te = Qwen3Model(cfg)
    torch.manual_seed(0)
    if bench:
        transformer = ZImageTransformer2DModel(dim=3840, n_layers=1, n_refiner_layers=1, n_heads=30, n_kv_heads=30,
                                               cap_feat_dim=hidden, axes_dims=[32, 48, 48])
    else:
        transformer = ZImageTransformer2DModel(dim=32, n_layers=2, n_refiner_layers=1, n_heads=2, n_kv_heads=2,
                                               cap_feat_dim=hidden, axes_dims=[4, 6, 6])
    vae = flux_sd3_vae(scaling_factor=0.3611, shift_factor=0.1159)
    scheduler = FlowMatchEulerDiscreteScheduler(num_train_timesteps=1000, shift=3.0, use_dynamic_shifting=False)
    pipe = ZImagePipeline(scheduler=scheduler, vae=vae, text_encoder=te, tokenizer=tok, transformer=transformer)
    return pipe, {}


def umt5_encoder(tok, d_model: int):
    """2-layer UMT5 encoder (Wan's text encoder: T5 with a relative attention bias in every layer, gated-gelu);
    its output is `d_model` wide, while the attention and feed-forward stay narrow."""
    from transformers import UMT5Config, UMT5EncoderModel

    cfg = UMT5Config(
        vocab_size=len(tok), d_model=d_model, d_kv=8, d_ff=37, num_layers=2, num_heads=4,
        relative_attention_num_buckets=8, relative_attention_max_distance=32, feed_forward_proj="gated-gelu",
        pad_token_id=0, eos_token_id=1, decoder_start_token_id=0,
    )
    torch.manual_seed(0)
    return UMT5EncoderModel(cfg)


def wan_vae(wan22: bool):
    """Wan 2.1's AutoencoderKLWan (16 latent channels, 8x spatial, 4x temporal; also Wan 2.2 A14B's) or Wan 2.2's
    (48 channels, a 2x2 patchified residual VAE: 16x spatial, TI2V-5B's), with narrow blocks."""
    from diffusers import AutoencoderKLWan

    torch.manual_seed(0)
    if not wan22:
        return AutoencoderKLWan(base_dim=8, z_dim=16, dim_mult=[1, 1, 1, 1], num_res_blocks=1,
                                temperal_downsample=[False, True, True], latents_mean=[0.0] * 16,
                                latents_std=[1.0] * 16)
    return AutoencoderKLWan(base_dim=8, decoder_base_dim=8, z_dim=48, dim_mult=[1, 1, 1, 1], num_res_blocks=1,
                            temperal_downsample=[False, True, True], latents_mean=[0.0] * 48, latents_std=[1.0] * 48,
                            is_residual=True, in_channels=12, out_channels=12, patch_size=2, scale_factor_spatial=16)


def wan_transformer(bench: bool, in_channels: int, out_channels: int, text_dim: int, wide: bool, seed: int,
                    image_dim: int | None = None):
    """WanTransformer3DModel. bench: the real width (14B: 40 heads x 128 = 5120, ffn 13824; 5B: 24 x 128 = 3072,
    ffn 14336) with one block; tiny: 2 heads x 12 (rotary axes 4/4/4), 2 blocks. image_dim: Wan 2.1 I2V's CLIP
    image embeddings join the cross-attention (their keys and values as wide as the model)."""
    from diffusers import WanTransformer3DModel

    torch.manual_seed(seed)
    heads, head_dim, ffn = ((40, 128, 13824) if wide else (24, 128, 14336)) if bench else (2, 12, 32)
    image = dict(image_dim=image_dim, added_kv_proj_dim=heads * head_dim) if image_dim else {}
    sized = dict(num_layers=1) if bench else dict(num_layers=2, freq_dim=32, rope_max_seq_len=32)
    return WanTransformer3DModel(patch_size=(1, 2, 2), num_attention_heads=heads, attention_head_dim=head_dim,
                                 in_channels=in_channels, out_channels=out_channels, text_dim=text_dim, ffn_dim=ffn,
                                 **sized, **image)


def wan_scheduler(flow_shift: float):
    from diffusers import UniPCMultistepScheduler

    return UniPCMultistepScheduler(prediction_type="flow_prediction", use_flow_sigmas=True, num_train_timesteps=1000,
                                   flow_shift=flow_shift)


def wan22(size: str, task: str):
    """Wan 2.2: "t2v" A14B (two experts: `transformer` for the high-noise steps, `transformer_2` for the rest,
    switched at boundary_ratio 0.875), "i2v" A14B (WanImageToVideoPipeline: the first frame's latents join the
    noise, 36 input channels; no CLIP image encoder in 2.2; boundary 0.9), "ti2v" 5B (one transformer, Wan 2.2's
    VAE, expand_timesteps: text and image to video in one model). A UMT5 text encoder (4096 wide in bench)."""
    from diffusers import WanImageToVideoPipeline, WanPipeline

    bench = size == "bench"
    tok, raw = t5_tokenizer()
    text_dim = 4096 if bench else 32
    text_encoder = umt5_encoder(tok, text_dim)
    if task == "ti2v":
        transformer = wan_transformer(bench, 48, 48, text_dim, wide=False, seed=0)
        return WanPipeline(tokenizer=tok, text_encoder=text_encoder, vae=wan_vae(wan22=True),
                           scheduler=wan_scheduler(5.0), transformer=transformer, expand_timesteps=True), \
            {"tokenizer": raw}
    channels = 36 if task == "i2v" else 16
    experts = dict(transformer=wan_transformer(bench, channels, 16, text_dim, wide=True, seed=0),
                   transformer_2=wan_transformer(bench, channels, 16, text_dim, wide=True, seed=1))
    if task == "i2v":
        return WanImageToVideoPipeline(tokenizer=tok, text_encoder=text_encoder, vae=wan_vae(wan22=False),
                                       scheduler=wan_scheduler(5.0), image_processor=None, image_encoder=None,
                                       boundary_ratio=0.9, **experts), {"tokenizer": raw}
    return WanPipeline(tokenizer=tok, text_encoder=text_encoder, vae=wan_vae(wan22=False),
                       scheduler=wan_scheduler(12.0), boundary_ratio=0.875, **experts), {"tokenizer": raw}


def wan21(size: str, task: str):
    """Wan 2.1: one transformer (no boundary_ratio), Wan 2.1's VAE; "i2v" adds a CLIP vision encoder whose
    penultimate hidden states join the cross-attention (Wan 2.2's I2V has none)."""
    from diffusers import WanImageToVideoPipeline, WanPipeline
    from transformers import CLIPImageProcessor, CLIPVisionConfig, CLIPVisionModel

    bench = size == "bench"
    tok, raw = t5_tokenizer()
    text_dim = 4096 if bench else 32
    parts = dict(tokenizer=tok, text_encoder=umt5_encoder(tok, text_dim), vae=wan_vae(wan22=False),
                 scheduler=wan_scheduler(3.0 if task == "i2v" else 5.0))
    if task == "t2v":
        return WanPipeline(transformer=wan_transformer(bench, 16, 16, text_dim, wide=True, seed=0), **parts), \
            {"tokenizer": raw}
    vision = 1280 if bench else 8  # bench: ViT-H/14's width
    torch.manual_seed(0)
    image_encoder = CLIPVisionModel(CLIPVisionConfig(hidden_size=vision, intermediate_size=2 * vision,
                                                     num_hidden_layers=2, num_attention_heads=2, image_size=28,
                                                     patch_size=14))
    return WanImageToVideoPipeline(
        transformer=wan_transformer(bench, 36, 16, text_dim, wide=True, seed=0, image_dim=vision),
        image_encoder=image_encoder, image_processor=CLIPImageProcessor(size=28, crop_size=28), **parts), \
        {"tokenizer": raw}

# Qwen3-VL's chat template as QwenImage21Pipeline reads it: messages whose content is a string or a list of text parts.
QWEN3_VL_CHAT_TEMPLATE = (
    "{% for message in messages %}<|im_start|>{{ message['role'] }}\n{% if message['content'] is string %}"
    "{{ message['content'] }}{% else %}{% for part in message['content'] %}{% if part['type'] == 'text' %}"
    "{{ part['text'] }}{% endif %}{% endfor %}{% endif %}<|im_end|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)


def qwen3_vl_processor(tok):
    """Qwen3VLProcessor from the tiny Qwen tokenizer and Qwen3-VL's image and video processors (16-px patches, 2x2
    merged into one <|image_pad|> token, mean and std 0.5 as in Qwen3-VL's preprocessor_config.json)."""
    from transformers import Qwen2VLImageProcessor, Qwen3VLProcessor, Qwen3VLVideoProcessor

    settings = dict(QWEN_VL_IMAGE_PROCESSOR, patch_size=16, image_mean=[0.5] * 3, image_std=[0.5] * 3)
    return Qwen3VLProcessor(image_processor=Qwen2VLImageProcessor(**settings, min_pixels=4096, max_pixels=16777216),
                            video_processor=Qwen3VLVideoProcessor(**settings), tokenizer=tok,
                            chat_template=QWEN3_VL_CHAT_TEMPLATE)


def qwen3_vl_config(tok, hidden: int, layers: int, heads: int, kv_heads: int, head_dim: int, mrope: list,
                    intermediate: int = 32, **vision):
    """A Qwen3-VL config on the tiny Qwen tokenizer, as the 2026 image families' text encoders (head_dim / 2 is split
    over the three mrope axes); a one-block vision tower whose output is the text width, with `vision` settings."""
    from transformers import Qwen3VLConfig

    ids = tok.convert_tokens_to_ids
    return Qwen3VLConfig(
        text_config={"vocab_size": len(tok), "hidden_size": hidden, "intermediate_size": intermediate,
                     "num_hidden_layers": layers, "num_attention_heads": heads, "num_key_value_heads": kv_heads,
                     "head_dim": head_dim,
                     "rope_parameters": {"rope_type": "default", "rope_theta": 5000000.0, "mrope_section": mrope,
                                         "mrope_interleaved": True},
                     "bos_token_id": ids("<|endoftext|>"), "eos_token_id": ids("<|im_end|>"),
                     "pad_token_id": ids("<|endoftext|>")},
        vision_config={"depth": 1, "hidden_size": 16, "intermediate_size": 16, "num_heads": 2, "out_hidden_size": hidden,
                       "deepstack_visual_indexes": [0], **vision},
        image_token_id=ids("<|image_pad|>"), video_token_id=ids("<|video_pad|>"),
        vision_start_token_id=ids("<|vision_start|>"), vision_end_token_id=ids("<|vision_end|>"))


def qwenimage21(size: str):
    """Qwen-Image 2.1: a Qwen3-VL text encoder (its last decoder layer's output, before the final norm, is the
    transformer's text input; the vision tower reads the edit's condition images), AutoencoderKLQwenImage21 (16x,
    RGBA) and QwenImage21Transformer2DModel (one token per latent pixel). The tiny VAE has the real model's 64 latent
    channels (ComfyUI's QwenImage21 latent format and preview factors are for 64); sizes are multiples of 32 as for
    the real one.
    bench: the transformer has the real width (32 heads x 128 = 4096, text width 4096 as Qwen3-VL-8B's) with one
    block; the text encoder has Qwen3-VL-8B's width but one layer."""
    from diffusers import (AutoencoderKLQwenImage21, FlowMatchEulerDiscreteScheduler, QwenImage21Pipeline,
                           QwenImage21Transformer2DModel)
    from transformers import Qwen3VLForConditionalGeneration

    bench = size == "bench"
    tok, _ = qwen_tokenizer()
    hidden, layers, heads, kv_heads, head_dim, mrope = (4096, 1, 32, 8, 128, [24, 20, 20]) if bench else \
        (16, 2, 2, 2, 8, [2, 1, 1])
    cfg = qwen3_vl_config(tok, hidden, layers, heads, kv_heads, head_dim, mrope, patch_size=16,
                          num_position_embeddings=64)
    torch.manual_seed(0)
    te = Qwen3VLForConditionalGeneration(cfg)
    torch.manual_seed(0)
    vae = AutoencoderKLQwenImage21(base_dim=8, decoder_base_dim=8, z_dim=64, dim_mult=[1, 1, 1, 1, 1], num_res_blocks=1,
                                   latents_mean=[0.0] * 64, latents_std=[1.0] * 64)
    torch.manual_seed(0)
    width, blocks, transformer_heads, rope = (128, 1, 32, (16, 56, 56)) if bench else (16, 2, 2, (4, 6, 6))
    transformer = QwenImage21Transformer2DModel(in_channels=64, out_channels=64, num_layers=blocks,
                                                attention_head_dim=width, num_attention_heads=transformer_heads,
                                                context_in_dim=hidden, axes_dims_rope=rope)
    scheduler = FlowMatchEulerDiscreteScheduler(shift=1.0, use_dynamic_shifting=True, base_shift=0.5, max_shift=1.15,
                                                base_image_seq_len=256, max_image_seq_len=4096)
    pipe = QwenImage21Pipeline(scheduler=scheduler, vae=vae, text_encoder=te, processor=qwen3_vl_processor(tok),
                               transformer=transformer)
    return pipe, {}


def qwenimage21_turbo(size: str):
    """Qwen-Image 2.1 Turbo: Qwen-Image 2.1's classes with the distilled checkpoint's fixed sampling grid,
    `sample_sigmas` in model_index.json (3 steps here), and a scheduler that keeps it unshifted (diffusers'
    documented settings for a fixed grid)."""
    from diffusers import FlowMatchEulerDiscreteScheduler, QwenImage21Pipeline

    base, tokenizer_files = qwenimage21(size)
    scheduler = FlowMatchEulerDiscreteScheduler(shift=1.0, use_dynamic_shifting=False, shift_terminal=None)
    return QwenImage21Pipeline(**{**base.components, "scheduler": scheduler},
                               sample_sigmas=[1.0, 0.9, 0.6]), tokenizer_files


def krea2(size: str):
    """Krea 2 (raw; the turbo model is the same classes with is_distilled): a Qwen3-VL text encoder (Qwen3VLModel)
    whose hidden states of several layers are stacked per token (`text_encoder_select_layers`), Qwen-Image's VAE and
    Krea2Transformer2DModel; the prompt is padded to 512 tokens. The Qwen tokenizer encodes Krea 2's template prefix
    (QwenImage's) to the 34 tokens the pipeline drops.
    bench: the real width (48 heads x 128 = 6144, 12 KV heads, FFN 16384, text width 2560) with one block; the text
    encoder has Qwen3-VL-4B's width but two layers."""
    from diffusers import (FlowMatchEulerDiscreteScheduler, Krea2Pipeline,
                           Krea2Transformer2DModel)
    from transformers import Qwen3VLModel

    bench = size == "bench"
    tok, _ = qwen_tokenizer()
    hidden, heads, kv_heads, head_dim, mrope = (2560, 32, 8, 128, [24, 20, 20]) if bench else (32, 2, 1, 16, [2, 3, 3])
    cfg = qwen3_vl_config(tok, hidden, 2, heads, kv_heads, head_dim, mrope, intermediate=64)
    torch.manual_seed(0)
    text_encoder = Qwen3VLModel(cfg)
    torch.manual_seed(0)
    vae = qwen_image_vae()
    torch.manual_seed(0)
    if bench:
        transformer = Krea2Transformer2DModel(num_layers=1, text_hidden_dim=hidden, num_text_layers=2,
                                              num_layerwise_text_blocks=1, num_refiner_text_blocks=1)
    else:
        transformer = Krea2Transformer2DModel(
            in_channels=64, num_layers=2, attention_head_dim=16, num_attention_heads=2, num_key_value_heads=1,
            intermediate_size=32, timestep_embed_dim=32, text_hidden_dim=hidden, num_text_layers=2,
            text_num_attention_heads=2, text_num_key_value_heads=2, text_intermediate_size=32,
            num_layerwise_text_blocks=1, num_refiner_text_blocks=1, axes_dims_rope=(4, 6, 6))
    scheduler = FlowMatchEulerDiscreteScheduler(shift=1.0, use_dynamic_shifting=True, base_shift=0.5, max_shift=1.15,
                                                base_image_seq_len=256, max_image_seq_len=6400,
                                                time_shift_type="exponential")
    return Krea2Pipeline(scheduler=scheduler, vae=vae, text_encoder=text_encoder, tokenizer=tok,
                         transformer=transformer, text_encoder_select_layers=(1, 2)), {}


# Qwen3.5's chat template as FLUX 3's prompt upsampler reads it: text and image parts (an image is its vision tokens,
# which the processor widens to the image's patches), no thinking block.
QWEN35_CHAT_TEMPLATE = (
    "{% for message in messages %}<|im_start|>{{ message['role'] }}\n{% if message['content'] is string %}"
    "{{ message['content'] }}{% else %}{% for part in message['content'] %}{% if part['type'] == 'text' %}"
    "{{ part['text'] }}{% elif part['type'] == 'image' %}<|vision_start|><|image_pad|><|vision_end|>{% endif %}"
    "{% endfor %}{% endif %}<|im_end|>\n{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)


def qwen35_prompt_upsampler(tok):
    """A Qwen3.5 vision-language model (Qwen3_5ForConditionalGeneration: linear-attention and full-attention layers)
    and its processor, as FLUX 3's prompt upsampler. Its captions are one random word-piece long, so that a run does
    not write the blocks' 3584 tokens (minutes on CPU with transformers' reference linear attention): every token ends
    a caption (its generation config's eos_token_id), and a special token, which decoding would drop, never comes
    first (their output rows are zero, below the normal tokens' best logit)."""
    from transformers import Qwen3_5Config, Qwen3_5ForConditionalGeneration

    ids = tok.convert_tokens_to_ids
    cfg = Qwen3_5Config(
        text_config={"vocab_size": len(tok), "hidden_size": 16, "intermediate_size": 32, "num_hidden_layers": 2,
                     "num_attention_heads": 2, "num_key_value_heads": 1, "head_dim": 8,
                     "layer_types": ["linear_attention", "full_attention"], "linear_key_head_dim": 8,
                     "linear_value_head_dim": 8, "linear_num_key_heads": 2, "linear_num_value_heads": 2,
                     "rope_parameters": {"rope_type": "default", "rope_theta": 10000.0, "partial_rotary_factor": 0.25,
                                         "mrope_section": [1, 1, 0]},
                     "bos_token_id": ids("<|endoftext|>"), "eos_token_id": ids("<|im_end|>"),
                     "pad_token_id": ids("<|endoftext|>"), "tie_word_embeddings": False},
        vision_config={"depth": 1, "hidden_size": 16, "intermediate_size": 16, "num_heads": 2, "out_hidden_size": 16,
                       "num_position_embeddings": 64},
        tie_word_embeddings=False,
        image_token_id=ids("<|image_pad|>"), video_token_id=ids("<|video_pad|>"),
        vision_start_token_id=ids("<|vision_start|>"), vision_end_token_id=ids("<|vision_end|>"))
    torch.manual_seed(0)
    model = Qwen3_5ForConditionalGeneration(cfg)
    special = [ids(token) for token in tok.all_special_tokens + QWEN_SPECIALS]
    with torch.no_grad():
        model.lm_head.weight[special] = 0
    model.generation_config.eos_token_id = list(range(len(tok)))
    processor = qwen3_vl_processor(tok)
    processor.chat_template = QWEN35_CHAT_TEMPLATE
    return model, processor


def flux3(size: str, distilled: bool):
    """FLUX 3 [klein], base or distilled (its transformer has the flow map's second timestep embedder): a Qwen3-VL
    text encoder (hidden states of layers 4, 8, ..., 32 stacked per token, so it has 32 layers), FLUX.2's VAE,
    Flux3Transformer2DModel and the Qwen3.5 prompt upsampler, saved as diffusers saves modular blocks: a
    modular_model_index.json whose components load from the folder itself (no repository named in it).
    bench: the transformer has the real width (24 heads x 128 = 3072; text width 8 x 2560, Qwen3-VL-4B's) with one
    block of each kind; the text encoder has Qwen3-VL-4B's width with 32 narrow-FFN layers."""
    from diffusers import Flux3Transformer2DModel
    from diffusers.modular_pipelines import Flux3AutoBlocks, Flux3DistilledAutoBlocks
    from transformers import Qwen3VLForConditionalGeneration

    bench = size == "bench"
    tok, _ = qwen_tokenizer()
    hidden, heads, kv_heads, head_dim, mrope = (2560, 32, 8, 128, [24, 20, 20]) if bench else (16, 2, 1, 8, [2, 1, 1])
    cfg = qwen3_vl_config(tok, hidden, 32, heads, kv_heads, head_dim, mrope, patch_size=16, num_position_embeddings=64)
    torch.manual_seed(0)
    text_encoder = Qwen3VLForConditionalGeneration(cfg)
    torch.manual_seed(0)
    vae = flux2_vae()
    torch.manual_seed(0)
    width, transformer_heads, rope = (128, 24, (32, 32, 32, 32)) if bench else (16, 2, (4, 4, 4, 4))
    transformer = Flux3Transformer2DModel(num_layers=1, num_single_layers=1, attention_head_dim=width,
                                          num_attention_heads=transformer_heads, joint_attention_dim=8 * hidden,
                                          timestep_channels=256 if bench else 32, axes_dims_rope=rope,
                                          flow_map=distilled)
    upsampler, upsampler_processor = qwen35_prompt_upsampler(tok)
    pipe = (Flux3DistilledAutoBlocks if distilled else Flux3AutoBlocks)().init_pipeline()
    pipe.update_components(transformer=transformer, vae=vae, text_encoder=text_encoder,
                           tokenizer=qwen3_vl_processor(tok), prompt_upsampler=upsampler,
                           prompt_upsampler_processor=upsampler_processor)
    return pipe, {}


def minimax_h3(size: str = "tiny"):
    """MiniMax H3 (docs/plans/minimax_h3.md): a Qwen3-VL text encoder with 51 layers (its blocks read the hidden states
    of layer 50), both transformers (t2va/fl2va's `transformer`, ref2va's `transformer_ref`), the video VAE (16x
    spatial, 4x temporal with 17-frame clips) and the audio VAE (hop 800: 40 latents/s at 32 kHz), saved as diffusers
    saves modular blocks. Tiny only; not in MODEL_CLASSES yet (the parametrised tests do not take it yet)."""
    from diffusers import (AutoencoderKLMiniMaxH3, AutoencoderKLMiniMaxH3Audio, MiniMaxH3Scheduler,
                           MiniMaxH3Transformer3DModel)
    from diffusers.modular_pipelines import MiniMaxH3Blocks
    from transformers import Qwen3VLForConditionalGeneration

    if size != "tiny":
        raise ValueError("MiniMax H3 has a tiny size only")
    tok, _ = qwen_tokenizer()
    text = 16
    cfg = qwen3_vl_config(tok, text, 51, 2, 1, 8, [2, 1, 1], patch_size=16, num_position_embeddings=64)
    torch.manual_seed(0)
    text_encoder = Qwen3VLForConditionalGeneration(cfg)
    kw = dict(num_attention_heads=2, attention_head_dim=16, hidden_size=32, num_layers=1, num_refiner_layers=1,
              ffn_dim=32, in_channels=24, audio_in_channels=32, patch_size=(1, 2, 2), text_dim=text, freq_dim=32,
              time_embed_hidden_dim=32, time_embed_dim=16, rope_freq_dim=2)
    torch.manual_seed(0)
    transformer = MiniMaxH3Transformer3DModel(**kw)
    torch.manual_seed(1)
    transformer_ref = MiniMaxH3Transformer3DModel(**kw)
    torch.manual_seed(0)
    vae = AutoencoderKLMiniMaxH3(latent_channels=24, block_out_channels=(8,) * 6, layers_per_block=1,
                                 norm_num_groups=4, decoder_num_layers=1, decoder_num_attention_heads=2,
                                 decoder_attention_head_dim=16, decoder_num_register_tokens=1, decoder_ffn_mult=1)
    torch.manual_seed(0)
    audio_vae = AutoencoderKLMiniMaxH3Audio(
        encoder_dim=4, encoder_rates=(8, 10, 10), latent_dim=32, latent_channels=32, num_attention_heads=2,
        decoder_dim=32, decoder_rates=(8, 10, 10), decoder_kernel_sizes=(16, 20, 20), resblock_kernel_sizes=(3,),
        resblock_dilation_sizes=((1,),), latents_mean=[0.0] * 32, latents_std=[1.0] * 32)
    pipe = MiniMaxH3Blocks().init_pipeline()
    pipe.update_components(text_encoder=text_encoder, tokenizer=tok, processor=qwen3_vl_processor(tok),
                           transformer=transformer, transformer_ref=transformer_ref, vae=vae, audio_vae=audio_vae,
                           scheduler=MiniMaxH3Scheduler(shift=12.0), audio_scheduler=MiniMaxH3Scheduler(shift=3.0))
    # reference pictures at a 32-pixel short edge (2048 in the release): tiny reference to video runs stay tiny
    pipe.register_to_config(reference_image_short_edge=32)
    return pipe, {}


def gemma_tokenizer(vocab_size: int = 300):
    """Byte-level BPE with Gemma's special tokens (<pad> 0, <eos> 1, <bos> 2, <unk> 3), padding on the left as
    transformers' GemmaTokenizer does: LTX2Pipeline pads on the left to max_sequence_length itself, but
    LTX2ConditionPipeline reads the tokenizer's padding side when it is made (its connectors then unpad by it), so a
    right-padding tokenizer would make its output depend on whether another LTX-2 pipeline had run first."""
    from tokenizers import pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    tk = _byte_level_bpe(vocab_size, ["<pad>", "<eos>", "<bos>", "<unk>"], CORPUS * 10,
                         pre_tokenizers.ByteLevel(add_prefix_space=False))
    return PreTrainedTokenizerFast(tokenizer_object=tk, bos_token="<bos>", eos_token="<eos>", pad_token="<pad>",
                                   unk_token="<unk>", model_max_length=1024, padding_side="left"), {}


def ltx2(size: str):
    """LTX-2 (LTX2Pipeline): text to video with a sound track. A Gemma 3 text encoder (every layer's hidden states,
    through the text connectors that feed the video and the audio branches), the audio-video transformer, the video
    VAE (2x spatial and temporal here; the real one 32x and 8x), the audio VAE (mel spectrograms) and the vocoder,
    whose `output_sampling_rate` (16 kHz here) is the waveform's rate. Shapes follow diffusers' own tiny LTX-2
    test components."""
    from diffusers import (AutoencoderKLLTX2Audio, AutoencoderKLLTX2Video, FlowMatchEulerDiscreteScheduler,
                           LTX2Pipeline, LTX2VideoTransformer3DModel)
    from diffusers.pipelines.ltx2 import LTX2TextConnectors
    from diffusers.pipelines.ltx2.vocoder import LTX2Vocoder
    from transformers import Gemma3Config, Gemma3ForConditionalGeneration

    if size != "tiny":
        raise ValueError("ltx2 has a tiny size only")
    tok, raw = gemma_tokenizer()
    torch.manual_seed(0)
    config = Gemma3Config(
        text_config=dict(vocab_size=len(tok), hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                         num_attention_heads=4, num_key_value_heads=1, head_dim=8, sliding_window=16),
        vision_config=dict(hidden_size=16, intermediate_size=32, num_hidden_layers=1, num_attention_heads=2,
                           image_size=28, patch_size=14), mm_tokens_per_image=4)
    text_encoder = Gemma3ForConditionalGeneration(config)
    hidden = config.text_config.hidden_size  # = the connectors' heads x head width
    torch.manual_seed(0)
    transformer = LTX2VideoTransformer3DModel(
        in_channels=4, out_channels=4, patch_size=1, patch_size_t=1, num_attention_heads=2, attention_head_dim=8,
        cross_attention_dim=16, audio_in_channels=4, audio_out_channels=4, audio_num_attention_heads=2,
        audio_attention_head_dim=4, audio_cross_attention_dim=8, num_layers=2, qk_norm="rms_norm_across_heads",
        caption_channels=hidden, rope_double_precision=False, rope_type="split")
    torch.manual_seed(0)
    connectors = LTX2TextConnectors(
        caption_channels=hidden, text_proj_in_factor=config.text_config.num_hidden_layers + 1,
        video_connector_num_attention_heads=4, video_connector_attention_head_dim=8, video_connector_num_layers=1,
        video_connector_num_learnable_registers=None, audio_connector_num_attention_heads=4,
        audio_connector_attention_head_dim=8, audio_connector_num_layers=1,
        audio_connector_num_learnable_registers=None, connector_rope_base_seq_len=32, rope_theta=10000.0,
        rope_double_precision=False, causal_temporal_positioning=False, rope_type="split")
    torch.manual_seed(0)
    vae = AutoencoderKLLTX2Video(
        in_channels=3, out_channels=3, latent_channels=4, block_out_channels=(8,), decoder_block_out_channels=(8,),
        layers_per_block=(1,), decoder_layers_per_block=(1, 1), spatio_temporal_scaling=(True,),
        decoder_spatio_temporal_scaling=(True,), decoder_inject_noise=(False, False), downsample_type=("spatial",),
        upsample_residual=(False,), upsample_factor=(1,), timestep_conditioning=False, patch_size=1, patch_size_t=1,
        encoder_causal=True, decoder_causal=False)
    torch.manual_seed(0)
    audio_vae = AutoencoderKLLTX2Audio(
        base_channels=4, output_channels=2, ch_mult=(1,), num_res_blocks=1, attn_resolutions=None, in_channels=2,
        resolution=32, latent_channels=2, norm_type="pixel", causality_axis="height", dropout=0.0,
        mid_block_add_attention=False, sample_rate=16000, mel_hop_length=160, is_causal=True, mel_bins=8)
    torch.manual_seed(0)
    vocoder = LTX2Vocoder(
        in_channels=2 * 8, hidden_channels=32, out_channels=2, upsample_kernel_sizes=[4, 4], upsample_factors=[2, 2],
        resnet_kernel_sizes=[3], resnet_dilations=[[1, 3, 5]], leaky_relu_negative_slope=0.1,
        output_sampling_rate=16000)
    return LTX2Pipeline(transformer=transformer, vae=vae, audio_vae=audio_vae,
                        scheduler=FlowMatchEulerDiscreteScheduler(), text_encoder=text_encoder, tokenizer=tok,
                        connectors=connectors, vocoder=vocoder), {"tokenizer": raw}



def ltx23(size: str):
    """LTX-2.3 (LTX2Pipeline with 2.3's components, as diffusers' convert_ltx2_to_diffusers --version 2.3 makes
    them): the transformer with gated attention, prompt cross-attention modulation and the perturbed (STG)
    attention, without its own caption projection; connectors with a projection per modality (biased) and gated
    attention; a 4-stage video VAE (spatial, temporal and spatio-temporal stages, as 2.3's); the vocoder with
    bandwidth extension (LTX2VocoderWithBWE: its waveform at output_sampling_rate, twice the inner vocoder's)."""
    from diffusers import (AutoencoderKLLTX2Audio, AutoencoderKLLTX2Video, FlowMatchEulerDiscreteScheduler,
                           LTX2Pipeline, LTX2VideoTransformer3DModel)
    from diffusers.pipelines.ltx2 import LTX2TextConnectors
    from diffusers.pipelines.ltx2.vocoder import LTX2VocoderWithBWE

    if size != "tiny":
        raise ValueError("ltx23 has a tiny size only")
    base, raw = ltx2(size)
    hidden = base.text_encoder.config.text_config.hidden_size
    torch.manual_seed(0)
    transformer = LTX2VideoTransformer3DModel(
        in_channels=4, out_channels=4, patch_size=1, patch_size_t=1, num_attention_heads=2, attention_head_dim=8,
        cross_attention_dim=16, audio_in_channels=4, audio_out_channels=4, audio_num_attention_heads=2,
        audio_attention_head_dim=4, audio_cross_attention_dim=8, num_layers=2, qk_norm="rms_norm_across_heads",
        caption_channels=hidden, rope_double_precision=False, rope_type="split", gated_attn=True, cross_attn_mod=True,
        audio_gated_attn=True, audio_cross_attn_mod=True, use_prompt_embeddings=False, perturbed_attn=True)
    torch.manual_seed(0)
    connectors = LTX2TextConnectors(
        caption_channels=hidden, text_proj_in_factor=base.text_encoder.config.text_config.num_hidden_layers + 1,
        video_connector_num_attention_heads=2, video_connector_attention_head_dim=8, video_connector_num_layers=1,
        video_connector_num_learnable_registers=None, video_gated_attn=True, audio_connector_num_attention_heads=2,
        audio_connector_attention_head_dim=4, audio_connector_num_layers=1,
        audio_connector_num_learnable_registers=None, audio_gated_attn=True, connector_rope_base_seq_len=32,
        rope_theta=10000.0, rope_double_precision=False, causal_temporal_positioning=False, rope_type="split",
        per_modality_projections=True, video_hidden_dim=16, audio_hidden_dim=8, proj_bias=True)
    torch.manual_seed(0)
    vae = AutoencoderKLLTX2Video(
        in_channels=3, out_channels=3, latent_channels=4, block_out_channels=(8, 16, 32, 32),
        decoder_block_out_channels=(8, 16, 16, 32), layers_per_block=(1, 1, 1, 1, 1),
        decoder_layers_per_block=(1, 1, 1, 1, 1), spatio_temporal_scaling=(True, True, True, True),
        decoder_spatio_temporal_scaling=(True, True, True, True), decoder_inject_noise=(False,) * 5,
        downsample_type=("spatial", "temporal", "spatiotemporal", "spatiotemporal"),
        upsample_type=("spatiotemporal", "spatiotemporal", "temporal", "spatial"), upsample_residual=(False,) * 4,
        upsample_factor=(2, 2, 1, 2), timestep_conditioning=False, patch_size=1, patch_size_t=1,
        encoder_causal=True, decoder_causal=False, decoder_spatial_padding_mode="zeros", spatial_compression_ratio=8,
        temporal_compression_ratio=8)
    torch.manual_seed(0)
    vocoder = LTX2VocoderWithBWE(
        in_channels=2 * 8, hidden_channels=32, out_channels=2, upsample_kernel_sizes=[4, 4], upsample_factors=[2, 2],
        resnet_kernel_sizes=[3], resnet_dilations=[[1, 3, 5]], antialias_kernel_size=4, bwe_in_channels=2 * 8,
        bwe_hidden_channels=16, bwe_upsample_kernel_sizes=[4, 4, 4], bwe_upsample_factors=[2, 2, 2],
        bwe_resnet_kernel_sizes=[3], bwe_resnet_dilations=[[1, 3, 5]], bwe_antialias_kernel_size=4,
        filter_length=32, hop_length=4, window_length=32, num_mel_channels=8, input_sampling_rate=16000,
        output_sampling_rate=32000)
    return LTX2Pipeline(transformer=transformer, vae=vae, audio_vae=base.audio_vae,
                        scheduler=FlowMatchEulerDiscreteScheduler(), text_encoder=base.text_encoder,
                        tokenizer=base.tokenizer, connectors=connectors, vocoder=vocoder), raw


def ltx25(size: str):
    """LTX-2.5 (LTX2Pipeline with 2.5's parts, as diffusers' convert_ltx2_to_diffusers --version 2.5 makes them for the
    classic pipeline): a Gemma 4 text encoder (Gemma4UnifiedForConditionalGeneration, text only), LTX-2.3's parts
    otherwise, with the transformer's video FFN without bias and its keyframe absolute-position embedding. No
    duration head (num_frames is always given) and the conv VAE decode (not the diffusion decoder)."""
    from diffusers import LTX2Pipeline, LTX2VideoTransformer3DModel
    from transformers import Gemma4UnifiedConfig, Gemma4UnifiedForConditionalGeneration

    if size != "tiny":
        raise ValueError("ltx25 has a tiny size only")
    base, raw = ltx23(size)
    torch.manual_seed(0)
    text_encoder = Gemma4UnifiedForConditionalGeneration(Gemma4UnifiedConfig(text_config=dict(
        vocab_size=len(base.tokenizer), hidden_size=32, intermediate_size=64, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=1, head_dim=8, global_head_dim=8, sliding_window=16,
        max_position_embeddings=1024, layer_types=["sliding_attention", "full_attention"])))
    torch.manual_seed(0)
    transformer = LTX2VideoTransformer3DModel.from_config(
        {**base.transformer.config, "ff_bias": False, "use_keyframes_abs_pos_embedding": True})
    return LTX2Pipeline(transformer=transformer, vae=base.vae, audio_vae=base.audio_vae, scheduler=base.scheduler,
                        text_encoder=text_encoder, tokenizer=base.tokenizer, connectors=base.connectors,
                        vocoder=base.vocoder), raw


def with_diffusion_decoder(folder) -> Path:
    """Add LTX-2.5's diffusion decoder (LTX2VideoDiffusionDecoderModel, as Lightricks/LTX-2.5-Diffusers has it in
    diffusion_decoder/) to a tiny LTX-2 folder: sized for its VAE's latents (4 channels, x8 in space and time), its
    latent statistics the VAE's. At 32x32 a decode takes ~3 s here (FlexAttention runs densely on a CPU)."""
    import json

    from diffusers import AutoencoderKLLTX2Video, LTX2VideoDiffusionDecoderModel

    out = Path(folder)
    vae = AutoencoderKLLTX2Video.from_pretrained(str(out / "vae"))
    torch.manual_seed(0)
    decoder = LTX2VideoDiffusionDecoderModel(
        latent_channels=vae.config.latent_channels, patch_size=1, decoder_head_dim=8,
        decoder_stage_channels=(16, 8, 8, 8, 8), decoder_stage_depths=(1, 1, 1, 1, 1),
        decoder_stage_kernels=((3, 3, 3),) * 4, decoder_upsample_channel_reductions=(2, 1, 1, 1),
        decoder_stage5_kernel=(3, 3, 3), decoder_t_emb_dim=16,
        spatial_compression_ratio=vae.spatial_compression_ratio,
        temporal_compression_ratio=vae.temporal_compression_ratio)
    decoder.latents_mean.copy_(vae.latents_mean)
    decoder.latents_std.copy_(vae.latents_std)
    decoder.save_pretrained(str(out / "diffusion_decoder"))
    index = json.loads((out / "model_index.json").read_text())
    index["diffusion_decoder"] = ["diffusers", "LTX2VideoDiffusionDecoderModel"]
    (out / "model_index.json").write_text(json.dumps(index, indent=2, sort_keys=True))
    return out


def ltx2_upsampler(out_dir) -> Path:
    """LTX-2's latent upscaler (LTX2LatentUpsamplerModel) for the tiny ltx2's 4 latent channels, x2 spatial with the
    rational resampler as ltx-2.3-spatial-upscaler-x2: a diffusers folder (config.json + weights). Its weights file
    is also a single upscaler file: the original checkpoints' keys are diffusers' own. Returns out_dir as a Path."""
    from diffusers.pipelines.ltx2.latent_upsampler import LTX2LatentUpsamplerModel

    torch.manual_seed(0)
    model = LTX2LatentUpsamplerModel(in_channels=4, mid_channels=32, num_blocks_per_stage=1, dims=3,
                                     spatial_upsample=True, temporal_upsample=False, rational_spatial_scale=2.0,
                                     use_rational_resampler=True)
    out = Path(out_dir)
    model.save_pretrained(str(out))
    return out

_BUILDERS = {
    "flux1-schnell": lambda size: flux1(size, dev=False),
    "flux1-dev": lambda size: flux1(size, dev=True),
    "sd3": sd3,
    "flux2": flux2,
    "qwenimage": qwenimage,
    "flux1-kontext": flux1_kontext,
    "flux1-fill": flux1_fill,
    "qwenimage-edit": lambda size: qwenimage_edit(size, plus=False),
    "qwenimage-edit-plus": lambda size: qwenimage_edit(size, plus=True),
    "flux2-klein": flux2_klein,
    "sdxl": sdxl,
    "zimage": zimage,
    "wan22-t2v-a14b": lambda size: wan22(size, "t2v"),
    "wan22-i2v-a14b": lambda size: wan22(size, "i2v"),
    "wan21-t2v": lambda size: wan21(size, "t2v"),
    "wan21-i2v": lambda size: wan21(size, "i2v"),
    "wan22-ti2v-5b": lambda size: wan22(size, "ti2v"),
    "qwenimage21": qwenimage21,
    "krea2": krea2,
    "qwenimage21-turbo": qwenimage21_turbo,
    "flux3": lambda size: flux3(size, distilled=False),
    "flux3-distilled": lambda size: flux3(size, distilled=True),
    "ltx2": ltx2,
    "ltx23": ltx23,
    "ltx25": ltx25,
}


# -------------------------------------------------------------------------------------------- saving
# transformers 5 records tokenizer classes that older transformers lack; the real hub repositories use
# T5TokenizerFast, and PreTrainedTokenizerFast exists in transformers 4 and 5.
_TOKENIZER_CLASS_RENAMES = {"T5Tokenizer": "T5TokenizerFast", "TokenizersBackend": "PreTrainedTokenizerFast"}


def _fix_model_index(pipe_dir: Path) -> None:
    """Rewrite tokenizer class names in model_index.json that only transformers 5 knows; in a modular pipeline's
    modular_model_index.json, name no repository for its components (save_pretrained writes the absolute folder it
    saved to), so they load from wherever the folder is, as diffusers does for a folder's own components."""
    path = pipe_dir / "model_index.json"
    if not path.is_file():
        path = pipe_dir / "modular_model_index.json"
        index = json.loads(path.read_text())
        for value in index.values():
            if isinstance(value, list) and len(value) == 3 and isinstance(value[2], dict):
                value[2]["pretrained_model_name_or_path"] = None
        path.write_text(json.dumps(index, indent=2, sort_keys=True) + "\n")
        return
    index = json.loads(path.read_text())
    for key, value in index.items():
        if isinstance(value, list) and len(value) == 2 and value[1] in _TOKENIZER_CLASS_RENAMES:
            index[key] = [value[0], _TOKENIZER_CLASS_RENAMES[value[1]]]
    path.write_text(json.dumps(index, indent=2, sort_keys=True) + "\n")


def _fix_processor(pipe_dir: Path) -> None:
    """Write a saved Qwen2VLProcessor in the layout of the real repositories, which transformers 4 and 5
    both read: transformers 5 saves the image and video processors inside processor_config.json, which
    transformers 4 reads as the processor's own arguments; they go to preprocessor_config.json and
    video_preprocessor_config.json instead. Its tokenizer is named as in model_index.json."""
    folder = pipe_dir / "processor"
    combined = folder / "processor_config.json"
    if not combined.is_file():
        return
    config = json.loads(combined.read_text())
    for key, filename in (("image_processor", "preprocessor_config.json"),
                          ("video_processor", "video_preprocessor_config.json")):
        part = {**config.pop(key), "processor_class": config["processor_class"]}
        (folder / filename).write_text(json.dumps(part, indent=2, sort_keys=True) + "\n")
    if set(config) - {"processor_class"}:
        raise ValueError(f"unexpected processor settings {sorted(config)} in {combined}")
    combined.unlink()
    tokenizer_config = folder / "tokenizer_config.json"
    config = json.loads(tokenizer_config.read_text())
    config["tokenizer_class"] = _TOKENIZER_CLASS_RENAMES.get(config["tokenizer_class"], config["tokenizer_class"])
    tokenizer_config.write_text(json.dumps(config, indent=2, sort_keys=True) + "\n")


def build(name: str, out_dir, size: str = "tiny") -> Path:
    """Build pipeline family `name` at `size` ("tiny" or "bench") and save it into out_dir in the
    diffusers layout; returns out_dir as a Path."""
    if name not in _BUILDERS:
        raise ValueError(f"unknown family {name!r}; expected one of {FAMILIES}")
    if size not in SIZES:
        raise ValueError(f"unknown size {size!r}; expected one of {SIZES}")
    pipe, raw_tokenizer_files = _BUILDERS[name](size)
    return save(pipe, raw_tokenizer_files, out_dir)


def save(pipe, raw_tokenizer_files: dict, out_dir) -> Path:
    """Save a pipeline built here (with its builder's raw tokenizer files) in the diffusers layout that
    transformers 4 and 5 both load; returns out_dir as a Path."""
    out = Path(out_dir)
    pipe.save_pretrained(str(out))  # a modular pipeline takes only a str
    for subfolder, files in raw_tokenizer_files.items():
        for filename, data in files.items():
            target = out / subfolder / filename
            if not target.exists():
                target.write_bytes(data)
    _fix_model_index(out)
    _fix_processor(out)
    return out


def _disk_size(folder: Path) -> int:
    return sum(f.stat().st_size for f in folder.rglob("*") if f.is_file())


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("out_dir", type=Path)
    parser.add_argument("--only", default=",".join(FAMILIES), help="comma-separated families (default: all)")
    parser.add_argument("--size", choices=SIZES, default="tiny")
    args = parser.parse_args(argv)
    names = [n.strip() for n in args.only.split(",") if n.strip()]
    unknown = [n for n in names if n not in FAMILIES]
    if unknown:
        parser.error(f"unknown families {unknown}; choose from {', '.join(FAMILIES)}")
    args.out_dir.mkdir(parents=True, exist_ok=True)
    from transformers.utils import logging as transformers_logging

    transformers_logging.disable_progress_bar()  # transformers 5 shows a bar for every saved model
    for name in names:
        t0 = time.time()
        path = build(name, args.out_dir / name, args.size)
        print(f"{path}  {_disk_size(path) / 2**20:.1f} MiB  ({time.time() - t0:.1f}s)", flush=True)


if __name__ == "__main__":
    main()
