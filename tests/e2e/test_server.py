"""The pack inside a real ComfyUI 0.3.75 server: import, schemas, workflows, unload, cancel, run-time errors."""

import json
import time

import pytest
from PIL import Image

from comfy_host import ROOT, PromptRejected, execution_error

OUR_NODES = ("TPULoader", "TPUModeSelector", "TPUSampler", "TPUVideoSampler", "TPUVideoReference")


def run_ok(server, prompt):
    entry = server.run(prompt, timeout=300)
    error = execution_error(entry)
    assert error is None, error and error.get("exception_message")
    return entry


def run_info(entry):
    return entry["outputs"]["3"]["tpu_run_info"][0]


def test_pack_imports_without_error(server):
    assert server.pack_import_line(), server.log_tail()
    assert "IMPORT FAILED" not in server.pack_import_line()
    assert "torch_tpu is installed but no TPU chip is usable (no TPU on the PCI bus); falling back to cpu" \
        in server.log_text()


def test_object_info_lists_our_nodes_with_tooltips_and_descriptions(server):
    info = server.get("/object_info")
    for node_id in OUR_NODES:
        node = info[node_id]
        assert node["category"] == "TPU Diffusers" and node["description"]
        inputs = {**node["input"]["required"], **node["input"].get("optional", {})}
        for name, spec in inputs.items():
            assert spec[1].get("tooltip"), f"{node_id}.{name} has no tooltip"
    assert "tiny-flux1-schnell" in info["TPULoader"]["input"]["required"]["model"][1]["options"]
    # LATENT, then MASK appended: saved links hold
    assert info["TPUSampler"]["output"] == ["IMAGE", "STRING", "LATENT", "MASK"]
    # AUDIO appended after frames, fps and info: saved links hold
    assert info["TPUVideoSampler"]["output"] == ["IMAGE", "FLOAT", "STRING", "AUDIO"]
    # the upscaler, the sigmas, the reference video, then the references appended after the others: saved widget
    # values and links hold
    assert list(info["TPUVideoSampler"]["input"]["optional"])[-4:] == ["upscaler", "sigmas", "reference_video",
                                                                       "references"]
    assert info["TPUVideoSampler"]["input"]["optional"]["references"][0] == "TPU_VIDEO_REFERENCES"
    assert info["TPUVideoReference"]["output"] == ["TPU_VIDEO_REFERENCES"]
    assert info["TPUVideoSampler"]["input"]["optional"]["upscaler"][0] == "TPU_LATENT_UPSCALER"
    assert info["TPUVideoSampler"]["input"]["optional"]["sigmas"][0] == "SIGMAS"
    assert info["TPULatentUpscaleModel"]["output"] == ["TPU_LATENT_UPSCALER"]


def test_the_ui_workflow_matches_the_api_workflow(server, workflow):
    """Both shipped formats describe the same graph with the same widget values."""
    ui = json.loads((ROOT / "workflows" / "tpu_demo_tiny_flux.json").read_text())
    api = workflow()
    info = server.get("/object_info")
    for node in ui["nodes"]:
        inputs = api[str(node["id"])]["inputs"]
        schema = info[node["type"]]["input"]
        widget_names = [n for section in ("required", "optional") for n, spec in schema.get(section, {}).items()
                        if isinstance(spec[0], list) or spec[0] in ("STRING", "INT", "FLOAT", "BOOLEAN", "COMBO")]
        values = [v for v in node["widgets_values"] if v not in ("fixed", "randomize", "increment", "decrement")]
        assert dict(zip(widget_names, values)) == {n: inputs[n] for n in widget_names}, node["type"]


def test_shipped_workflow_writes_a_png_of_the_requested_size(server, workflow):
    prompt = workflow()
    entry = run_ok(server, prompt)
    [png] = server.output_images(entry)
    with Image.open(png) as image:
        assert image.size == (prompt["3"]["inputs"]["width"], prompt["3"]["inputs"]["height"])


def test_an_api_prompt_saved_before_denoise_existed_runs_as_denoise_1(server, workflow):
    """denoise is optional for the server: a POST /prompt body written before the input existed still
    queues, and gives the image of denoise 1.0."""
    prompt = workflow()
    prompt["3"]["inputs"].update(width=64, height=64, steps=1, seed=300)
    assert prompt["3"]["inputs"]["denoise"] == 1.0
    [with_denoise] = server.output_images(run_ok(server, prompt))
    del prompt["3"]["inputs"]["denoise"]
    [without] = server.output_images(run_ok(server, prompt))
    with Image.open(with_denoise) as a, Image.open(without) as b:
        assert a.tobytes() == b.tobytes()


@pytest.mark.parametrize("model, negative", [("tiny-flux1-schnell", ""), ("tiny-flux1-dev", ""),
                                             ("tiny-sd3", "blurry"), ("tiny-flux2", ""),
                                             ("tiny-qwenimage", "blurry")])
def test_each_family_runs_through_the_server(server, workflow, model, negative):
    prompt = workflow()
    prompt["1"]["inputs"]["model"] = model
    prompt["3"]["inputs"].update(width=96, height=64, steps=2, negative_prompt=negative, guidance=2.0)
    entry = run_ok(server, prompt)
    [png] = server.output_images(entry)
    with Image.open(png) as image:
        assert image.size == (96, 64)


@pytest.mark.parametrize("model, cls, sampler, call", [
    # Z-Image as Turbo runs (8 steps, guidance 0: diffusers then runs no CFG, the negative prompt is unused)
    ("zimage", "ZImagePipeline", dict(steps=8, guidance=0.0), dict(num_inference_steps=8, guidance_scale=0.0)),
    # Qwen-Image 2.1 with true CFG (guidance above 1 and a negative prompt); its RGBA output saved as RGB
    ("qwenimage21", "QwenImage21Pipeline", dict(steps=2, guidance=2.0, negative_prompt="blurry"),
     dict(num_inference_steps=2, true_cfg_scale=2.0, negative_prompt="blurry")),
])
def test_a_family_through_the_server_saves_plain_diffusers_image_for_the_seed(server, workflow, tiny, model, cls,
                                                                             sampler, call):
    """The saved PNG is plain diffusers' image for the same seed, quantised as Save Image does; joined with the
    Sampler's MASK by ComfyUI's Join Image with Alpha, it is plain diffusers' RGBA image (Qwen-Image 2.1), or opaque
    for a model that decodes no alpha (Z-Image)."""
    import diffusers
    import numpy as np
    import torch

    prompt = workflow()
    prompt["1"]["inputs"]["model"] = f"tiny-{model}"
    prompt["3"]["inputs"].update(width=96, height=64, seed=5, **sampler)
    prompt["6"] = {"class_type": "JoinImageWithAlpha", "inputs": {"image": ["3", 0], "alpha": ["3", 3]}}
    prompt["7"] = {"class_type": "SaveImage", "inputs": {"images": ["6", 0], "filename_prefix": "rgba"}}
    entry = run_ok(server, prompt)
    [png], [rgba] = ([server.output_dir / image["filename"] for image in entry["outputs"][node]["images"]]
                     for node in ("4", "7"))
    pipe = getattr(diffusers, cls).from_pretrained(tiny(model), local_files_only=True)
    expected = pipe(prompt=prompt["3"]["inputs"]["prompt"], width=96, height=64, **call,
                    generator=torch.Generator("cpu").manual_seed(5), output_type="pt").images
    eight_bit = np.clip(255.0 * expected[0].permute(1, 2, 0).numpy(), 0, 255).astype(np.uint8)
    with Image.open(png) as image:
        assert np.array_equal(np.asarray(image.convert("RGB")), eight_bit[..., :3])
    alpha = eight_bit[..., 3] if expected.shape[1] == 4 else np.full((64, 96), 255, np.uint8)
    with Image.open(rgba) as image:
        assert image.mode == "RGBA"
        saved = np.asarray(image).astype(int)
        assert np.array_equal(saved[..., :3], eight_bit[..., :3])
        # 1 - (1 - alpha) rounds in float32: within one 8-bit level of diffusers' alpha
        assert np.abs(saved[..., 3] - alpha).max() <= 1 and (np.std(alpha) > 1 or model == "zimage")


def test_qwen_image_21_turbo_through_the_server_saves_the_image_of_diffusers_turbo_blocks(server, workflow, tiny):
    """Qwen-Image 2.1 Turbo (`sample_sigmas` in its model_index.json: 3 here) through the server saves the image that
    diffusers' QwenImage21TurboAutoBlocks give when set up from the folder as diffusers documents; the grid sets the
    steps, and the guidance and negative prompt are not used (the blocks take none)."""
    import numpy as np
    import torch
    from diffusers import QwenImage21TurboAutoBlocks

    prompt = workflow()
    prompt["1"]["inputs"]["model"] = "tiny-qwenimage21-turbo"
    prompt["3"]["inputs"].update(width=96, height=64, steps=8, guidance=3.0, negative_prompt="blurry", seed=5)
    entry = run_ok(server, prompt)
    [png] = server.output_images(entry)
    assert "negative prompt ignored" in "\n".join(run_info(entry)["notes"])
    pipe = QwenImage21TurboAutoBlocks().init_pipeline(tiny("qwenimage21-turbo"))
    pipe.load_components(torch_dtype=torch.float32)
    expected = pipe(prompt=prompt["3"]["inputs"]["prompt"], width=96, height=64,
                    generator=torch.Generator("cpu").manual_seed(5), output_type="pt").images
    expected = np.clip(255.0 * expected[0, :3].permute(1, 2, 0).numpy(), 0, 255).astype(np.uint8)
    with Image.open(png) as image:
        assert np.array_equal(np.asarray(image.convert("RGB")), expected)


def test_krea2_through_the_server_saves_plain_diffusers_image_and_a_size_it_cannot_make_is_refused(server, workflow,
                                                                                                   tiny):
    """Krea 2 with CFG (guidance 2: cond + 2 x (cond - uncond), the negative prompt as uncond): the saved PNG is plain
    diffusers' image for the same seed; a width that is no multiple of 16 is refused when queued."""
    import diffusers
    import numpy as np
    import torch

    prompt = workflow()
    prompt["1"]["inputs"]["model"] = "tiny-krea2"
    prompt["3"]["inputs"].update(width=96, height=64, steps=3, guidance=2.0, negative_prompt="blurry", seed=5)
    [png] = server.output_images(run_ok(server, prompt))
    pipe = diffusers.Krea2Pipeline.from_pretrained(tiny("krea2"), local_files_only=True)
    expected = pipe(prompt=prompt["3"]["inputs"]["prompt"], negative_prompt="blurry", width=96, height=64,
                    num_inference_steps=3, guidance_scale=2.0, generator=torch.Generator("cpu").manual_seed(5),
                    output_type="pt").images
    expected = np.clip(255.0 * expected[0].permute(1, 2, 0).numpy(), 0, 255).astype(np.uint8)
    with Image.open(png) as image:
        assert np.array_equal(np.asarray(image.convert("RGB")), expected)
    prompt["3"]["inputs"]["width"] = 88
    with pytest.raises(PromptRejected) as rejected:
        server.queue(prompt)
    assert rejected.value.status == 400 and "width 88 cannot be used" in json.dumps(rejected.value.body)


def test_second_run_loads_nothing_and_unload_models_releases_the_pipeline(server, workflow):
    prompt = workflow()
    prompt["1"]["inputs"]["model"] = "tiny-sd3"
    prompt["3"]["inputs"].update(width=64, height=64, steps=2, seed=100)
    run_ok(server, prompt)
    prompt["3"]["inputs"]["seed"] = 101  # a changed input, so ComfyUI runs the Sampler again
    assert run_info(run_ok(server, prompt))["loaded"] is False

    unloads = server.log_text().count("unloaded 1 pipeline(s)")
    server.post("/free", {"unload_models": True, "free_memory": True})
    deadline = time.monotonic() + 30
    while server.log_text().count("unloaded 1 pipeline(s)") == unloads and time.monotonic() < deadline:
        time.sleep(0.2)
    assert server.log_text().count("unloaded 1 pipeline(s)") == unloads + 1
    prompt["3"]["inputs"]["seed"] = 102
    assert run_info(run_ok(server, prompt))["loaded"] is True


def test_sampler_reports_the_mode_that_actually_ran(server, workflow):
    prompt = workflow()
    prompt["2"]["inputs"].update(mode="fused_eager", placement="model_cpu_offload")
    prompt["3"]["inputs"].update(width=64, height=64, steps=2, seed=5)
    info = run_info(run_ok(server, prompt))
    assert info["mode"].startswith("eager (fused eager needs TorchTPU") and info["placement"] == "model_cpu_offload"


def test_unload_all_models_called_by_another_pack_keeps_our_pipeline(server, workflow):
    """Only the user's Unload Models releases our pipelines: other packs call
    comfy.model_management.unload_all_models() as a routine step (conftest's other-pack node)."""
    prompt = workflow()
    prompt["3"]["inputs"].update(width=64, height=64, steps=1, seed=200)
    run_ok(server, prompt)  # loaded now, if an earlier test had not
    prompt["5"] = {"class_type": "UnloadAllModelsAfter", "inputs": {"images": ["3", 0]}}
    prompt["3"]["inputs"]["seed"] = 201
    entry = run_ok(server, prompt)
    assert entry["outputs"]["5"]["called"] == ["unload_all_models"]
    del prompt["5"]
    prompt["3"]["inputs"]["seed"] = 202
    assert run_info(run_ok(server, prompt))["loaded"] is False


# --- bad input found only when the prompt runs (what needs no model is refused at queue time:
# test_validation.py); each ends in a clear message, and the server then runs a good prompt


@pytest.mark.usefixtures("then_a_good_prompt_succeeds")
@pytest.mark.parametrize("hub_id", ["black-forest-labs/FLUX.1-schnell",
                                    "models/diffusers"])  # also a folder in ComfyUI's working directory
def test_offline_hub_id_says_to_download_it_and_is_never_read_as_a_folder(server, workflow, hub_id):
    prompt = workflow()
    prompt["1"]["inputs"]["hub_id"] = hub_id
    error = execution_error(server.run(prompt, timeout=300))
    assert error["node_id"] == "1"
    assert f"hf download {hub_id} " in error["exception_message"]


def test_cancel_stops_a_long_run_and_the_next_run_succeeds(server, workflow):
    prompt = workflow()
    prompt["3"]["inputs"].update(width=512, height=512, steps=1000, seed=9)
    prompt_id = server.queue(prompt)
    deadline = time.monotonic() + 120
    while not server.get("/queue")["queue_running"] and time.monotonic() < deadline:
        time.sleep(0.1)
    time.sleep(3)  # some steps in
    server.post("/interrupt", {})
    entry = server.wait(prompt_id, timeout=60)
    assert entry["status"]["status_str"] == "error"
    assert any(kind == "execution_interrupted" for kind, _ in entry["status"]["messages"])
    prompt["3"]["inputs"].update(width=64, height=64, steps=1)
    run_ok(server, prompt)
