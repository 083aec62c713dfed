"""Bad values are refused when the prompt is queued: HTTP 400 naming our node and the field, nothing
runs, and the server then runs a good prompt. What is known only at run time (a value fed by a
link, a model folder removed after queueing) still fails on the right node when the prompt runs.
"""

import os
import time

import pytest

from comfy_host import PromptRejected, execution_error

KEY_ENV = "TPU_DIFFUSERS_CONTROL_KEY"


def refused(server, prompt, node_id: str, field: str) -> str:
    """Queue a prompt that must be refused on `node_id` for `field`; returns the node's message."""
    history = len(server.get("/history"))
    with pytest.raises(PromptRejected) as caught:
        server.queue(prompt)
    assert caught.value.status == 400
    node_errors = caught.value.body["node_errors"]
    assert list(node_errors) == [node_id], node_errors
    # ComfyUI repeats a validate_inputs message once per input it was given: "<input> - <message>".
    messages = {error["details"].split(" - ", 1)[1] for error in node_errors[node_id]["errors"]
                if error["type"] == "custom_validation_failed"}
    assert len(messages) == 1, node_errors
    [message] = messages
    assert message.startswith(field), message
    assert len(server.get("/history")) == history, "a refused prompt must not run"
    assert not server.get("/queue")["queue_pending"]
    return message


def with_compile(prompt, warmup_sizes):
    """A Compile Transformer (node 5) between Mode Selector (2) and Sampler (3)."""
    prompt["5"] = {"class_type": "TPUCompileTransformer", "inputs": {
        "pipeline": ["2", 0], "scope": "auto", "fullgraph": True, "warmup_sizes": warmup_sizes}}
    prompt["3"]["inputs"]["pipeline"] = ["5", 0]
    return prompt


def with_mesh(prompt, **inputs):
    """A TP Mesh (node 6) between Mode Selector (2) and Sampler (3)."""
    prompt["6"] = {"class_type": "TPUMesh", "inputs": {
        "pipeline": ["2", 0], "chips": 2, "replicas": 0, "shard_transformer": True, "shard_text_encoder": True,
        "workers": "attach", "address": "127.0.0.1:7777", "key": "", **inputs}}
    prompt["3"]["inputs"]["pipeline"] = ["6", 0]
    return prompt


@pytest.mark.usefixtures("then_a_good_prompt_succeeds")
class TestRefusedWhenQueued:
    @pytest.mark.parametrize("inputs, field, expected", [
        (dict(model="does-not-exist"), "model", "model folder 'does-not-exist' was not found"),
        (dict(model="../tiny-sd3"), "model", "is not a folder name inside models/diffusers"),
        (dict(model="../../../../etc"), "model", "is not a folder name inside models/diffusers"),
        (dict(model="tiny-sd3/../tiny-sd3"), "model", "is not a folder name inside models/diffusers"),
        (dict(model="not-a-pipeline"), "model", "names no pipeline class"),
        (dict(model="unsupported-sd15"), "model", "'StableDiffusionPipeline', which TPU Diffusers does not run"),
        (dict(model="corrupt-flux"), "model", "truncated or corrupt"),
        (dict(hub_id="../../../../etc"), "hub_id", "is not a hub id like 'owner/name'"),
        (dict(hub_id="/etc"), "hub_id", "is not a hub id like 'owner/name'"),
        (dict(hub_id="a/b/c"), "hub_id", "is not a hub id like 'owner/name'"),
        (dict(device="quantum"), "device", "device 'quantum' was asked for"),
    ])
    def test_loader(self, server, workflow, inputs, field, expected):
        """0.3.75 takes any V3 combo value; newer ComfyUI leaves the inputs named in validate_inputs
        to it. Either way the Loader's own check answers, before anything runs."""
        prompt = workflow()
        prompt["1"]["inputs"].update(inputs)
        assert expected in refused(server, prompt, "1", field)

    @pytest.mark.parametrize("inputs, field, expected", [
        (dict(width=1000), "width", "width 1000 cannot be used: every supported model needs a multiple of 16. "
                                    "Nearest valid widths: 992 or 1008."),
        (dict(height=72), "height", "Nearest valid heights: 64 or 80"),
        (dict(width=8), "width", "Nearest valid widths: 16 or 32"),
        (dict(height=8208), "height", "height 8208 is larger than 8192"),
        (dict(prompt=" \n "), "prompt", "prompt is empty"),
    ])
    def test_sampler(self, server, workflow, inputs, field, expected):
        prompt = workflow()
        prompt["3"]["inputs"].update(inputs)
        assert expected in refused(server, prompt, "3", field)

    @pytest.mark.parametrize("sizes, expected", [
        ("1024", "warmup size '1024' is not WIDTHxHEIGHT"),
        ("64x64, 1000x1024", "1000x1024: width 1000 cannot be used"),
        ("64x72", "64x72: height 72 cannot be used"),
    ])
    def test_compile_warmup_sizes(self, server, workflow, sizes, expected):
        prompt = with_compile(workflow(), sizes)
        assert expected in refused(server, prompt, "5", "warmup_sizes")

    @pytest.mark.parametrize("inputs, field, expected", [
        (dict(workers="elsewhere"), "workers", "workers must be 'launch_local' or 'attach', not 'elsewhere'"),
        (dict(address=""), "address", "address '' is not host:port"),
        (dict(address="10.0.0.2"), "address", "address '10.0.0.2' is not host:port"),
        (dict(address="10.0.0.2:port"), "address", "is not host:port"),
        pytest.param(dict(key=""), "key", f"key is empty and ${KEY_ENV} is not set",
                     marks=pytest.mark.skipif(KEY_ENV in os.environ, reason=f"${KEY_ENV} is set")),
        # a shared workflow chooses neither the key nor, unless the server's owner allowed it, the address
        (dict(key="ab" * 32), "key", f"key must be empty: attach takes the workers' key only from ${KEY_ENV}"),
        (dict(key="ab" * 32, workers="launch_local"), "key", "Clear this field"),
        (dict(address="10.0.0.2:7777"), "address",
         "address '10.0.0.2:7777' is not in $TPU_DIFFUSERS_ATTACH_ALLOW, so attach does not connect there"),
    ])
    def test_tp_mesh_attach(self, server, workflow, inputs, field, expected):
        prompt = with_mesh(workflow(), **inputs)
        assert expected in refused(server, prompt, "6", field)


def test_comfyuis_own_range_checks_still_apply(server, workflow):
    """Only the inputs validate_inputs names lose ComfyUI's min/max check."""
    for name, value, kind in (("steps", 0, "value_smaller_than_min"), ("guidance", 101.0, "value_bigger_than_max"),
                              ("batch_size", 65, "value_bigger_than_max")):
        prompt = workflow()
        prompt["3"]["inputs"][name] = value
        with pytest.raises(PromptRejected) as caught:
            server.queue(prompt)
        [error] = caught.value.body["node_errors"]["3"]["errors"]
        assert (error["type"], error["extra_info"]["input_name"]) == (kind, name)


# --- known only when the prompt runs: the run-time checks still answer, on the right node


@pytest.mark.usefixtures("then_a_good_prompt_succeeds")
def test_a_width_fed_by_a_link_is_checked_when_the_sampler_runs(server, workflow):
    prompt = workflow()
    prompt["7"] = {"class_type": "PrimitiveInt", "inputs": {"value": 1000}}
    prompt["3"]["inputs"]["width"] = ["7", 0]
    error = execution_error(server.run(prompt, timeout=300))
    assert error["node_id"] == "3"
    assert "width 1000 cannot be used with FLUX.1: it must be a multiple of 16" in error["exception_message"]


@pytest.mark.usefixtures("then_a_good_prompt_succeeds")
def test_a_model_folder_removed_after_queueing_fails_on_the_loader(server, workflow, tiny_dir):
    diffusers_dir = server.models_dir / "diffusers"
    (diffusers_dir / "vanishing").symlink_to(tiny_dir / "tiny-flux1-schnell", target_is_directory=True)
    busy = workflow()
    busy["3"]["inputs"].update(width=512, height=512, steps=1000, seed=int(time.time()) % 100000)
    busy_id = server.queue(busy)  # keeps the queue busy while the folder goes away
    prompt = workflow()
    prompt["1"]["inputs"]["model"] = "vanishing"
    prompt_id = server.queue(prompt)  # accepted: the folder is there now
    (diffusers_dir / "vanishing").unlink()
    deadline = time.monotonic() + 120
    while busy_id not in server.get(f"/history/{busy_id}") and time.monotonic() < deadline:
        server.post("/interrupt", {"prompt_id": busy_id})  # only while it runs, never the next prompt
        time.sleep(0.5)
    error = execution_error(server.wait(prompt_id, timeout=300))
    assert error["node_id"] == "1" and "model folder 'vanishing' was not found" in error["exception_message"]
