"""Write the single-file, LoRA and image-input workflows in workflows/ (UI format): a chain of nodes, each
output feeding the next node's first input (the pipeline column, then the Sampler, then Save Image), and
Load Image nodes feeding the Sampler's image inputs. Thumbnails: tests/e2e/test_browser.py with
UPDATE_SCREENSHOT=1.

    python tools/make_file_workflows.py
"""

import json
from pathlib import Path
from typing import NamedTuple

ROOT = Path(__file__).resolve().parent.parent
PIPE, IMAGE, MASK, UPSCALER = "TPU_PIPELINE", "IMAGE", "MASK", "TPU_LATENT_UPSCALER"
REFERENCES = "TPU_VIDEO_REFERENCES"
SIZES = {"TPULoader": [320, 130], "TPUFileLoader": [340, 250], "TPULora": [320, 82], "TPUModeSelector": [320, 82],
         "TPUCompileTransformer": [320, 130], "TPUMesh": [320, 206], "TPUSampler": [400, 420],
         "TPUVideoSampler": [400, 480], "SaveImage": [400, 440], "LoadImage": [320, 330], "CreateVideo": [320, 110],
         "SaveVideo": [400, 440], "TPULatentUpscaleModel": [320, 82], "TPUVideoReference": [320, 110]}
# Each sampler's sockets in the frontend's order (widget inputs follow them); a link's target slot is the index here
SAMPLER_SOCKETS = {"TPUSampler": {"pipeline": PIPE, "image": IMAGE, "image_2": IMAGE, "image_3": IMAGE, "mask": MASK},
                   "TPUVideoSampler": {"pipeline": PIPE, "image": IMAGE, "last_image": IMAGE, "upscaler": UPSCALER,
                                       "sigmas": "SIGMAS", "reference_video": IMAGE, "references": REFERENCES}}
# TPU Video Reference's sockets in the frontend's order
REFERENCE_SOCKETS = {"references": REFERENCES, "image": IMAGE, "video": "VIDEO", "audio": "AUDIO"}
SAMPLERS = tuple(SAMPLER_SOCKETS)
SAVERS = ("SaveImage", "CreateVideo")  # what a sampler's first output feeds (Create Video then feeds Save Video)
LOAD_IMAGE_OUTPUTS = (("IMAGE", IMAGE), ("MASK", MASK))  # Load Image: the picture, and 1 - its alpha channel
FOX = "a red fox in a snowy birch forest at dawn, soft golden light, detailed fur, photograph"
FLUX1_DEV_FILES = ["flux1-dev.safetensors", "clip_l.safetensors", "t5xxl_fp16.safetensors", "none", "ae.safetensors",
                   "auto", "auto", "auto", "none", "auto", "none"]
SD35_LARGE_FILES = ["sd3.5_large.safetensors", "clip_l.safetensors", "clip_g.safetensors", "t5xxl_fp16.safetensors",
                    "none", "auto", "auto", "auto", "none", "auto", "none"]
OFFLOAD = ("TPUModeSelector", ["eager", "model_cpu_offload"])
CORGI = "a corgi running along a beach at sunset, waves, cinematic, smooth camera tracking shot"
WAN_NEGATIVE = "blurry, static, low quality, distorted, jpeg artifacts"


class Workflow(NamedTuple):
    hardware: str  # extra.tpu_diffusers.hardware: which chip, which files go where
    steps: list  # (node type, widget values): the chain, left to right
    images: tuple = ()  # (file in ComfyUI's input folder, {Sampler input: Load Image output slot}), one per Load Image
    upscaler: str = ""  # a TPU Latent Upscale Model's choice, into the Video Sampler's upscaler (two stages)
    sound: bool = False  # the Video Sampler's audio into Create Video's audio
    references: tuple = ()  # files in ComfyUI's input folder, each a Load Image into a TPU Video Reference, chained


WORKFLOWS = {
    "flux1_dev_files_offload": Workflow(
        "One TPU v6e chip (32 GB HBM) and about 64 GB of host RAM. ComfyUI's own FLUX.1-dev files (Comfy-Org "
        "layout): models/diffusion_models/flux1-dev.safetensors, models/text_encoders/clip_l.safetensors and "
        "t5xxl_fp16.safetensors, models/vae/ae.safetensors. Configs: a FLUX.1-dev folder in models/diffusers or "
        "the hub cache (the error names the command). Model CPU offload: ~33 GB of bf16 weights.",
        [("TPUFileLoader", ["flux1-dev.safetensors", "clip_l.safetensors", "t5xxl_fp16.safetensors", "none",
                            "ae.safetensors", "auto", "auto", "auto", "none", "auto", "none"]),
         ("TPUModeSelector", ["eager", "model_cpu_offload"]),
         ("TPUSampler", [FOX, "", 1024, 1024, 28, 3.5, 42, "fixed", 1, 1.0, True]),
         ("SaveImage", ["flux1_dev_files"])]),
    "sd35_large_files_compiled": Workflow(
        "One TPU v6e chip (32 GB HBM). ComfyUI's SD3.5 Large checkpoint models/checkpoints/sd3.5_large.safetensors "
        "with models/text_encoders/clip_l.safetensors, clip_g.safetensors and t5xxl_fp16.safetensors (leave "
        "text_encoder_3 at none to run without T5). ~28 GB bf16 with T5, so the transformer compiles as repeated "
        "blocks under model CPU offload.",
        [("TPUFileLoader", ["sd3.5_large.safetensors", "clip_l.safetensors", "clip_g.safetensors",
                            "t5xxl_fp16.safetensors", "none", "auto", "auto", "auto", "none", "auto", "none"]),
         ("TPUModeSelector", ["compiled", "model_cpu_offload"]),
         ("TPUCompileTransformer", ["auto", False, "1024x1024"]),
         ("TPUSampler", ["a cozy reading nook by a rainy window, warm lamp light, watercolor illustration",
                         "blurry, low quality", 1024, 1024, 40, 4.5, 42, "fixed", 1, 1.0, True]),
         ("SaveImage", ["sd35_large_files"])]),
    "flux2_dev_files_offload": Workflow(
        "A TPU host with about 128 GB of host RAM. ComfyUI's FLUX.2-dev files: models/diffusion_models/"
        "flux2_dev_fp8mixed.safetensors (upcast to bf16), models/text_encoders/mistral_3_small_flux2_bf16.safetensors, "
        "models/vae/flux2-vae.safetensors. Model CPU offload; for more speed use the FLUX.2 diffusers folder "
        "with a TP Mesh (flux2_dev_tp8.json).",
        [("TPUFileLoader", ["flux2_dev_fp8mixed.safetensors", "mistral_3_small_flux2_bf16.safetensors", "none",
                            "none", "flux2-vae.safetensors", "auto", "auto", "auto", "none", "auto", "none"]),
         ("TPUModeSelector", ["eager", "model_cpu_offload"]),
         ("TPUSampler", ["a vintage travel poster of a lighthouse on a rocky coast, bold shapes", "",
                         1024, 1024, 28, 4.0, 42, "fixed", 1, 1.0, True]),
         ("SaveImage", ["flux2_dev_files"])]),
    "qwen_image_files_offload": Workflow(
        "One TPU v6e chip (32 GB HBM) and about 96 GB of host RAM. ComfyUI's Qwen-Image files: models/"
        "diffusion_models/qwen_image_fp8_e4m3fn.safetensors and models/text_encoders/"
        "qwen_2.5_vl_7b_fp8_scaled.safetensors (both upcast to bf16), models/vae/qwen_image_vae.safetensors. "
        "Model CPU offload.",
        [("TPUFileLoader", ["qwen_image_fp8_e4m3fn.safetensors", "qwen_2.5_vl_7b_fp8_scaled.safetensors", "none",
                            "none", "qwen_image_vae.safetensors", "auto", "auto", "auto", "none", "auto", "none"]),
         ("TPUModeSelector", ["eager", "model_cpu_offload"]),
         ("TPUSampler", ["a street sign that reads 'TPU AVENUE' under cherry blossoms", "blurry", 1328, 1328, 50,
                         4.0, 42, "fixed", 1, 1.0, True]),
         ("SaveImage", ["qwen_image_files"])]),
    "flux1_dev_lora_chain_compiled": Workflow(
        "One TPU v6e chip (32 GB HBM) and about 64 GB of host RAM; the FLUX.1-dev files of "
        "flux1_dev_files_offload.json and two FLUX.1 LoRAs in models/loras (any of diffusers, kohya or ComfyUI "
        "format). The LoRAs are fused into the weights: changing a LoRA or its strength reloads and recompiles "
        "nothing. The transformer compiles as repeated blocks under offload.",
        [("TPUFileLoader", ["flux1-dev.safetensors", "clip_l.safetensors", "t5xxl_fp16.safetensors", "none",
                            "ae.safetensors", "auto", "auto", "auto", "none", "auto", "none"]),
         ("TPULora", ["flux1_style_lora.safetensors", 0.8, "high_noise"]),
         ("TPULora", ["flux1_detail_lora.safetensors", 0.5, "high_noise"]),
         ("TPUModeSelector", ["compiled", "model_cpu_offload"]),
         ("TPUCompileTransformer", ["auto", True, "1024x1024"]),
         ("TPUSampler", [FOX, "", 1024, 1024, 28, 3.5, 42, "fixed", 1, 1.0, True]),
         ("SaveImage", ["flux1_dev_lora"])]),
    "qwen_image_edit_2509_files_offload": Workflow(
        "One TPU v6e chip (32 GB HBM) and about 96 GB of host RAM. ComfyUI's Qwen-Image-Edit-2509 files: models/"
        "diffusion_models/qwen_image_edit_2509_fp8_e4m3fn.safetensors and models/text_encoders/"
        "qwen_2.5_vl_7b_fp8_scaled.safetensors (with its vision tower; both upcast to bf16), models/vae/"
        "qwen_image_vae.safetensors; configs: a Qwen-Image-Edit-2509 folder in models/diffusers or the hub cache. "
        "Two reference images in ComfyUI's input folder go to image and image_2; width/height 0 = the first "
        "image's size. The 4-step Lightning LoRA (models/loras/Qwen-Image-Edit-2509-Lightning-4steps-V1.0-bf16."
        "safetensors, the one ComfyUI's template uses; its lightx2v key layout is tested with a tiny LoRA, the real "
        "file not yet) runs 4 steps at guidance 1 (true CFG off); without it, delete the LoRA node and use 40 steps "
        "at guidance 4. Model CPU offload.",
        [("TPUFileLoader", ["qwen_image_edit_2509_fp8_e4m3fn.safetensors", "qwen_2.5_vl_7b_fp8_scaled.safetensors",
                            "none", "none", "qwen_image_vae.safetensors", "auto", "auto", "auto", "none", "auto",
                            "none"]),
         ("TPULora", ["Qwen-Image-Edit-2509-Lightning-4steps-V1.0-bf16.safetensors", 1.0, "high_noise"]),
         OFFLOAD,
         ("TPUSampler", ["the woman from image 1 sits on the sofa from image 2, reading a book, soft window light",
                         "", 0, 0, 4, 1.0, 42, "fixed", 1, 1.0, True]),
         ("SaveImage", ["qwen_image_edit_2509"])],
        images=(("qwen_edit_person.png", {"image": 0}), ("qwen_edit_sofa.png", {"image_2": 0}))),
    "qwen_image_2512_lightning_files_offload": Workflow(
        "One TPU v6e chip (32 GB HBM) and about 96 GB of host RAM. ComfyUI's Qwen-Image-2512 files: models/"
        "diffusion_models/qwen_image_2512_fp8_e4m3fn.safetensors (or qwen_image_2512_bf16; the name's '2512' picks "
        "Qwen-Image-2512's configs), models/text_encoders/qwen_2.5_vl_7b_fp8_scaled.safetensors (both upcast to "
        "bf16), models/vae/qwen_image_vae.safetensors; configs: a Qwen-Image-2512 folder in models/diffusers or the "
        "hub cache. The 4-step Lightning LoRA in models/loras (Qwen-Image-2512-Lightning-4steps-V1.0-fp32."
        "safetensors, the one ComfyUI's template downloads, or its bf16 twin; its lightx2v key layout is tested "
        "with a tiny LoRA, the real file not yet) runs 4 steps at guidance 1 (true CFG off), as ComfyUI's "
        "template does; without it, delete the LoRA node and use 50 steps at guidance 4. Model CPU offload.",
        [("TPUFileLoader", ["qwen_image_2512_fp8_e4m3fn.safetensors", "qwen_2.5_vl_7b_fp8_scaled.safetensors", "none",
                            "none", "qwen_image_vae.safetensors", "auto", "auto", "auto", "none", "auto", "none"]),
         ("TPULora", ["Qwen-Image-2512-Lightning-4steps-V1.0-fp32.safetensors", 1.0, "high_noise"]),
         OFFLOAD,
         ("TPUSampler", ["a street sign that reads 'TPU AVENUE' under cherry blossoms", "", 1328, 1328, 4, 1.0, 42,
                         "fixed", 1, 1.0, True]),
         ("SaveImage", ["qwen_image_2512_lightning"])]),
    "flux1_kontext_files_offload": Workflow(
        "One TPU v6e chip (32 GB HBM) and about 64 GB of host RAM. ComfyUI's FLUX.1 Kontext files: models/"
        "diffusion_models/flux1-dev-kontext_fp8_scaled.safetensors (upcast to bf16; the name's 'kontext' makes it "
        "load as Kontext), models/text_encoders/clip_l.safetensors and t5xxl_fp16.safetensors, models/vae/"
        "ae.safetensors; configs: a FLUX.1-Kontext-dev folder in models/diffusers or the hub cache. The image to "
        "edit goes in ComfyUI's input folder; width/height 0 = its size. Model CPU offload.",
        [("TPUFileLoader", ["flux1-dev-kontext_fp8_scaled.safetensors", *FLUX1_DEV_FILES[1:]]),
         OFFLOAD,
         ("TPUSampler", ["make it a snowy winter evening, keep the house and the people as they are", "",
                         0, 0, 28, 2.5, 42, "fixed", 1, 1.0, True]),
         ("SaveImage", ["flux1_kontext"])],
        images=(("kontext_input.png", {"image": 0}),)),
    "flux1_fill_inpaint_files_offload": Workflow(
        "One TPU v6e chip (32 GB HBM) and about 64 GB of host RAM. Inpaint with ComfyUI's FLUX.1 Fill file: models/"
        "diffusion_models/flux1-fill-dev.safetensors (told apart by its 384 input channels), models/text_encoders/"
        "clip_l.safetensors and t5xxl_fp16.safetensors, models/vae/ae.safetensors; configs: a FLUX.1-Fill-dev "
        "folder in models/diffusers or the hub cache. Paint the mask in Load Image's mask editor (white = repaint: "
        "its MASK output goes to mask); width/height 0 = the image's size. Guidance 30, as FLUX.1 Fill is tuned "
        "for. Model CPU offload.",
        [("TPUFileLoader", ["flux1-fill-dev.safetensors", *FLUX1_DEV_FILES[1:]]),
         OFFLOAD,
         ("TPUSampler", ["a vase of sunflowers on the wooden table", "", 0, 0, 28, 30.0, 42, "fixed", 1, 1.0, True]),
         ("SaveImage", ["flux1_fill_inpaint"])],
        images=(("inpaint_source.png", {"image": 0, "mask": 1}),)),
    "flux1_dev_img2img_files_offload": Workflow(
        "One TPU v6e chip (32 GB HBM) and about 64 GB of host RAM; the FLUX.1-dev files of "
        "flux1_dev_files_offload.json (models/diffusion_models/flux1-dev.safetensors, models/text_encoders/"
        "clip_l.safetensors and t5xxl_fp16.safetensors, models/vae/ae.safetensors). Image to image: the image in "
        "ComfyUI's input folder, denoise 0.6 (the last 17 of 28 steps run; lower keeps more of the image); "
        "width/height 0 = its size. Model CPU offload.",
        [("TPUFileLoader", FLUX1_DEV_FILES),
         OFFLOAD,
         ("TPUSampler", ["a watercolor painting of the same scene, soft washes of color, paper texture", "",
                         0, 0, 28, 3.5, 42, "fixed", 1, 0.6, True]),
         ("SaveImage", ["flux1_dev_img2img"])],
        images=(("img2img_source.png", {"image": 0}),)),
    "sd35_large_img2img_files_offload": Workflow(
        "One TPU v6e chip (32 GB HBM) and about 48 GB of host RAM; the SD3.5 Large files of "
        "sd35_large_files_compiled.json (models/checkpoints/sd3.5_large.safetensors, models/text_encoders/"
        "clip_l.safetensors, clip_g.safetensors and t5xxl_fp16.safetensors). Image to image: the image in "
        "ComfyUI's input folder, denoise 0.7 (the last 28 of 40 steps run); width/height 0 = its size. "
        "Model CPU offload, eager.",
        [("TPUFileLoader", SD35_LARGE_FILES),
         OFFLOAD,
         ("TPUSampler", ["an oil painting of the same scene at golden hour, thick brush strokes",
                         "blurry, low quality", 0, 0, 40, 4.5, 42, "fixed", 1, 0.7, True]),
         ("SaveImage", ["sd35_large_img2img"])],
        images=(("img2img_source.png", {"image": 0}),)),
    "sdxl_checkpoint_files_offload": Workflow(
        "One TPU v6e chip (32 GB HBM) and about 32 GB of host RAM. An SDXL all-in-one checkpoint in models/"
        "checkpoints: sd_xl_base_1.0.safetensors or any SDXL finetune (Illustrious, Pony, ...) in Stability's "
        "layout; its UNet, VAE, CLIP-L and OpenCLIP ViT-bigG all come from it (leave the text encoders at none). "
        "A separate models/vae/sdxl_vae.safetensors may replace the checkpoint's VAE. Configs: an SDXL base folder "
        "in models/diffusers or the hub cache (stabilityai/stable-diffusion-xl-base-1.0; the error names the "
        "command). Model CPU offload. Designed, not run on a chip: TorchTPU's own SDXL smoke test is marked "
        "'missing op upsample_nearest2d.out' (docs/device_check.md says how to check).",
        [("TPUFileLoader", ["sd_xl_base_1.0.safetensors", "none", "none", "none", "none", "auto", "auto", "auto", "none",
                            "auto", "none"]),
         OFFLOAD,
         ("TPUSampler", [FOX, "blurry, low quality", 1024, 1024, 30, 6.0, 42, "fixed", 1, 1.0, True]),
         ("SaveImage", ["sdxl_checkpoint"])]),
    "flux2_dev_multi_reference_tp8": Workflow(
        "One TPU host with 8 chips (e.g. v6e-8). FLUX.2-dev (the diffusers folder models/diffusers/FLUX.2-dev) "
        "sharded over all 8 chips, one worker process per chip, launched locally, as flux2_dev_tp8.json. Two "
        "reference images in ComfyUI's input folder go to image and image_2 (FLUX.2 takes up to 3, each resized "
        "to at most 1 MP); the output is 1024x1024.",
        [("TPULoader", ["FLUX.2-dev", "", "auto", "auto"]),
         ("TPUMesh", [8, True, True, "launch_local", "", "", 1, 1]),
         ("TPUSampler", ["the ceramic mug from image 1 on the desk from image 2, morning light, product photo", "",
                         1024, 1024, 28, 4.0, 42, "fixed", 1, 1.0, True]),
         ("SaveImage", ["flux2_dev_multi_reference"])],
        images=(("flux2_reference_mug.png", {"image": 0}), ("flux2_reference_desk.png", {"image_2": 0}))),
    "flux2_klein_4b_edit_files_offload": Workflow(
        "One TPU v6e chip (32 GB HBM) and about 32 GB of host RAM. ComfyUI's FLUX.2 [klein] 4B files: models/"
        "diffusion_models/flux-2-klein-4b-fp8.safetensors (upcast to bf16), models/text_encoders/"
        "qwen_3_4b.safetensors, models/vae/flux2-vae.safetensors; configs: a FLUX.2-klein-4B folder in "
        "models/diffusers or the hub cache (the 9B files and the base models' configs follow from the file). "
        "Two reference images in ComfyUI's input folder go to image and image_2 (klein takes up to 3 here, each "
        "resized to at most 1 MP). The distilled model runs 4 steps and ignores guidance. Model CPU offload.",
        [("TPUFileLoader", ["flux-2-klein-4b-fp8.safetensors", "qwen_3_4b.safetensors", "none", "none",
                            "flux2-vae.safetensors", "auto", "auto", "auto", "none", "auto", "none"]),
         OFFLOAD,
         ("TPUSampler", ["the ceramic mug from image 1 on the desk from image 2, morning light, product photo", "",
                         1024, 1024, 4, 1.0, 42, "fixed", 1, 1.0, True]),
         ("SaveImage", ["flux2_klein_4b_edit"])],
        images=(("flux2_reference_mug.png", {"image": 0}), ("flux2_reference_desk.png", {"image_2": 0}))),
    "z_image_turbo_files_offload": Workflow(
        "One TPU v6e chip (32 GB HBM) and about 48 GB of host RAM. ComfyUI's Z-Image-Turbo files: models/"
        "diffusion_models/z_image_turbo_bf16.safetensors, models/text_encoders/qwen_3_4b.safetensors, models/vae/"
        "ae.safetensors (FLUX.1's VAE); configs: a Z-Image-Turbo folder in models/diffusers or the hub cache. "
        "Turbo is distilled: 8 steps at guidance 0 (diffusers runs CFG only above 0; its guidance is ComfyUI's "
        "cfg - 1). Model CPU offload: ~21 GB of bf16 weights, which also fit the chip without it. diffusers has "
        "no TP plan for its transformer: several chips run it as replicas (TP Mesh with shard_transformer off).",
        [("TPUFileLoader", ["z_image_turbo_bf16.safetensors", "qwen_3_4b.safetensors", "none", "none",
                            "ae.safetensors", "auto", "auto", "auto", "none", "auto", "none"]),
         OFFLOAD,
         ("TPUSampler", [FOX, "", 1024, 1024, 8, 0.0, 42, "fixed", 1, 1.0, True]),
         ("SaveImage", ["z_image_turbo_files"])]),
    "qwen_image_21_edit_files_offload": Workflow(
        "One TPU v6e chip (32 GB HBM) and about 64 GB of host RAM. ComfyUI's Qwen-Image 2.1 files: models/"
        "diffusion_models/qwen_image_2.1_bf16.safetensors, models/text_encoders/qwen3vl_8b_bf16.safetensors (Qwen3-VL "
        "with its vision tower, which reads the references), models/vae/qwen_image_2.1_vae_bf16.safetensors; configs: "
        "a Qwen-Image-2.1 folder in models/diffusers or the hub cache. An edit from two reference images (image and "
        "image_2; up to three, each resized by diffusers to about 1 MP) at 1024x1024 (multiples of 32); disconnect "
        "both for text to image with the same loaded model. 40 steps, guidance 1: the model runs without CFG (true "
        "CFG needs guidance above 1 and a negative prompt). Its RGBA output is saved as RGB. Model CPU offload: "
        "~31 GB of bf16 weights. Designed, not run on a chip.",
        [("TPUFileLoader", ["qwen_image_2.1_bf16.safetensors", "qwen3vl_8b_bf16.safetensors", "none", "none",
                            "qwen_image_2.1_vae_bf16.safetensors", "auto", "auto", "auto", "none", "auto", "none"]),
         OFFLOAD,
         ("TPUSampler", ["the woman from image 1 sits on the sofa from image 2, reading a book, soft window light",
                         "", 1024, 1024, 40, 1.0, 42, "fixed", 1, 1.0, True]),
         ("SaveImage", ["qwen_image_21_edit"])],
        images=(("qwen_edit_person.png", {"image": 0}), ("qwen_edit_sofa.png", {"image_2": 0}))),
    "flux3_klein_base_edit_files_offload": Workflow(
        "One TPU v6e chip (32 GB HBM) and about 32 GB of host RAM. ComfyUI's FLUX 3 [klein] files: models/"
        "diffusion_models/flux3-image-klein-base-int8-convrot.safetensors (or -bf16), models/text_encoders/"
        "qwen3vl_4b_int8_convrot.safetensors (Qwen3-VL, whose vision tower reads the references), models/vae/"
        "flux2-vae.safetensors; configs: a flux-3-image-klein-base folder in models/diffusers or the hub cache (a "
        "distilled file takes the distilled model's). diffusers runs it as modular blocks only. An edit from one "
        "reference image (image; up to three), width/height 0 = its size to 16 px; disconnect it for text to image "
        "with the same loaded model. 50 steps at guidance 3.5 (CFG through its guider; the distilled model: 16 "
        "steps, no guidance). prompt_upsampling is off: the templates ship no prompt upsampler (a 9B Qwen3.5 in a "
        "repository of its own; put it in the configs folder as prompt_upsampler/ and turn it on, as diffusers "
        "does by default). Its int8 layers stay int8 on the chip (quantized_weights auto). Model CPU offload. No TP plan in diffusers: "
        "several chips run it as replicas. Designed, not run on a chip.",
        [("TPUFileLoader", ["flux3-image-klein-base-int8-convrot.safetensors", "qwen3vl_4b_int8_convrot.safetensors",
                            "none", "none", "flux2-vae.safetensors", "auto", "auto", "auto", "none", "auto", "none"]),
         OFFLOAD,
         ("TPUSampler", ["the ceramic mug from the picture on a wooden desk by a window, morning light, product photo",
                         "blurry, low quality", 0, 0, 50, 3.5, 42, "fixed", 1, 1.0, False]),
         ("SaveImage", ["flux3_klein_edit"])],
        images=(("flux2_reference_mug.png", {"image": 0}),)),
    "krea2_turbo_files_offload": Workflow(
        "One TPU v6e chip (32 GB HBM) and about 96 GB of host RAM. ComfyUI's Krea 2 Turbo files: models/"
        "diffusion_models/krea2_turbo_fp8_scaled.safetensors and models/text_encoders/qwen3vl_4b_fp8_scaled.safetensors "
        "(both upcast to bf16), models/vae/qwen_image_vae.safetensors; configs: a Krea-2-Turbo folder in "
        "models/diffusers or the hub cache (\"turbo\" in the file name picks it). Turbo is distilled: 8 steps at "
        "guidance 0 (Krea 2's guidance is cond + g x (cond - uncond): 0 turns CFG off; Raw: 28 steps at 4.5). Model "
        "CPU offload. diffusers has no TP plan for its transformer: several chips run it as replicas (TP Mesh with "
        "shard_transformer off).",
        [("TPUFileLoader", ["krea2_turbo_fp8_scaled.safetensors", "qwen3vl_4b_fp8_scaled.safetensors", "none", "none",
                            "qwen_image_vae.safetensors", "auto", "auto", "auto", "none", "auto", "none"]),
         OFFLOAD,
         ("TPUSampler", [FOX, "", 1024, 1024, 8, 0.0, 42, "fixed", 1, 1.0, True]),
         ("SaveImage", ["krea2_turbo_files"])]),
    "wan22_ti2v_5b_text_to_video_files": Workflow(
        "One TPU v6e chip (32 GB HBM) and about 48 GB of host RAM. ComfyUI's Wan 2.2 TI2V-5B files: models/"
        "diffusion_models/wan2.2_ti2v_5B_fp16.safetensors, models/text_encoders/umt5_xxl_fp8_e4m3fn_scaled.safetensors "
        "(upcast to bf16), models/vae/wan2.2_vae.safetensors; configs: a Wan2.2-TI2V-5B-Diffusers folder in "
        "models/diffusers or the hub cache. 1280x704 x 121 frames (5 s at 24 fps) under model CPU offload (~14 GiB per "
        "chip by docs/parallelism.md's memory plan; 832x480 fits without offload). Connect a Load Image to the "
        "sampler's image for image to video with the same model. Designed, not run on a chip.",
        [("TPUFileLoader", ["wan2.2_ti2v_5B_fp16.safetensors", "umt5_xxl_fp8_e4m3fn_scaled.safetensors", "none", "none",
                            "wan2.2_vae.safetensors", "auto", "auto", "auto", "none", "auto", "none"]),
         OFFLOAD,
         ("TPUVideoSampler", [CORGI, WAN_NEGATIVE, 1280, 704, 121, 30, 5.0, 42, "fixed", 1]),
         ("CreateVideo", [24.0]),
         ("SaveVideo", ["video/wan22_ti2v_5b", "auto", "auto"])]),
    "wan22_i2v_14b_720p_v6e8_context_parallel": Workflow(
        "One TPU v6e-8 host (8 chips of 32 GB HBM; its 1.5 TB of host RAM holds what this needs, about 600 GB: each "
        "of the 8 ranks keeps its own bf16 pipeline, ~70 GB, under model CPU offload). ComfyUI's Wan 2.2 I2V A14B files: "
        "models/diffusion_models/wan2.2_i2v_high_noise_14B_fp8_scaled.safetensors (model) and "
        "wan2.2_i2v_low_noise_14B_fp8_scaled.safetensors (model_2), models/text_encoders/"
        "umt5_xxl_fp8_e4m3fn_scaled.safetensors, models/vae/wan_2.1_vae.safetensors (all upcast to bf16); configs: a "
        "Wan2.2-I2V-A14B-Diffusers folder in models/diffusers or the hub cache. The start image is in ComfyUI's input "
        "folder. A 14B expert is ~28.6 GB in bf16: each chip holds the pipeline under model CPU offload (the inactive "
        "expert on the host) and 1/8 of the video's 75,600 latent tokens (context parallel 8, Ulysses attention), "
        "~28 GiB per chip by the memory plan. 1280x720 x 81 frames, 20 steps, guidance 3.5. Designed, not run on a "
        "chip.",
        [("TPUFileLoader", ["wan2.2_i2v_high_noise_14B_fp8_scaled.safetensors", "umt5_xxl_fp8_e4m3fn_scaled.safetensors",
                            "none", "none", "wan_2.1_vae.safetensors", "auto", "auto", "auto",
                            "wan2.2_i2v_low_noise_14B_fp8_scaled.safetensors", "auto", "none"]),
         OFFLOAD,
         ("TPUMesh", [8, False, False, "launch_local", "", "", 1, 8]),
         ("TPUVideoSampler", ["the corgi from the picture runs along the beach toward the camera, waves, golden hour",
                              WAN_NEGATIVE, 1280, 720, 81, 20, 3.5, 42, "fixed", 1]),
         ("CreateVideo", [16.0]),
         ("SaveVideo", ["video/wan22_i2v_14b", "auto", "auto"])],
        images=(("wan22_start_corgi.png", {"image": 0}),)),
    "ltx2_i2v_two_stages_sound_v5p_context_parallel": Workflow(
        "One TPU v5p host of 4 chips (95 GB HBM each) and about 160 GB of host RAM. The LTX-2 diffusers folder "
        "(Lightricks/LTX-2: model_index.json and its component folders, the x2 latent upscaler in latent_upsampler/) in "
        "models/diffusers/LTX-2; the start image in ComfyUI's input folder. Each of the 4 ranks keeps the whole bf16 "
        "pipeline on its chip (~66 GB: the 19B audio-video transformer, Gemma 3 12B) and 1/4 of the video tokens "
        "(context parallel 4, the pack's plan for LTX-2). Image to video with its sound track in two stages: 768x512, "
        "the latents upscaled x2 by TPU Latent Upscale Model (the folder's own upscaler), 3 refine steps at 1536x1024; "
        "121 frames (5 s at 24 fps); Create Video takes the frames, fps and audio. Designed, not run on a chip. "
        "LTX-2.3 from ComfyUI's template files: ltx23_i2v_two_stages_sound_v6e8_files_context_parallel.",
        [("TPULoader", ["LTX-2", "", "auto", "auto"]),
         ("TPUMesh", [4, False, False, "launch_local", "", "", 1, 4]),
         ("TPUVideoSampler", ["the corgi from the picture runs along the beach toward the camera and barks, waves "
                              "crashing, golden hour", "worst quality, inconsistent motion, blurry, jittery, distorted",
                              1536, 1024, 121, 40, 4.0, 42, "fixed", 1]),
         ("CreateVideo", [24.0]),
         ("SaveVideo", ["video/ltx2_i2v", "auto", "auto"])],
        images=(("wan22_start_corgi.png", {"image": 0}),), upscaler="LTX-2", sound=True),
    "ltx23_i2v_two_stages_sound_v6e8_files_context_parallel": Workflow(
        "One TPU v6e-8 host (8 chips of 32 GB HBM; of its 1.5 TB of host RAM each of the 8 ranks keeps its own "
        "pipeline, ~50 GB, under model CPU offload). ComfyUI's LTX-2.3 template files: models/checkpoints/"
        "ltx-2.3-22b-dev-fp8.safetensors (the diffusion model, text connectors, both VAEs and the vocoder), models/"
        "text_encoders/gemma_3_12B_it_fp4_mixed.safetensors (Gemma 3 12B; its nvfp4 layers dequantized to bf16 on "
        "load), models/latent_upscale_models/ltx-2.3-spatial-upscaler-x2-1.1.safetensors; configs: an "
        "LTX-2.3-Diffusers folder in models/diffusers or the hub cache (diffusers/LTX-2.3-Diffusers, its config "
        "files only). The start image is in ComfyUI's input folder. The transformer's fp8 layers stay fp8 on the "
        "chip (quantized_weights auto); under model CPU offload a chip holds one model at a time (Gemma 3 12B in "
        "bf16 is the largest, ~23 GiB: docs/parallelism.md) and 1/8 of the video tokens (context parallel 8, the "
        "pack's plan for LTX-2). Image to video with its sound track in two stages, as ComfyUI's template: 768x512, "
        "the latents upscaled x2, 3 refine steps at 1536x1024; 97 frames (4 s at 24 fps); 30 steps at guidance 3.0 "
        "on the dev model. For the template's 8-step first stage, add its distilled LoRA (TPU LoRA at 0.5) and, on a "
        "ComfyUI with ManualSigmas, connect the distilled schedule to the sampler's sigmas at guidance 1. Create "
        "Video takes the frames, fps and audio. Designed, not run on a chip.",
        [("TPUFileLoader", ["ltx-2.3-22b-dev-fp8.safetensors", "gemma_3_12B_it_fp4_mixed.safetensors", "none", "none",
                            "none", "auto", "auto", "auto", "none", "auto", "none"]),
         OFFLOAD,
         ("TPUMesh", [8, False, False, "launch_local", "", "", 1, 8]),
         ("TPUVideoSampler", ["the corgi from the picture runs along the beach toward the camera and barks, waves "
                              "crashing, golden hour", "worst quality, inconsistent motion, blurry, jittery, distorted",
                              1536, 1024, 97, 30, 3.0, 42, "fixed", 1]),
         ("CreateVideo", [24.0]),
         ("SaveVideo", ["video/ltx23_i2v", "auto", "auto"])],
        images=(("wan22_start_corgi.png", {"image": 0}),), upscaler="ltx-2.3-spatial-upscaler-x2-1.1.safetensors",
        sound=True),
    "ltx25_distilled_int8_i2v_sound_one_chip_files": Workflow(
        "One TPU v6e chip (32 GB HBM) and about 96 GB of host RAM. ComfyUI's LTX-2.5 template files: models/"
        "diffusion_models/ltx-2.5-22b-distilled-transformer-comfy-int8-convrot.safetensors (the diffusion model with "
        "the text connectors' blocks), models/text_encoders/gemma4-12b-with-proj-ltx-2.5-comfy-int8-convrot."
        "safetensors (Gemma 4 12B with the text projection), models/vae/ltx-2.5-video-vae-conv-bf16.safetensors (the "
        "conv VAE: the template's ltx-2.5-video-vae-bf16 decodes with the diffusion decoder, whose attention runs "
        "densely here and does not fit at this size) and "
        "ltx-2.5-audio-vae-bf16.safetensors (the audio VAE with the vocoder, in the audio_vae input), models/"
        "latent_upscale_models/ltx-2.5-latent-spatial-upscaler-x2-bf16-1.0.safetensors; configs: an "
        "LTX-2.5-Diffusers folder in models/diffusers or the hub cache (Lightricks/LTX-2.5-Diffusers, its config "
        "files only). The start image is in ComfyUI's input folder. The int8 layers stay int8 on the chip "
        "(quantized_weights auto): under model CPU offload the chip holds one model at a time, the 22B transformer "
        "(~22 GB) the largest. Image to video with its sound track in two stages: 768x512, the latents upscaled x2, "
        "3 refine steps at 1536x1024 on the distilled schedule; 121 frames (5 s at 24 fps); the first stage's 8 "
        "steps at guidance 1 (the distilled model needs no CFG) run the scheduler's own 8-step schedule: on a "
        "ComfyUI with ManualSigmas, connect the template's distilled sigmas (1.0, 0.99375, 0.9875, 0.98125, 0.975, "
        "0.909375, 0.725, 0.421875, 0.0) to the sampler's sigmas. Create Video takes the frames, fps and audio. "
        "Designed, not run on a chip; the real files' key layouts are read as a third-party converter reads them, "
        "not checked against the files.",
        [("TPUFileLoader", ["ltx-2.5-22b-distilled-transformer-comfy-int8-convrot.safetensors",
                            "gemma4-12b-with-proj-ltx-2.5-comfy-int8-convrot.safetensors", "none", "none",
                            "ltx-2.5-video-vae-conv-bf16.safetensors", "auto", "auto", "auto", "none", "auto",
                            "ltx-2.5-audio-vae-bf16.safetensors"]),
         OFFLOAD,
         ("TPUVideoSampler", ["the corgi from the picture runs along the beach toward the camera and barks, waves "
                              "crashing, golden hour", "", 1536, 1024, 121, 8, 1.0, 42, "fixed", 1]),
         ("CreateVideo", [24.0]),
         ("SaveVideo", ["video/ltx25_i2v", "auto", "auto"])],
        images=(("wan22_start_corgi.png", {"image": 0}),),
        upscaler="ltx-2.5-latent-spatial-upscaler-x2-bf16-1.0.safetensors", sound=True),
    "minimax_h3_i2v_int8_sound_one_chip_files": Workflow(
        "One TPU v5p chip (95 GB HBM) or v7x device (96 GB), about 160 GB of host RAM. MiniMax H3 from the files its "
        "ComfyUI templates download (Comfy-Org/MiniMax-H3): models/diffusion_models/minimax_h3_fl2va_pruned_int8_"
        "convrot.safetensors (the pruned int8 ConvRot diffusion model, ComfyUI's curve form), models/text_encoders/"
        "qwen3vl_32b_minimax_h3_nvfp4_awq.safetensors (Qwen3-VL 32B cut after layer 50; its nvfp4 layers dequantized "
        "to bf16 on load), models/vae/minimax_h3_video_vae_int8_convrot.safetensors and minimax_h3_audio_vae_fp32."
        "safetensors; configs auto (the small config files of MiniMaxAI/MiniMax-H3). Model CPU offload: the chip "
        "holds one model at a time, the bf16 text encoder (~50 GiB) the largest; the transformer's int8 layers stay "
        "int8 on the chip. Image to video with its stereo sound: 1344x768, 124 frames (5 s at 24 fps), 30 steps "
        "(guidance-distilled: guidance and negative prompt unused). Designed, not run on a chip; the files read here "
        "are tiny ones in their layout.",
        [("TPUFileLoader", ["minimax_h3_fl2va_pruned_int8_convrot.safetensors", "qwen3vl_32b_minimax_h3_nvfp4_awq."
                            "safetensors", "none", "none", "minimax_h3_video_vae_int8_convrot.safetensors", "auto",
                            "auto", "auto", "none", "auto", "minimax_h3_audio_vae_fp32.safetensors"]),
         OFFLOAD,
         ("TPUVideoSampler", ["the corgi from the picture runs along the beach toward the camera and barks, waves "
                              "crashing, golden hour", "", 1344, 768, 124, 30, 1.0, 42, "fixed", 1]),
         ("CreateVideo", [24.0]),
         ("SaveVideo", ["video/minimax_h3_i2v", "auto", "auto"])],
        images=(("wan22_start_corgi.png", {"image": 0}),), sound=True),
    "minimax_h3_ref2v_two_pictures_sound": Workflow(
        "One TPU v5p chip (95 GB HBM) or v7x device (96 GB), about 160 GB of host RAM. MiniMax H3's diffusers "
        "folder in models/diffusers (MiniMaxAI/MiniMax-H3): reference to video runs its own transformer "
        "(transformer_ref, loaded in place of the text/image to video one: the run's info says so). Two pictures "
        "from ComfyUI's input folder, chained through TPU Video Reference nodes in the order the prompt names them "
        "(<Picture 1>, <Picture 2>). Model CPU offload (bf16: ~62 GiB per transformer and text encoder). 1344x768, "
        "124 frames (5 s at 24 fps) with its stereo sound, 30 steps. Designed, not run on a chip.",
        [("TPULoader", ["MiniMax-H3", "", "auto", "auto"]),
         OFFLOAD,
         ("TPUVideoSampler", ["<Picture 1> walks through <Picture 2>, looking around, soft morning light, ambient "
                              "birdsong", "", 1344, 768, 124, 30, 1.0, 42, "fixed", 1]),
         ("CreateVideo", [24.0]),
         ("SaveVideo", ["video/minimax_h3_ref2v", "auto", "auto"])],
        sound=True, references=("minimax_h3_reference_character.png", "minimax_h3_reference_place.png")),
    "minimax_h3_t2v_turbo_4step_lora_sound": Workflow(
        "One TPU v5p chip (95 GB HBM) or v7x device (96 GB), about 160 GB of host RAM. MiniMax H3's diffusers folder "
        "in models/diffusers (MiniMaxAI/MiniMax-H3) with its template's 4-step turbo LoRA in models/loras "
        "(minimax_h3_fl2v_turbo_4step_v1.0_768p_comfyui_bf16.safetensors, ComfyUI's layout, read by diffusers' "
        "converter). Text to video with its stereo sound at 1344x768, 124 frames (5 s at 24 fps); steps 5: diffusers' "
        "scheduler counts the final sigma as a step, so 5 steps are the LoRA's 4 transformer passes. Model CPU "
        "offload (bf16). Designed, not run on a chip; the released LoRA file was not read here.",
        [("TPULoader", ["MiniMax-H3", "", "auto", "auto"]),
         ("TPULora", ["minimax_h3_fl2v_turbo_4step_v1.0_768p_comfyui_bf16.safetensors", 1.0, "high_noise"]),
         OFFLOAD,
         ("TPUVideoSampler", [CORGI + ", the sound of waves and barking", "", 1344, 768, 124, 5, 1.0, 42, "fixed",
                              1]),
         ("CreateVideo", [24.0]),
         ("SaveVideo", ["video/minimax_h3_t2v_turbo", "auto", "auto"])],
        sound=True),
    "wan22_t2v_14b_lightx2v_4steps_files": Workflow(
        "One TPU v7x device (96 GB HBM) or v5p chip (95 GB), about 96 GB of host RAM. ComfyUI's Wan 2.2 T2V A14B "
        "files: models/diffusion_models/wan2.2_t2v_high_noise_14B_fp8_scaled.safetensors (model) and "
        "wan2.2_t2v_low_noise_14B_fp8_scaled.safetensors (model_2), models/text_encoders/"
        "umt5_xxl_fp8_e4m3fn_scaled.safetensors, models/vae/wan_2.1_vae.safetensors; the lightx2v 4-step LoRAs of "
        "ComfyUI's template in models/loras, the high_noise one on the high-noise expert, the low_noise one on the "
        "low-noise expert. 832x480 x 81 frames (5 s at 16 fps), 4 steps at guidance 1 (no CFG), everything on the "
        "device (~70 GiB by the memory plan; on a v6e use model CPU offload with a TP Mesh of context_parallel 4). "
        "Designed, not run on a chip.",
        [("TPUFileLoader", ["wan2.2_t2v_high_noise_14B_fp8_scaled.safetensors", "umt5_xxl_fp8_e4m3fn_scaled.safetensors",
                            "none", "none", "wan_2.1_vae.safetensors", "auto", "auto", "auto",
                            "wan2.2_t2v_low_noise_14B_fp8_scaled.safetensors", "auto", "none"]),
         ("TPULora", ["wan2.2_t2v_lightx2v_4steps_lora_v1.1_high_noise.safetensors", 1.0, "high_noise"]),
         ("TPULora", ["wan2.2_t2v_lightx2v_4steps_lora_v1.1_low_noise.safetensors", 1.0, "low_noise"]),
         ("TPUModeSelector", ["eager", "device"]),
         ("TPUVideoSampler", [CORGI, "", 832, 480, 81, 4, 1.0, 42, "fixed", 1]),
         ("CreateVideo", [16.0]),
         ("SaveVideo", ["video/wan22_t2v_14b_4steps", "auto", "auto"])]),
}


def node(node_id: int, node_type: str, pos: list, inputs: list, outputs: list, values: list) -> dict:
    return {"id": node_id, "type": node_type, "pos": pos, "size": SIZES[node_type], "flags": {}, "order": node_id - 1,
            "mode": 0, "inputs": inputs, "outputs": outputs, "properties": {"Node name for S&R": node_type},
            "widgets_values": values}


def chain(hardware: str, steps: list[tuple[str, list]], images: tuple = (), upscaler: str = "",
          sound: bool = False, references: tuple = ()) -> dict:
    """The pipeline nodes in a column, the Load Image nodes (if any) and a TPU Latent Upscale Model (`upscaler`) in
    the next, then the Sampler and Save Image (a video sampler: Create Video, its fps and with `sound` its audio linked
    from the sampler, and Save Video); `references`' Load Image and TPU Video Reference nodes in rows below, the last
    reference into the Sampler's references. Node ids: the chain's in order, then the Load Image nodes', then the
    upscaler's, then each reference's Load Image and TPU Video Reference. Link ids: link i enters chain node i + 1,
    then one link per Sampler image input, then Create Video's fps, then the upscaler's and the audio's, then per
    reference its picture's and its output's."""
    nodes, links = [], []
    types = [node_type for node_type, _ in steps]
    sampler_type = next(node_type for node_type in types if node_type in SAMPLERS)
    sampler_id = 1 + types.index(sampler_type)
    sockets = SAMPLER_SOCKETS[sampler_type]
    input_links = []  # (link id, its origin: a Load Image or the upscaler, the origin's output slot, Sampler input)
    for n, (_, targets) in enumerate(images):
        for target, slot in targets.items():
            input_links.append((len(steps) + len(input_links), len(steps) + 1 + n, slot, target))
    image_x = 420
    if upscaler:
        input_links.append((len(steps) + len(input_links), len(steps) + 1 + len(images), 0, "upscaler"))
    sampler_x = image_x + (SIZES["LoadImage"][0] + 40 if images or upscaler else 0)
    fps_link = len(steps) + len(input_links)  # a video sampler's fps -> Create Video's fps
    audio_link = fps_link + 1 if sound else None  # ... and its audio -> Create Video's audio
    first_reference_link = fps_link + 1 + sound  # reference k: its picture's link, then its output's
    first_reference = len(steps) + len(images) + bool(upscaler) + 1  # reference k: its Load Image, then its node
    if references:
        input_links.append((first_reference_link + 2 * len(references) - 1,
                            first_reference + 2 * len(references) - 1, 0, "references"))
    x, y = 40, 80
    for index, (node_type, values) in enumerate(steps):
        node_id = index + 1
        is_save, is_sampler = node_type in (*SAVERS, "SaveVideo"), node_type == sampler_type
        if node_type == "SaveImage":
            inputs, outputs = [{"name": "images", "type": IMAGE, "link": index}], []
        elif node_type == "CreateVideo":
            inputs = [{"name": "images", "type": IMAGE, "link": index},
                      {"name": "audio", "type": "AUDIO", "link": audio_link},
                      {"name": "fps", "type": "FLOAT", "widget": {"name": "fps"}, "link": fps_link}]
            outputs = [{"name": "VIDEO", "type": "VIDEO", "links": [node_id], "slot_index": 0}]
        elif node_type == "SaveVideo":
            inputs, outputs = [{"name": "video", "type": "VIDEO", "link": index}], []
        elif is_sampler:
            linked = {target: link for link, _, _, target in input_links}
            inputs = [{"name": name, "type": kind, "link": index if name == "pipeline" else linked.get(name)}
                      for name, kind in sockets.items()]
            outputs = [{"name": "images", "type": IMAGE, "links": [node_id], "slot_index": 0},
                       {"name": "info", "type": "STRING", "links": None, "slot_index": 1}]
            if node_type == "TPUVideoSampler":
                outputs[0]["name"] = "frames"
                outputs.insert(1, {"name": "fps", "type": "FLOAT", "links": [fps_link], "slot_index": 1})
                outputs[2]["slot_index"] = 2
                if sound:
                    outputs.append({"name": "audio", "type": "AUDIO", "links": [audio_link], "slot_index": 3})
        else:
            inputs = [] if index == 0 else [{"name": "pipeline", "type": PIPE, "link": index}]
            outputs = [{"name": "pipeline", "type": PIPE, "links": [node_id], "slot_index": 0}]
        if index:
            kind = {"SaveImage": IMAGE, "CreateVideo": IMAGE, "SaveVideo": "VIDEO"}.get(node_type, PIPE)
            links.append([index, index, 0, node_id, 0, kind])
        if is_sampler or is_save:  # the big nodes go in a row of their own
            x, y = sampler_x if is_sampler else x + SIZES[steps[index - 1][0]][0] + 40, 80
        nodes.append(node(node_id, node_type, [x, y], inputs, outputs, values))
        if not (is_sampler or is_save):
            y += SIZES[node_type][1] + 60
    for n, (file_name, _) in enumerate(images):
        node_id = len(steps) + 1 + n
        outputs = [{"name": name, "type": kind, "slot_index": slot,
                    "links": [link for link, origin, out, _ in input_links if (origin, out) == (node_id, slot)] or None}
                   for slot, (name, kind) in enumerate(LOAD_IMAGE_OUTPUTS)]
        y = 80 + n * (SIZES["LoadImage"][1] + 60)
        nodes.append(node(node_id, "LoadImage", [image_x, y], [], outputs, [file_name, "image"]))
    if upscaler:
        node_id = len(steps) + 1 + len(images)
        outputs = [{"name": "upscaler", "type": UPSCALER, "slot_index": 0,
                    "links": [link for link, origin, _, _ in input_links if origin == node_id]}]
        y = 80 + len(images) * (SIZES["LoadImage"][1] + 60)
        nodes.append(node(node_id, "TPULatentUpscaleModel", [image_x, y], [], outputs, [upscaler]))
    for k, file_name in enumerate(references):
        picture, reference = first_reference + 2 * k, first_reference + 2 * k + 1
        picture_link, out_link = first_reference_link + 2 * k, first_reference_link + 2 * k + 1
        x, y = 40 + k * (SIZES["LoadImage"][0] + 40), 700
        nodes.append(node(picture, "LoadImage", [x, y], [], [
            {"name": "IMAGE", "type": IMAGE, "slot_index": 0, "links": [picture_link]},
            {"name": "MASK", "type": MASK, "slot_index": 1, "links": None}], [file_name, "image"]))
        before = out_link - 2 if k else None
        nodes.append(node(reference, "TPUVideoReference", [x, y + SIZES["LoadImage"][1] + 40], [
            {"name": name, "type": kind, "link": {"references": before, "image": picture_link}.get(name)}
            for name, kind in REFERENCE_SOCKETS.items()],
            [{"name": "references", "type": REFERENCES, "slot_index": 0, "links": [out_link]}], []))
        links.append([picture_link, picture, 0, reference, 1, IMAGE])
        if k + 1 < len(references):
            links.append([out_link, reference, 0, reference + 2, 0, REFERENCES])
    links += [[link, origin, slot, sampler_id, list(sockets).index(target), sockets[target]]
              for link, origin, slot, target in input_links]
    if "CreateVideo" in types:
        links.append([fps_link, sampler_id, 1, 1 + types.index("CreateVideo"), 2, "FLOAT"])
    if sound:
        links.append([audio_link, sampler_id, 3, 1 + types.index("CreateVideo"), 1, "AUDIO"])
    return {"last_node_id": len(nodes), "last_link_id": len(links), "nodes": nodes, "links": links, "groups": [],
            "config": {}, "extra": {"tpu_diffusers": {"hardware": hardware}}, "version": 0.4}


def main() -> None:
    for name, workflow in WORKFLOWS.items():
        path = ROOT / "workflows" / f"{name}.json"
        path.write_text(json.dumps(chain(*workflow), indent=2) + "\n")
        print(path)


if __name__ == "__main__":
    main()
