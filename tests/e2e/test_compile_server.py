"""Compiled mode through the real server: warm-up compiles ahead, a second queue compiles nothing."""

from comfy_host import execution_error


def with_compile(prompt, server, **options):
    """Insert a Compile Transformer (node 5) between Mode Selector (2) and Sampler (3)."""
    inputs = dict(pipeline=["2", 0], scope="auto", fullgraph=True, warmup_sizes="", cache_dir="e2e-compile-cache")
    prompt["5"] = {"class_type": "TPUCompileTransformer", "inputs": {**inputs, **options}}
    prompt["3"]["inputs"]["pipeline"] = ["5", 0]
    return prompt


def run_info(server, prompt):
    entry = server.run(prompt, timeout=600)
    error = execution_error(entry)
    assert error is None, error and error["exception_message"]
    return entry["outputs"]["3"]["tpu_run_info"][0]


def test_compile_workflow_with_warmup_then_queued_again_compiles_nothing(server, workflow):
    prompt = with_compile(workflow(), server, warmup_sizes="96x64")
    prompt["1"]["inputs"]["model"] = "tiny-flux1-dev"
    prompt["3"]["inputs"].update(width=64, height=64, steps=2, seed=1)
    first = run_info(server, prompt)
    assert first["mode"] == "compiled (backend inductor)" and first["compiled_now"] is True
    assert any(note.startswith("warm-up: compiled now for 96x64") for note in first["notes"])
    assert (server.base_dir / "user" / "tpu_diffusers" / "e2e-compile-cache" / "inductor").is_dir()

    prompt["3"]["inputs"]["seed"] = 2  # queued again (a new seed, so ComfyUI runs the Sampler)
    again = run_info(server, prompt)
    assert again["compiled_now"] is False and again["compile_seconds"] == 0
    assert not any(note.startswith("warm-up") for note in again["notes"])

    prompt["3"]["inputs"].update(width=96, height=64, steps=3)  # the warmed size, other steps
    assert run_info(server, prompt)["compiled_now"] is False


def test_compiled_mode_without_the_compile_node_uses_its_defaults(server, workflow):
    prompt = workflow()
    prompt["1"]["inputs"]["model"] = "tiny-flux1-dev"
    prompt["2"]["inputs"]["mode"] = "compiled"
    prompt["3"]["inputs"].update(width=64, height=64, steps=2, seed=3)
    info = run_info(server, prompt)
    assert info["mode"] == "compiled (backend inductor)" and info["compiled_now"] is not None


def test_a_cache_dir_outside_the_user_folder_is_refused(server, workflow):
    for outside in ("../../input", "/tmp/elsewhere"):
        error = execution_error(server.run(with_compile(workflow(), server, cache_dir=outside), timeout=120))
        assert error["node_id"] == "5" and "is outside" in error["exception_message"]


def test_unparsable_warmup_sizes_fail_on_the_compile_node(server, workflow):
    prompt = with_compile(workflow(), server, warmup_sizes="1024 by 1024")
    entry = server.run(prompt, timeout=120)
    error = execution_error(entry)
    assert error["node_id"] == "5" and "is not WIDTHxHEIGHT" in error["exception_message"]
    prompt = with_compile(workflow(), server, warmup_sizes="1000x1000")
    error = execution_error(server.run(prompt, timeout=120))
    assert error["node_id"] == "5" and "Nearest valid widths: 992 or 1008" in error["exception_message"]
