"""The Sampler's LATENT through the real server: its LATENT output feeds ComfyUI's own latent nodes (Latent
Upscale By) and, from there, a second Sampler's LATENT input (image to image from those latents, size 0 = the
latent's size); a latent connected together with an image is refused when the prompt is queued. That ComfyUI's
VAE Decode of the LATENT gives the Sampler's image is tests/test_latent.py's (the tiny models' VAEs are narrower
than any VAE ComfyUI can load from a file)."""

from __future__ import annotations

from serving import SAMPLER, SAVE, image_sizes, outcome, run_ok, sampler_prompt

UPSCALE, SECOND = "20", "21"


def second_pass(first_seed: int) -> dict:
    """The demo workflow whose Sampler's LATENT goes through Latent Upscale By (x2) into a second Sampler, saved."""
    prompt = sampler_prompt(steps=2, seed=first_seed)
    prompt[UPSCALE] = {"class_type": "LatentUpscaleBy",
                       "inputs": {"samples": [SAMPLER, 2], "upscale_method": "nearest-exact", "scale_by": 2.0}}
    prompt[SECOND] = {"class_type": "TPUSampler",
                      "inputs": {**prompt[SAMPLER]["inputs"], "width": 0, "height": 0, "steps": 4, "denoise": 0.5,
                                 "latent": [UPSCALE, 0]}}
    prompt[SAVE]["inputs"]["images"] = [SECOND, 0]
    return prompt


def test_the_latent_output_goes_through_comfyuis_latent_nodes_into_a_second_sampler(server):
    entry = run_ok(server, second_pass(first_seed=5))
    info = entry["outputs"][SECOND]["tpu_run_info"][0]
    assert (info["task"], info["pipeline"]) == ("image2image", "FluxImg2ImgPipeline")
    assert image_sizes(server, entry) == [(128, 128)]  # the upscaled latent's size
    again = run_ok(server, second_pass(first_seed=6))  # another first image: another start
    assert again["outputs"][SECOND]["tpu_run_info"][0]["task"] == "image2image"


def test_a_latent_with_an_image_is_refused_when_queued(server):
    prompt = second_pass(first_seed=7)
    prompt["22"] = {"class_type": "EmptyImage", "inputs": {"width": 64, "height": 64, "batch_size": 1, "color": 0}}
    prompt[SECOND]["inputs"]["image"] = ["22", 0]
    how, node, text, _ = outcome(server, prompt)
    assert (how, node) == ("rejected", SECOND)
    assert "both an image and a latent are connected" in text
