"""Write the single-file and LoRA workflows in workflows/ (UI format): a chain of nodes, left to
right, each output feeding the next node's first input. Thumbnails: tests/e2e/test_browser.py with
UPDATE_SCREENSHOT=1.

    python tools/make_file_workflows.py
"""

import json
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PIPE, IMAGE = "TPU_PIPELINE", "IMAGE"
SIZES = {"TPUFileLoader": [340, 250], "TPULora": [320, 82], "TPUModeSelector": [320, 82],
         "TPUCompileTransformer": [320, 130], "TPUSampler": [400, 420], "SaveImage": [400, 440]}
FOX = "a red fox in a snowy birch forest at dawn, soft golden light, detailed fur, photograph"

WORKFLOWS = {
    "flux1_dev_files_offload": (
        "One TPU v6e chip (32 GB HBM) and about 64 GB of host RAM. ComfyUI's own FLUX.1-dev files (Comfy-Org "
        "layout): models/diffusion_models/flux1-dev.safetensors, models/text_encoders/clip_l.safetensors and "
        "t5xxl_fp16.safetensors, models/vae/ae.safetensors. Configs: a FLUX.1-dev folder in models/diffusers or "
        "the hub cache (the error names the command). Model CPU offload: ~33 GB of bf16 weights.",
        [("TPUFileLoader", ["flux1-dev.safetensors", "clip_l.safetensors", "t5xxl_fp16.safetensors", "none",
                            "ae.safetensors", "auto", "auto", "auto"]),
         ("TPUModeSelector", ["eager", "model_cpu_offload"]),
         ("TPUSampler", [FOX, "", 1024, 1024, 28, 3.5, 42, "fixed", 1]),
         ("SaveImage", ["flux1_dev_files"])]),
    "sd35_large_files_compiled": (
        "One TPU v6e chip (32 GB HBM). ComfyUI's SD3.5 Large checkpoint models/checkpoints/sd3.5_large.safetensors "
        "with models/text_encoders/clip_l.safetensors, clip_g.safetensors and t5xxl_fp16.safetensors (leave "
        "text_encoder_3 at none to run without T5). ~28 GB bf16 with T5, so the transformer compiles as repeated "
        "blocks under model CPU offload.",
        [("TPUFileLoader", ["sd3.5_large.safetensors", "clip_l.safetensors", "clip_g.safetensors",
                            "t5xxl_fp16.safetensors", "none", "auto", "auto", "auto"]),
         ("TPUModeSelector", ["compiled", "model_cpu_offload"]),
         ("TPUCompileTransformer", ["auto", False, "1024x1024"]),
         ("TPUSampler", ["a cozy reading nook by a rainy window, warm lamp light, watercolor illustration",
                         "blurry, low quality", 1024, 1024, 40, 4.5, 42, "fixed", 1]),
         ("SaveImage", ["sd35_large_files"])]),
    "flux2_dev_files_offload": (
        "A TPU host with about 128 GB of host RAM. ComfyUI's FLUX.2-dev files: models/diffusion_models/"
        "flux2_dev_fp8mixed.safetensors (upcast to bf16), models/text_encoders/mistral_3_small_flux2_bf16.safetensors, "
        "models/vae/flux2-vae.safetensors. Model CPU offload; for more speed use the FLUX.2 diffusers folder "
        "with a TP Mesh (flux2_dev_tp8.json).",
        [("TPUFileLoader", ["flux2_dev_fp8mixed.safetensors", "mistral_3_small_flux2_bf16.safetensors", "none",
                            "none", "flux2-vae.safetensors", "auto", "auto", "auto"]),
         ("TPUModeSelector", ["eager", "model_cpu_offload"]),
         ("TPUSampler", ["a vintage travel poster of a lighthouse on a rocky coast, bold shapes", "",
                         1024, 1024, 28, 4.0, 42, "fixed", 1]),
         ("SaveImage", ["flux2_dev_files"])]),
    "qwen_image_files_offload": (
        "One TPU v6e chip (32 GB HBM) and about 96 GB of host RAM. ComfyUI's Qwen-Image files: models/"
        "diffusion_models/qwen_image_fp8_e4m3fn.safetensors and models/text_encoders/"
        "qwen_2.5_vl_7b_fp8_scaled.safetensors (both upcast to bf16), models/vae/qwen_image_vae.safetensors. "
        "Model CPU offload.",
        [("TPUFileLoader", ["qwen_image_fp8_e4m3fn.safetensors", "qwen_2.5_vl_7b_fp8_scaled.safetensors", "none",
                            "none", "qwen_image_vae.safetensors", "auto", "auto", "auto"]),
         ("TPUModeSelector", ["eager", "model_cpu_offload"]),
         ("TPUSampler", ["a street sign that reads 'TPU AVENUE' under cherry blossoms", "blurry", 1328, 1328, 50,
                         4.0, 42, "fixed", 1]),
         ("SaveImage", ["qwen_image_files"])]),
    "flux1_dev_lora_chain_compiled": (
        "One TPU v6e chip (32 GB HBM) and about 64 GB of host RAM; the FLUX.1-dev files of "
        "flux1_dev_files_offload.json and two FLUX.1 LoRAs in models/loras (any of diffusers, kohya or ComfyUI "
        "format). The LoRAs are fused into the weights: changing a LoRA or its strength reloads and recompiles "
        "nothing. The transformer compiles as repeated blocks under offload.",
        [("TPUFileLoader", ["flux1-dev.safetensors", "clip_l.safetensors", "t5xxl_fp16.safetensors", "none",
                            "ae.safetensors", "auto", "auto", "auto"]),
         ("TPULora", ["flux1_style_lora.safetensors", 0.8]),
         ("TPULora", ["flux1_detail_lora.safetensors", 0.5]),
         ("TPUModeSelector", ["compiled", "model_cpu_offload"]),
         ("TPUCompileTransformer", ["auto", True, "1024x1024"]),
         ("TPUSampler", [FOX, "", 1024, 1024, 28, 3.5, 42, "fixed", 1]),
         ("SaveImage", ["flux1_dev_lora"])]),
}


def chain(hardware: str, steps: list[tuple[str, list]]) -> dict:
    nodes, links = [], []
    x, y = 40, 80
    for index, (node_type, values) in enumerate(steps):
        node_id = index + 1
        is_save, is_sampler = node_type == "SaveImage", node_type == "TPUSampler"
        inputs = [] if index == 0 else [{"name": "images" if is_save else "pipeline",
                                         "type": IMAGE if is_save else PIPE, "link": index}]
        if is_save:
            outputs = []
        elif is_sampler:
            outputs = [{"name": "images", "type": IMAGE, "links": [node_id], "slot_index": 0},
                       {"name": "info", "type": "STRING", "links": None, "slot_index": 1}]
        else:
            outputs = [{"name": "pipeline", "type": PIPE, "links": [node_id], "slot_index": 0}]
        if index:
            links.append([index, index, 0, node_id, 0, IMAGE if is_save else PIPE])
        size = SIZES[node_type]
        if is_sampler or is_save:  # the big nodes go in a row of their own
            x, y = x + 380 if is_save else 420, 80
        nodes.append({"id": node_id, "type": node_type, "pos": [x, y], "size": size, "flags": {}, "order": index,
                      "mode": 0, "inputs": inputs, "outputs": outputs,
                      "properties": {"Node name for S&R": node_type}, "widgets_values": values})
        if not (is_sampler or is_save):
            y += size[1] + 60
    return {"last_node_id": len(nodes), "last_link_id": len(links), "nodes": nodes, "links": links, "groups": [],
            "config": {}, "extra": {"tpu_diffusers": {"hardware": hardware}}, "version": 0.4}


def main() -> None:
    for name, (hardware, steps) in WORKFLOWS.items():
        path = ROOT / "workflows" / f"{name}.json"
        path.write_text(json.dumps(chain(hardware, steps), indent=2) + "\n")
        print(path)


if __name__ == "__main__":
    main()
