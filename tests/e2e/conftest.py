"""A real ComfyUI server with this pack, started once for the end-to-end tests."""

import copy
import json
import shutil

import pytest

from comfy_host import ROOT, ComfyServer, prepare_comfyui

API_WORKFLOW = ROOT / "workflows" / "api" / "tpu_demo_tiny_flux.json"


def _corrupt_models(diffusers_dir, tiny_dir):
    """Model folders a user can get wrong, next to the good ones."""
    plain = diffusers_dir / "not-a-pipeline"
    plain.mkdir()
    (plain / "model_index.json").write_text(json.dumps({"_diffusers_version": "0.42.1"}))
    unsupported = diffusers_dir / "unsupported-sdxl"
    shutil.copytree(tiny_dir / "tiny-flux1-schnell", unsupported)
    index = json.loads((unsupported / "model_index.json").read_text())
    (unsupported / "model_index.json").write_text(json.dumps({**index, "_class_name": "StableDiffusionXLPipeline"}))
    corrupt = diffusers_dir / "corrupt-flux"
    shutil.copytree(tiny_dir / "tiny-flux1-schnell", corrupt)
    weights = next((corrupt / "transformer").glob("*.safetensors"))
    weights.write_bytes(weights.read_bytes()[:1000])


@pytest.fixture(scope="session")
def server(tiny_dir, tmp_path_factory):
    base = tmp_path_factory.mktemp("comfy-base")
    diffusers_dir = base / "models" / "diffusers"
    diffusers_dir.mkdir(parents=True)
    for folder in tiny_dir.iterdir():
        (diffusers_dir / folder.name).symlink_to(folder, target_is_directory=True)
    _corrupt_models(diffusers_dir, tiny_dir)
    with ComfyServer(prepare_comfyui(), base_dir=base) as running:
        yield running


@pytest.fixture
def workflow():
    """A fresh copy of the shipped API-format workflow (Loader 1, Mode Selector 2, Sampler 3, Save 4)."""
    shipped = json.loads(API_WORKFLOW.read_text())
    return lambda: copy.deepcopy(shipped)
