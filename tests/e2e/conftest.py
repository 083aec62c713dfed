"""A real ComfyUI server with this pack, started once for the end-to-end tests."""

import copy
import json
import time

import pytest

from comfy_host import ROOT, execution_error
from serving import comfy_server

API_WORKFLOW = ROOT / "workflows" / "api" / "tpu_demo_tiny_flux.json"

# Another pack's node that frees ComfyUI's models as a routine step, as many packs do.
OTHER_PACK_NODE = """
import comfy.model_management


class UnloadAllModelsAfter:
    CATEGORY = "testing"
    RETURN_TYPES = ()
    OUTPUT_NODE = True
    FUNCTION = "run"

    @classmethod
    def INPUT_TYPES(cls):
        return {"required": {"images": ("IMAGE",)}}

    def run(self, images):
        comfy.model_management.unload_all_models()
        return {"ui": {"called": ["unload_all_models"]}}


NODE_CLASS_MAPPINGS = {"UnloadAllModelsAfter": UnloadAllModelsAfter}
"""


@pytest.fixture(scope="session")
def server(tiny_dir, tmp_path_factory):
    base = tmp_path_factory.mktemp("comfy-base")
    (base / "custom_nodes").mkdir()
    (base / "custom_nodes" / "other_pack_unload_all_models.py").write_text(OTHER_PACK_NODE)
    # ComfyUI 0.3.75's default preview method, named so a newer default cannot change what the tests see;
    # the TP Mesh's attach address that test_validation.py queues (nothing listens there) allowed
    with comfy_server(base, tiny_dir, broken_models=True, args=["--preview-method", "none"],
                      env={"TPU_DIFFUSERS_ATTACH_ALLOW": "127.0.0.1:7777"}) as running:
        yield running


@pytest.fixture
def workflow():
    """A fresh copy of the shipped API-format workflow (Loader 1, Mode Selector 2, Sampler 3, Save 4)."""
    shipped = json.loads(API_WORKFLOW.read_text())
    return lambda: copy.deepcopy(shipped)


@pytest.fixture
def then_a_good_prompt_succeeds(server, workflow):
    """After a test of bad input: the server still runs a good prompt."""
    yield
    prompt = workflow()
    prompt["3"]["inputs"].update(width=64, height=64, steps=1, seed=int(time.time() * 1000) % 100000)
    error = execution_error(server.run(prompt, timeout=300))
    assert error is None, error["exception_message"]
