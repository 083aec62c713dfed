"""Compiled mode through the real server: warm-up compiles ahead, a second queue compiles nothing,
the run info names the compile cache folders, and ComfyUI's inference mode does not reach the pipeline."""

from pathlib import Path

import numpy as np
from PIL import Image

from serving import COMPILE, SAMPLER, clear_error, run_info, run_ok, sampler_prompt, with_compile


def compiled(prompt, server, warmup_sizes=""):
    prompt = with_compile(prompt, server)
    prompt[COMPILE]["inputs"]["warmup_sizes"] = warmup_sizes
    return prompt


def test_compile_workflow_with_warmup_then_queued_again_compiles_nothing(server):
    prompt = compiled(sampler_prompt("tiny-flux1-dev", steps=2, seed=1), server, warmup_sizes="96x64")
    first = run_info(run_ok(server, prompt))
    assert first["mode"] == "compiled (backend inductor)" and first["compiled_now"] is True
    assert any(note.startswith("warm-up: compiled now for 96x64") for note in first["notes"])
    assert first["grad_mode"] == "inference mode off, grad off"  # ComfyUI runs nodes under inference mode
    assert first["compile_cache"]["applied"] == "before torch"  # by prestartup_script.py
    assert any(Path(first["compile_cache"]["inductor"]).rglob("*"))  # inductor wrote where the run info says
    assert sum(first["compile_cache_lookups"].values()) > 0

    prompt[SAMPLER]["inputs"]["seed"] = 2  # queued again (a new seed, so ComfyUI runs the Sampler)
    again = run_info(run_ok(server, prompt))
    assert again["compiled_now"] is False and again["compile_seconds"] == 0
    assert not any(note.startswith("warm-up") for note in again["notes"])

    prompt[SAMPLER]["inputs"].update(width=96, height=64, steps=3)  # the warmed size, other steps
    assert run_info(run_ok(server, prompt))["compiled_now"] is False


def test_a_compiled_flux1_switching_from_text_to_image_to_image_to_image_compiles_nothing_new(server):
    """The image-to-image pipeline (from_pipe) shares the compiled transformer: at the same width, height and
    batch 1 its denoising calls take the graph text to image compiled (after the first test, nothing compiles
    here at all: the same model, size and compile options)."""
    (server.base_dir / "input").mkdir(exist_ok=True)
    Image.fromarray((np.random.default_rng(7).random((64, 64, 3)) * 255).astype(np.uint8)).save(
        server.base_dir / "input" / "compile_img2img.png")
    prompt = compiled(sampler_prompt("tiny-flux1-dev", steps=2, seed=30), server)
    first = run_info(run_ok(server, prompt))
    assert (first["task"], first["mode"]) == ("text2image", "compiled (backend inductor)")
    prompt["7"] = {"class_type": "LoadImage", "inputs": {"image": "compile_img2img.png"}}
    prompt[SAMPLER]["inputs"].update(image=["7", 0], denoise=0.75, seed=31)
    then = run_info(run_ok(server, prompt))
    assert (then["task"], then["pipeline"], then["loaded"]) == ("image2image", "FluxImg2ImgPipeline", False), then
    assert then["compiled_now"] is False and then["compile_seconds"] == 0, then
    assert "compile: reused compiled graph for 64x64 (batch 1)" in then["notes"], then["notes"]


def test_compiled_mode_without_the_compile_node_uses_its_defaults(server):
    info = run_info(run_ok(server, sampler_prompt("tiny-flux1-dev", mode="compiled", steps=2)))
    assert info["mode"] == "compiled (backend inductor)" and info["compiled_now"] is not None


def test_a_prompt_saved_with_the_removed_cache_dir_input_still_runs(server):
    """The cache folder became a process setting; prompts from before still carry the old input,
    which ComfyUI leaves out of the node's inputs."""
    prompt = compiled(sampler_prompt("tiny-flux1-dev", steps=2), server)
    prompt[COMPILE]["inputs"]["cache_dir"] = "e2e-compile-cache"
    info = run_info(run_ok(server, prompt))
    assert info["compiled_now"] is not None and "e2e-compile-cache" not in str(info["compile_cache"])


def test_unparsable_warmup_sizes_fail_on_the_compile_node(server):
    for sizes, message in (("1024 by 1024", "is not WIDTHxHEIGHT"), ("1000x1000", "Nearest valid widths: 992 or 1008")):
        clear_error(server, compiled(sampler_prompt(), server, warmup_sizes=sizes), COMPILE, message)
