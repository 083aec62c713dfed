"""Shared helpers for tests that drive a real ComfyUI server with this pack (tests/e2e, tests/reliability):
the model folders a server sees, prompts in API format, and the checks every server test makes
(a run succeeded and wrote its images; a bad input failed clearly on the right node).

Node ids in the prompts built here: Loader "1", Mode Selector "2", Sampler "3", Save Image "4"
(the shipped demo workflow), Compile Transformer "5" and TP Mesh "6" when inserted.
"""

from __future__ import annotations

import copy
import itertools
import json
import re
import shutil
from pathlib import Path

from PIL import Image

from comfy_host import ROOT, ComfyServer, PromptRejected, execution_error, prepare_comfyui

API_WORKFLOW = ROOT / "workflows" / "api" / "tpu_demo_tiny_flux.json"
LOADER, MODE, SAMPLER, SAVE, COMPILE, MESH = "1", "2", "3", "4", "5", "6"

_fresh_seeds = itertools.count(1_000_000)  # seeds no test asks for: ComfyUI re-runs a Sampler whose seed changed


# --- model folders and servers

def link_models(diffusers_dir: Path, tiny_dir: Path) -> None:
    """Every tiny model of `tiny_dir` (tests/conftest.py) under the server's models/diffusers."""
    diffusers_dir.mkdir(parents=True, exist_ok=True)
    for folder in tiny_dir.iterdir():
        (diffusers_dir / folder.name).symlink_to(folder, target_is_directory=True)


def add_broken_models(diffusers_dir: Path, tiny_dir: Path) -> None:
    """Model folders a user can get wrong, next to the good ones: no pipeline class, an unsupported
    pipeline class, a truncated weights file."""
    plain = diffusers_dir / "not-a-pipeline"
    plain.mkdir()
    (plain / "model_index.json").write_text(json.dumps({"_diffusers_version": "0.42.1"}))
    unsupported = diffusers_dir / "unsupported-sd15"
    shutil.copytree(tiny_dir / "tiny-flux1-schnell", unsupported)
    index = json.loads((unsupported / "model_index.json").read_text())
    (unsupported / "model_index.json").write_text(json.dumps({**index, "_class_name": "StableDiffusionPipeline"}))
    corrupt = diffusers_dir / "corrupt-flux"
    shutil.copytree(tiny_dir / "tiny-flux1-schnell", corrupt)
    weights = next((corrupt / "transformer").glob("*.safetensors"))
    weights.write_bytes(weights.read_bytes()[:1000])


# ComfyUI's model folder for each kind of file tools/tiny_single_files.py writes (text encoders otherwise)
FOLDER_OF_KIND = {"transformer": "diffusion_models", "transformer_fp8": "diffusion_models", "checkpoint": "checkpoints",
                  "checkpoint_no_t5": "checkpoints", "ae": "vae", "vae": "vae",
                  "transformer_2": "diffusion_models", "transformer_2_fp8": "diffusion_models",  # Wan 2.2 low-noise
                  "transformer_int8_convrot": "diffusion_models", "audio_vae": "vae"}


def add_single_files(models_dir: Path, single_files: dict) -> None:
    """The single files of tests/conftest.py's `single_files` where ComfyUI keeps them, one subfolder per
    family (e.g. diffusion_models/flux1-wide/flux1-dev.safetensors), and their configs folders in diffusers/."""
    for family, (configs, files) in single_files.items():
        if not (models_dir / "diffusers" / Path(configs).name).exists():
            (models_dir / "diffusers" / Path(configs).name).symlink_to(configs, target_is_directory=True)
        for kind, path in files.items():
            target = models_dir / FOLDER_OF_KIND.get(kind, "text_encoders") / family / path.name
            target.parent.mkdir(parents=True, exist_ok=True)
            target.symlink_to(path)


def comfy_server(base: Path, tiny_dir: Path, broken_models: bool = False, single_files: dict | None = None,
                 **options) -> ComfyServer:
    """A ComfyUI server (not started) whose data lives under `base` and which sees every tiny model
    (and the broken ones, and single files); `options` go to ComfyServer (env, data_limit_bytes, ...)."""
    diffusers_dir = base / "models" / "diffusers"
    link_models(diffusers_dir, tiny_dir)
    if broken_models:
        add_broken_models(diffusers_dir, tiny_dir)
    if single_files:
        add_single_files(base / "models", single_files)
    return ComfyServer(prepare_comfyui(), base_dir=base, **options)


# --- prompts (API format)

def demo_prompt() -> dict:
    """A fresh copy of the shipped API-format workflow."""
    return copy.deepcopy(json.loads(API_WORKFLOW.read_text()))


def sampler_prompt(model: str = "tiny-flux1-schnell", width: int = 64, height: int = 64, steps: int = 1,
                   seed: int | None = None, batch_size: int = 1, mode: str = "eager", placement: str = "device",
                   **sampler_inputs) -> dict:
    """The demo workflow on `model`, small and quick by default; a fresh seed unless one is given."""
    prompt = demo_prompt()
    prompt[LOADER]["inputs"]["model"] = model
    prompt[MODE]["inputs"].update(mode=mode, placement=placement)
    prompt[SAMPLER]["inputs"].update(width=width, height=height, steps=steps, batch_size=batch_size,
                                     seed=next(_fresh_seeds) if seed is None else seed, **sampler_inputs)
    prompt[SAVE]["inputs"]["filename_prefix"] = f"{model}_{width}x{height}"
    return prompt


def node_inputs(server: ComfyServer, node_class: str) -> set[str]:
    """The input names the running server's schema declares for a node class."""
    schema = server.get(f"/object_info/{node_class}")[node_class]["input"]
    return {name for section in ("required", "optional") for name in schema.get(section, {})}


def with_compile(prompt: dict, server: ComfyServer, **options) -> dict:
    """Insert a Compile Transformer (node 5) between Mode Selector and Sampler. Options the server's
    schema does not have (e.g. cache_dir, once the cache folder is a process-wide setting) are left out."""
    inputs = {"pipeline": [MODE, 0], "scope": "auto", "fullgraph": True, "warmup_sizes": "", "cache_dir": "", **options}
    declared = node_inputs(server, "TPUCompileTransformer")
    prompt[COMPILE] = {"class_type": "TPUCompileTransformer",
                       "inputs": {k: v for k, v in inputs.items() if k in declared}}
    prompt[SAMPLER]["inputs"]["pipeline"] = [COMPILE, 0]
    return prompt


def with_mesh(prompt: dict, chips: int = 0, **options) -> dict:
    """Insert a TP Mesh (node 6) before the Sampler (after Compile Transformer when there is one).
    chips 0 = 2 gloo ranks on a CPU host."""
    upstream = prompt[SAMPLER]["inputs"]["pipeline"]
    inputs = {"pipeline": upstream, "chips": chips, "shard_transformer": True, "shard_text_encoder": True,
              "workers": "launch_local", "address": "", "key": "", **options}
    prompt[MESH] = {"class_type": "TPUMesh", "inputs": inputs}
    prompt[SAMPLER]["inputs"]["pipeline"] = [MESH, 0]
    return prompt


# --- checks

def run_ok(server: ComfyServer, prompt: dict, timeout: float = 600, client_id: str | None = None) -> dict:
    """Run `prompt`; it must succeed. Returns its /history entry. `timeout` is a bound against hangs."""
    entry = server.wait(server.queue(prompt, client_id=client_id), timeout=timeout)
    error = execution_error(entry)
    assert error is None, f"{error['node_type']} failed: {error['exception_message']}"
    assert entry["status"]["status_str"] == "success", entry["status"]
    return entry


def run_info(entry: dict) -> dict:
    """What the Sampler says actually ran (its `tpu_run_info` output in the history)."""
    return entry["outputs"][SAMPLER]["tpu_run_info"][0]


def image_sizes(server: ComfyServer, entry: dict) -> list[tuple[int, int]]:
    """(width, height) of every image the prompt wrote, read back from the files."""
    sizes = []
    for path in server.output_images(entry):
        with Image.open(path) as image:
            sizes.append(image.size)
    return sizes


def outcome(server: ComfyServer, prompt: dict, timeout: float = 300,
            client_id: str | None = None) -> tuple[str, str | None, str, dict | None]:
    """Queue `prompt` and say how it ended: ("rejected", node id, text, None) when ComfyUI refused it at
    queue time (HTTP 400; node_errors must name one node), ("failed", node id, text, entry) when a node
    raised while it ran (execution_error), ("ran", None, "", entry) when it succeeded."""
    try:
        prompt_id = server.queue(prompt, client_id=client_id)
    except PromptRejected as rejected:
        assert rejected.status == 400, rejected
        node_errors = rejected.body.get("node_errors") or {}
        assert len(node_errors) == 1, f"expected one node named in node_errors: {rejected.body}"
        [(node, errors)] = node_errors.items()
        text = " ".join(f"{e.get('message', '')} {e.get('details', '')} "
                        f"{e.get('extra_info', {}).get('exception_message', '')}" for e in errors["errors"])
        return "rejected", node, text, None
    entry = server.wait(prompt_id, timeout=timeout)
    error = execution_error(entry)
    if error is None:
        assert entry["status"]["status_str"] == "success", entry["status"]
        return "ran", None, "", entry
    return "failed", error["node_id"], error["exception_message"], entry


def failure(entry: dict) -> tuple[str, str]:
    """(node id, message) of a prompt that failed while it ran."""
    error = execution_error(entry)
    assert error is not None, f"the prompt should have failed, it ended {entry['status']}"
    return error["node_id"], error["exception_message"]


def clear_error(server: ComfyServer, prompt: dict, nodes: str | tuple[str, ...], *patterns: str,
                timeout: float = 300, client_id: str | None = None, when: str | None = None) -> str:
    """The prompt fails clearly on the right node: either refused when queued (a 400 whose node_errors
    names the node) or failed while running (an execution_error on that node), with a message that
    names the problem (every regex in `patterns`, case-insensitive). `nodes` lists the acceptable node
    ids; `when` ("rejected" or "failed") requires one of the two. Returns the message."""
    nodes = (nodes,) if isinstance(nodes, str) else nodes
    how, node, text, entry = outcome(server, prompt, timeout, client_id)
    assert how != "ran", "the prompt should have failed; it ran"
    assert when in (None, how), f"the prompt {how} (on node {node}), it should have been {when}: {text}"
    assert node in nodes, f"the error is on node {node}, not on {'/'.join(nodes)} ({how}): {text}"
    assert text.strip(), f"empty error message ({how} on node {node})"
    for pattern in patterns:
        assert re.search(pattern, text, re.I), f"the message ({how} on node {node}) does not say {pattern!r}: {text}"
    return text


def interrupted_on(entry: dict) -> str | None:
    """The node a prompt was interrupted on (its `execution_interrupted` message), or None."""
    for kind, data in entry.get("status", {}).get("messages", []):
        if kind == "execution_interrupted":
            return data["node_id"]
    return None


def a_good_prompt_succeeds(server: ComfyServer, model: str = "tiny-flux1-schnell") -> dict:
    """The server still serves: a small prompt runs and writes its image."""
    entry = run_ok(server, sampler_prompt(model), timeout=300)
    assert image_sizes(server, entry) == [(64, 64)]
    return entry
