"""Live previews through a real ComfyUI server: binary preview frames on the websocket during a run."""

import io

import pytest
from PIL import Image

from comfy_host import ComfyServer, execution_error, prepare_comfyui

PREVIEW_SIZE = 256  # --preview-size: ComfyUI scales each preview to fit this square
JPEG = 1


@pytest.fixture(scope="module")
def preview_server(tiny_dir, tmp_path_factory):
    """A second server, with previews on (ComfyUI's "auto": latent2rgb without a TAESD file)."""
    base = tmp_path_factory.mktemp("comfy-preview-base")
    (base / "models").mkdir()
    (base / "models" / "diffusers").symlink_to(tiny_dir, target_is_directory=True)
    args = ["--preview-method", "auto", "--preview-size", str(PREVIEW_SIZE)]
    with ComfyServer(prepare_comfyui(), base_dir=base, args=args) as running:
        yield running


def small_prompt(workflow, model, steps):
    prompt = workflow()
    prompt["1"]["inputs"]["model"] = model
    prompt["3"]["inputs"].update(width=96, height=64, steps=steps, negative_prompt="blurry", guidance=2.0)
    return prompt


@pytest.mark.parametrize("model", ["tiny-flux1-schnell", "tiny-sd3", "tiny-flux2", "tiny-qwenimage"])
def test_a_preview_per_step_arrives_over_the_websocket(preview_server, workflow, model):
    entry, previews = preview_server.run_watching(small_prompt(workflow, model, steps=3), timeout=300)
    error = execution_error(entry)
    assert error is None, error and error["exception_message"]
    assert len(previews) == 3
    images = []
    for image_type, data in previews:
        assert image_type == JPEG
        image = Image.open(io.BytesIO(data))
        assert image.format == "JPEG" and image.size == (PREVIEW_SIZE, round(PREVIEW_SIZE * 64 / 96))  # the run's shape
        images.append(image.convert("RGB"))
    assert images[0].tobytes() != images[-1].tobytes()  # each step's own latents


def test_a_server_started_with_preview_method_none_sends_none(server, workflow):
    entry, previews = server.run_watching(small_prompt(workflow, "tiny-flux1-schnell", steps=3), timeout=300)
    assert execution_error(entry) is None
    assert previews == []
    assert [e for e in entry["status"]["messages"] if e[0] == "execution_success"]  # it did run
