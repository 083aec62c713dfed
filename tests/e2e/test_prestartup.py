"""prestartup_script.py in a real ComfyUI: it runs before ComfyUI imports torch, puts the compile
caches in ComfyUI's user folder, and a restarted server reuses what the first one compiled there."""

from tpu_diffusers_runtime import process_env
from serving import comfy_server, run_info, run_ok, sampler_prompt, with_compile

# Settings this test process may carry (inductor writes TORCHINDUCTOR_CACHE_DIR into os.environ when it
# first compiles); a server started with them would keep them as the user's own.
PROCESS_SETTINGS = (process_env.COMPILE_CACHE_ENV, process_env.XLA_LEVEL_ENV, process_env.APPLIED_ENV,
                    process_env.INDUCTOR_CACHE, process_env.TPU_TIER2_CACHE, process_env.TPU_TIER3_CACHE,
                    process_env.TPU_TIER3_LOCAL_BACKUP, process_env.TPU_XLA_OPTIONS)


def test_settings_are_applied_before_torch_and_a_restarted_server_reuses_the_compile_cache(tiny_dir, tmp_path,
                                                                                         monkeypatch):
    for name in PROCESS_SETTINGS:
        monkeypatch.delenv(name, raising=False)
    base = tmp_path / "comfy-base"
    cache = base / "user" / "tpu_diffusers" / "compile_cache"
    server = comfy_server(base, tiny_dir)

    with server:
        first = run_info(run_ok(server, with_compile(sampler_prompt(seed=1), server)))
        log = server.log_text()
    assert "TPU Diffusers: process settings applied before torch was imported" in log
    assert "PRESTARTUP FAILED" not in log and "Torch already imported" not in log
    assert first["compile_cache"] == {"inductor": str(cache / "inductor"), "tpu_tier3": str(cache / "tpu"),
                                      "tpu_tier2": process_env.TIER2_NAME, "xla_options": "",
                                      "applied": "before torch"}
    assert first["grad_mode"] == "inference mode off, grad off"
    assert first["compiled_now"] is True and first["compile_cache_lookups"]["fxgraph_misses"] > 0
    assert any((cache / "inductor").rglob("*")) and (cache / "tpu").is_dir()

    with server:  # a new ComfyUI process on the same folders
        again = run_info(run_ok(server, with_compile(sampler_prompt(seed=2), server)))
    assert again["compile_cache"] == first["compile_cache"]
    assert again["compiled_now"] is True  # dynamo traces again in a new process; inductor's work comes from disk
    assert again["compile_cache_lookups"]["fxgraph_hits"] > 0, again["compile_cache_lookups"]
    assert again["compile_cache_lookups"]["fxgraph_misses"] == 0, again["compile_cache_lookups"]
