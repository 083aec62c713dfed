"""Compiled mode on CPU (inductor). Compiles cost tens of seconds here, so the tests are few and
small. Counts come from dynamo's and inductor's counters, never from timers. Each test runs alone."""

import json
import os
import subprocess
import sys
import types

import pytest
import torch

from tpu_diffusers_runtime import process_env
from tpu_diffusers_runtime.features import compilation
from tpu_diffusers_runtime.errors import CompileError
from tpu_diffusers_runtime.features.compilation import parse_sizes
from tpu_diffusers_runtime.specs import CompileSpec
from tpu_diffusers_runtime.device import device_info
from tpu_diffusers_runtime.engine import Engine
from tpu_diffusers_runtime.errors import UserInputError
from tpu_diffusers_runtime.families import family_for
from tpu_diffusers_runtime.handle import PipelineHandle
from tpu_diffusers_runtime.specs import CompileScope, ExecutionMode, Placement
from tpu_diffusers_runtime.tasks import SampleRequest

# inductor reorders float32 reductions; images agree to a few 1e-4 on these tiny random models
COMPILED_VS_EAGER_ATOL = 2e-3


ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
DYNAMO_SETTINGS = ("recompile_limit", "accumulated_recompile_limit", "fail_on_recompile_limit_hit")


def dynamo_settings() -> dict:
    return {name: getattr(torch._dynamo.config, name) for name in DYNAMO_SETTINGS}


def flux(tiny, **fields):
    spec = CompileSpec(**fields.pop("spec", {}))
    return PipelineHandle.of(source=tiny("flux1-schnell"), model_class="FluxPipeline", mode=ExecutionMode.COMPILED,
                          compile=spec, **fields)


def request(width=64, height=64, steps=2, seed=3):
    return SampleRequest(prompt="a cat sitting on a red chair", width=width, height=height, steps=steps, seed=seed)


def test_each_shape_compiles_once_warmup_compiles_ahead_and_matches_eager(tiny):
    """Shapes are the transformer's: FLUX packs latents to (h/16)*(w/16) tokens, so sizes with the same
    token count (96x64 and 64x96) share one graph; 112x64 is new. torch's dynamo settings are patched
    around our compiled calls only."""
    engine = Engine()
    handle = flux(tiny, spec=dict(warmup_sizes=((96, 64),)))
    settings_before = dynamo_settings()
    first = engine.generate(handle, request())
    assert dynamo_settings() == settings_before
    assert first.info.compiled_now is True
    assert any(n.startswith("warm-up: compiled now for 96x64") for n in first.info.notes)
    lookups = first.info.compile_cache_lookups
    assert lookups["fxgraph_hits"] + lookups["fxgraph_misses"] >= 2  # the warm-up size and this size
    assert first.info.compile_cache["inductor"] == os.environ[process_env.INDUCTOR_CACHE]  # where inductor wrote

    runs = {"same size": request(seed=4), "other steps": request(steps=3), "warmed size": request(96, 64),
            "new size": request(112, 64), "back to a seen size": request(seed=5)}
    compiled_now = {name: engine.generate(handle, r).info.compiled_now for name, r in runs.items()}
    assert compiled_now == {"same size": False, "other steps": False, "warmed size": False,
                            "new size": True, "back to a seen size": False}

    state = engine.realise(handle)[0].states["compilation"]
    assert state.scope == "whole" and state.request.backend == "inductor"
    assert {shape: record.compiles for shape, record in state.shapes.items()} == \
        {(96, 64, 1, 0): 1, (64, 64, 1, 0): 1, (112, 64, 1, 0): 1}
    assert state.shapes[(64, 64, 1, 0)].reuses == 3 and state.shapes[(64, 64, 1, 0)].compile_seconds > 0

    eager = Engine().generate(PipelineHandle.of(source=handle.source, model_class="FluxPipeline"), request())
    torch.testing.assert_close(first.images, eager.images, atol=COMPILED_VS_EAGER_ATOL, rtol=0)


# The families whose denoiser test_the_other_families_compile_whole_and_match_eager does not compile already (FLUX.1;
# Qwen-Image 2.1, which cannot compile whole; FLUX 3's base blocks), and SDXL's UNet: how offload and repeated blocks
# combine is the same for every family, the blocks are each family's own.
@pytest.mark.parametrize("name, pipeline_class", [("flux1-schnell", "FluxPipeline"),
                                                  ("sdxl", "StableDiffusionXLPipeline"),
                                                  ("qwenimage21", "QwenImage21Pipeline"),
                                                  ("flux3", "Flux3ModularPipeline")])
def test_model_offload_with_auto_scope_compiles_the_repeated_blocks(tiny, name, pipeline_class):
    engine = Engine()
    handle = PipelineHandle.of(source=tiny(name), model_class=pipeline_class, mode=ExecutionMode.COMPILED,
                            placement=Placement.MODEL_CPU_OFFLOAD, compile=CompileSpec())
    result = engine.generate(handle, request())
    entry = engine.realise(handle)[0]
    compiled = entry.states["compilation"]
    assert compiled.scope == "repeated_blocks" and compiled.shapes[(64, 64, 1, 0)].compiles == 1
    denoiser = getattr(entry.pipe, family_for(pipeline_class).denoiser)  # a transformer, SDXL's unet
    assert denoiser._compiled_call_impl is None  # the offload hooks around it stay eager
    blocks = [module for module in denoiser.modules() if type(module).__name__ in denoiser._repeated_blocks]
    assert blocks and all(block._compiled_call_impl is not None for block in blocks)
    eager = Engine().generate(PipelineHandle.of(source=handle.source, model_class=pipeline_class), request())
    torch.testing.assert_close(result.images, eager.images, atol=COMPILED_VS_EAGER_ATOL, rtol=0)


def test_wan_compiles_the_blocks_of_both_experts_for_its_frames(tiny):
    """Wan 2.2 A14B: the high- and the low-noise expert each denoise part of the steps; both are compiled (repeated
    blocks under offload), the frame count is part of the compiled shape, and the frames equal eager."""
    video = SampleRequest(prompt="a corgi on a beach", width=64, height=64, steps=3, seed=3, frames=5)  # 3: both experts
    handle = PipelineHandle.of(source=tiny("wan22-t2v-a14b"), model_class="WanPipeline", mode=ExecutionMode.COMPILED,
                               placement=Placement.MODEL_CPU_OFFLOAD, compile=CompileSpec())
    engine = Engine()
    result = engine.generate(handle, video)
    entry = engine.realise(handle)[0]
    assert entry.states["compilation"].shapes[(64, 64, 1, 5)].compiles == 1
    assert any(note.startswith("compile: compiled now for 64x64x5 frames") for note in result.info.notes)
    for expert in (entry.pipe.transformer, entry.pipe.transformer_2):
        blocks = [module for module in expert.modules() if type(module).__name__ in expert._repeated_blocks]
        assert blocks and all(block._compiled_call_impl is not None for block in blocks)
    eager = Engine().generate(PipelineHandle.of(source=handle.source, model_class="WanPipeline"), video)
    torch.testing.assert_close(result.images, eager.images, atol=COMPILED_VS_EAGER_ATOL, rtol=0)


@pytest.mark.parametrize("model", ["ltx2", "ltx23"])
def test_ltx2_compiles_its_audio_video_blocks_under_offload_and_matches_eager(tiny, model):
    """LTX-2 (video with sound), and LTX-2.3's blocks (gated and perturbed attention, prompt modulation): auto scope
    under model CPU offload compiles the transformer's repeated blocks for the frame count; the frames and the sound
    track equal eager. (Compiled whole with fullgraph LTX-2 also equals eager: measured once on CPU, ~90 s of
    compiling, not run here.)"""
    video = SampleRequest(prompt="a corgi barking on a beach", width=32, height=32, steps=2, seed=3, frames=9,
                          guidance=3.0)
    handle = PipelineHandle.of(source=tiny(model), model_class="LTX2Pipeline", mode=ExecutionMode.COMPILED,
                               placement=Placement.MODEL_CPU_OFFLOAD, compile=CompileSpec())
    engine = Engine()
    result = engine.generate(handle, video)
    entry = engine.realise(handle)[0]
    assert entry.states["compilation"].scope == "repeated_blocks"
    assert entry.states["compilation"].shapes[(32, 32, 1, 9)].compiles == 1
    blocks = [module for module in entry.pipe.transformer.modules()
              if type(module).__name__ in entry.pipe.transformer._repeated_blocks]
    assert blocks and all(block._compiled_call_impl is not None for block in blocks)
    eager = Engine().generate(PipelineHandle.of(source=handle.source, model_class="LTX2Pipeline"), video)
    torch.testing.assert_close(result.images, eager.images, atol=COMPILED_VS_EAGER_ATOL, rtol=0)
    torch.testing.assert_close(result.audio["waveform"], eager.audio["waveform"], atol=1e-4, rtol=0)


def test_offload_of_a_transformer_without_repeated_blocks_says_what_to_do(tiny):
    """SD3 declares no repeated blocks: auto compiles it whole, which cannot trace offload hooks in one graph."""
    def sd3(fullgraph):
        return PipelineHandle.of(source=tiny("sd3"), model_class="StableDiffusion3Pipeline",
                              mode=ExecutionMode.COMPILED, placement=Placement.MODEL_CPU_OFFLOAD,
                              compile=CompileSpec(fullgraph=fullgraph))

    engine = Engine()
    with pytest.raises(CompileError, match=r"Try: turn fullgraph off, or use placement 'device' \(model CPU "
                                           r"offload hooks cannot be traced"):
        engine.generate(sd3(fullgraph=True), request())
    assert engine.generate(sd3(fullgraph=False), request()).info.compiled_now is True


def test_a_new_process_reuses_the_on_disk_cache(tiny, tmp_path, monkeypatch):
    """This process compiles into a fresh cache folder; a new one, given that folder through
    TPU_DIFFUSERS_COMPILE_CACHE and process_env.apply() before torch (as a TP worker), finds it there."""
    monkeypatch.setenv(process_env.INDUCTOR_CACHE, str(tmp_path / "inductor"))  # inductor reads it per compile
    cold = Engine().generate(flux(tiny), request()).info
    assert cold.compile_cache_lookups["fxgraph_misses"] > 0 and cold.compile_cache_lookups["fxgraph_hits"] == 0

    script = f"""
import json, sys
sys.path.insert(0, {ROOT!r})
import runtime_package
runtime_package.load()
from tpu_diffusers_runtime import process_env
process_env.apply(process_env.default_root())
from tpu_diffusers_runtime.specs import CompileSpec
from tpu_diffusers_runtime.engine import Engine
from tpu_diffusers_runtime.handle import PipelineHandle
from tpu_diffusers_runtime.specs import ExecutionMode
from tpu_diffusers_runtime.tasks import SampleRequest
handle = PipelineHandle.of(source={tiny("flux1-schnell")!r}, model_class="FluxPipeline",
                        mode=ExecutionMode.COMPILED, compile=CompileSpec())
info = Engine().generate(handle, SampleRequest(prompt="a cat sitting on a red chair", width=64, height=64, steps=2,
                                               seed=3)).info
print(json.dumps(info.as_dict()))
"""
    env = {name: value for name, value in os.environ.items()
           if name not in (process_env.INDUCTOR_CACHE, process_env.TPU_TIER3_CACHE, process_env.APPLIED_ENV)}
    env[process_env.COMPILE_CACHE_ENV] = str(tmp_path)
    done = subprocess.run([sys.executable, "-c", script], cwd=ROOT, env=env, capture_output=True, text=True,
                          timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    warm = json.loads(done.stdout.strip().splitlines()[-1])
    assert warm["compile_cache"]["inductor"] == str(tmp_path / "inductor")
    assert warm["compile_cache"]["applied"] == "before torch"
    assert warm["compiled_now"] is True  # dynamo traces again in a new process; inductor's work comes from disk
    assert warm["compile_cache_lookups"]["fxgraph_hits"] > 0, warm["compile_cache_lookups"]
    assert warm["compile_cache_lookups"]["fxgraph_misses"] == 0, warm["compile_cache_lookups"]


def test_a_graph_break_fails_clearly_and_the_pipeline_still_runs_eager(tiny):
    engine = Engine()
    handle = flux(tiny)
    entry = engine.realise(handle)[0]
    hook = entry.pipe.transformer.register_forward_pre_hook(lambda *_: torch._dynamo.graph_break())
    try:
        with pytest.raises(CompileError, match=r"failed: .*Try: set scope to 'repeated_blocks', or turn "
                                               r"fullgraph off"):
            engine.generate(handle, request(80, 64))
    finally:
        hook.remove()
    eager = engine.generate(PipelineHandle.of(source=handle.source, model_class="FluxPipeline"), request(80, 64))
    assert eager.info.compiled_now is None and eager.info.mode == "eager" and not eager.info.loaded
    assert engine.generate(handle, request(80, 64)).info.compiled_now is True  # compiled afresh, not "reused"


def test_hitting_the_recompile_limit_is_said_not_hidden(tiny, monkeypatch):
    """The limit applies to our compiled calls, and torch's own settings are as they were afterwards."""
    monkeypatch.setenv("TPU_DIFFUSERS_RECOMPILE_LIMIT", "1")
    settings_before = dynamo_settings()
    engine = Engine()
    handle = flux(tiny)
    engine.generate(handle, request(64, 64))
    with pytest.raises(CompileError, match="hit torch's recompile limit"):
        engine.generate(handle, request(128, 64))
    assert dynamo_settings() == settings_before


def test_warmup_sizes_are_parsed_or_clearly_refused():
    assert parse_sizes("1024x1024, 768x1344;  512X512") == ((1024, 1024), (768, 1344), (512, 512))
    assert parse_sizes("") == ()
    with pytest.raises(UserInputError, match="warmup size '1024' is not WIDTHxHEIGHT"):
        parse_sizes("1024")


def test_a_denoiser_fullgraph_cannot_trace_whole_compiles_its_blocks_on_the_chip_and_refuses_whole(tiny):
    """Qwen-Image 2.1 (its rotary embedding calls tolist() outside the blocks): scope auto compiles the repeated blocks
    without offload too, and matches eager; scope whole with fullgraph is refused, saying what to use."""
    source = tiny("qwenimage21")

    def compiled(scope):
        return PipelineHandle.of(source=source, model_class="QwenImage21Pipeline", mode=ExecutionMode.COMPILED,
                                 compile=CompileSpec(scope=scope))

    engine = Engine()
    auto = compiled(CompileScope.AUTO)
    result = engine.generate(auto, request())
    assert engine.realise(auto)[0].states["compilation"].scope == "repeated_blocks" and result.info.compiled_now
    eager = Engine().generate(PipelineHandle.of(source=source, model_class="QwenImage21Pipeline"), request())
    torch.testing.assert_close(result.images, eager.images, atol=COMPILED_VS_EAGER_ATOL, rtol=0)
    with pytest.raises(UserInputError, match=r"QwenImage21Transformer2DModel cannot be compiled whole with fullgraph: "
                                             r".*tolist\(\).* Use scope 'repeated_blocks' or 'auto'"):
        Engine().generate(compiled(CompileScope.WHOLE), request())


@pytest.mark.parametrize("name, pipeline_class", [("sd3", "StableDiffusion3Pipeline"), ("flux2", "Flux2Pipeline"),
                                                  ("qwenimage", "QwenImagePipeline"),
                                                  ("flux2-klein", "Flux2KleinPipeline"),
                                                  ("zimage", "ZImagePipeline"),  # a fresh load: prepare_compile
                                                  ("sdxl", "StableDiffusionXLPipeline"),
                                                  ("krea2", "Krea2Pipeline"),
                                                  ("flux3-distilled", "Flux3DistilledModularPipeline")])
def test_the_other_families_compile_whole_and_match_eager(tiny, name, pipeline_class):
    compiled = PipelineHandle.of(source=tiny(name), model_class=pipeline_class, mode=ExecutionMode.COMPILED,
                              compile=CompileSpec())
    result = Engine().generate(compiled, request())
    eager = Engine().generate(PipelineHandle.of(source=tiny(name), model_class=pipeline_class), request())
    assert result.info.compiled_now is True
    torch.testing.assert_close(result.images, eager.images, atol=COMPILED_VS_EAGER_ATOL, rtol=0)


def test_a_changed_compile_option_recompiles_and_unchanged_ones_reuse():
    """Everything in CompileRequest decides the compile; warm-up sizes do not."""
    cpu = device_info("cpu")
    compiled = compilation.CompileState(
        request=compilation.CompileRequest.of(CompileSpec(), Placement.DEVICE, cpu), scope="whole")
    assert compiled.matches(compilation.CompileRequest.of(CompileSpec(warmup_sizes=((64, 64),)),
                                                            Placement.DEVICE, cpu))
    for spec, placement, device in [(CompileSpec(scope="repeated_blocks"), Placement.DEVICE, cpu),
                                    (CompileSpec(fullgraph=False), Placement.DEVICE, cpu),
                                    (CompileSpec(), Placement.MODEL_CPU_OFFLOAD, cpu),
                                    (CompileSpec(), Placement.DEVICE, device_info("tpu"))]:
        assert not compiled.matches(compilation.CompileRequest.of(spec, placement, device))


def test_torch_tpu_cache_statistics_are_reported_on_a_tpu_and_never_fail_a_run(monkeypatch, caplog):
    """torch.tpu._get_cache_stats() is private: its figures join the run info when it works, and are
    left out, with one warning, when it does not."""
    stats = types.SimpleNamespace(num_cache_hits=7, num_cache_reqs=10, num_compilations=3)
    monkeypatch.setattr(torch, "tpu", types.SimpleNamespace(_get_cache_stats=lambda: stats), raising=False)
    tpu = device_info("tpu")
    before = compilation.cache_lookups(tpu)
    assert {name: before[name] for name in ("tpu_hits", "tpu_misses", "tpu_compilations")} == \
        {"tpu_hits": 7, "tpu_misses": 3, "tpu_compilations": 3}
    stats.num_cache_hits, stats.num_cache_reqs = 9, 13
    assert compilation.lookups_since(before, compilation.cache_lookups(tpu))["tpu_misses"] == 1

    def broken():
        raise RuntimeError("renamed")

    monkeypatch.setattr(torch.tpu, "_get_cache_stats", broken)
    compilation._stats_unavailable.cache_clear()
    with caplog.at_level("WARNING", logger="tpu_diffusers"):
        lookups = [compilation.cache_lookups(tpu) for _ in range(2)]
    assert all(set(found) == {"fxgraph_hits", "fxgraph_misses"} for found in lookups)
    assert caplog.text.count("TorchTPU's compile cache statistics are unavailable (RuntimeError: renamed)") == 1
    assert "tpu_hits" not in compilation.lookups_since(before, lookups[0])
