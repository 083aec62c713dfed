"""Compiled mode on CPU (inductor). Compiles cost tens of seconds here, so the tests are few and
share compiled graphs where they can. Counts come from dynamo's counters, never from timers."""

import json
import os
import subprocess
import sys

import pytest
import torch

from runtime import compile_cache
from runtime.compile_cache import CompileError, CompileSpec, parse_sizes
from runtime.engine import Engine
from runtime.errors import UserInputError
from runtime.handle import PipelineHandle
from runtime.modes import ExecutionMode, Placement
from runtime.sampling import SampleRequest

# inductor reorders float32 reductions; images agree to a few 1e-4 on these tiny random models
COMPILED_VS_EAGER_ATOL = 2e-3


@pytest.fixture(scope="module")
def cache_dir(tmp_path_factory):
    return str(tmp_path_factory.mktemp("compile-cache"))


def flux(tiny, cache_dir, **fields):
    spec = CompileSpec(cache_dir=cache_dir, **fields.pop("spec", {}))
    return PipelineHandle(source=tiny("flux1-schnell"), pipeline_class="FluxPipeline", mode=ExecutionMode.COMPILED,
                          compile=spec, **fields)


def request(width=64, height=64, steps=2, seed=3):
    return SampleRequest(prompt="a cat sitting on a red chair", width=width, height=height, steps=steps, seed=seed)


def test_each_shape_compiles_once_warmup_compiles_ahead_and_matches_eager(tiny, cache_dir):
    """Shapes are the transformer's: FLUX packs latents to (h/16)*(w/16) tokens, so sizes with the same
    token count (96x64 and 64x96) share one graph; 112x64 is new."""
    engine = Engine()
    handle = flux(tiny, cache_dir, spec=dict(warmup_sizes=((96, 64),)))
    first = engine.generate(handle, request())
    assert first.info.compiled_now is True
    assert any(n.startswith("warm-up: compiled now for 96x64") for n in first.info.notes)

    runs = {"same size": request(seed=4), "other steps": request(steps=3), "warmed size": request(96, 64),
            "new size": request(112, 64), "back to a seen size": request(seed=5)}
    compiled_now = {name: engine.generate(handle, r).info.compiled_now for name, r in runs.items()}
    assert compiled_now == {"same size": False, "other steps": False, "warmed size": False,
                            "new size": True, "back to a seen size": False}

    state = engine.realise(handle)[0].compiled
    assert state.scope == "whole" and state.backend == "inductor"
    assert {shape: record.compiles for shape, record in state.shapes.items()} == \
        {(96, 64, 1): 1, (64, 64, 1): 1, (112, 64, 1): 1}
    assert state.shapes[(64, 64, 1)].reuses == 3 and state.shapes[(64, 64, 1)].compile_seconds > 0

    eager = Engine().generate(PipelineHandle(source=handle.source, pipeline_class="FluxPipeline"), request())
    torch.testing.assert_close(first.images, eager.images, atol=COMPILED_VS_EAGER_ATOL, rtol=0)


@pytest.mark.parametrize("name, pipeline_class", [("flux1-schnell", "FluxPipeline"), ("flux2", "Flux2Pipeline"),
                                                  ("qwenimage", "QwenImagePipeline")])
def test_model_offload_with_auto_scope_compiles_the_repeated_blocks(tiny, cache_dir, name, pipeline_class):
    engine = Engine()
    handle = PipelineHandle(source=tiny(name), pipeline_class=pipeline_class, mode=ExecutionMode.COMPILED,
                            placement=Placement.MODEL_CPU_OFFLOAD, compile=CompileSpec(cache_dir=cache_dir))
    result = engine.generate(handle, request())
    entry = engine.realise(handle)[0]
    assert entry.compiled.scope == "repeated_blocks" and entry.compiled.shapes[(64, 64, 1)].compiles == 1
    transformer = entry.pipe.transformer
    assert transformer._compiled_call_impl is None  # the offload hooks around it stay eager
    assert all(block._compiled_call_impl is not None for block in transformer.transformer_blocks)
    eager = Engine().generate(PipelineHandle(source=handle.source, pipeline_class=pipeline_class), request())
    torch.testing.assert_close(result.images, eager.images, atol=COMPILED_VS_EAGER_ATOL, rtol=0)


def test_offload_of_a_transformer_without_repeated_blocks_says_what_to_do(tiny, cache_dir):
    """SD3 declares no repeated blocks: auto compiles it whole, which cannot trace offload hooks in one graph."""
    def sd3(fullgraph):
        return PipelineHandle(source=tiny("sd3"), pipeline_class="StableDiffusion3Pipeline",
                              mode=ExecutionMode.COMPILED, placement=Placement.MODEL_CPU_OFFLOAD,
                              compile=CompileSpec(cache_dir=cache_dir, fullgraph=fullgraph))

    engine = Engine()
    with pytest.raises(CompileError, match=r"Try: turn fullgraph off, or use placement 'device' \(model CPU "
                                           r"offload hooks cannot be traced"):
        engine.generate(sd3(fullgraph=True), request())
    assert engine.generate(sd3(fullgraph=False), request()).info.compiled_now is True


def test_a_new_process_reuses_the_on_disk_cache(tiny, cache_dir):
    """The first test compiled 64x64 into cache_dir; a fresh interpreter must find it there."""
    script = f"""
import json, sys
sys.path.insert(0, {str(os.getcwd())!r})
from torch._dynamo.utils import counters
from runtime.compile_cache import CompileSpec
from runtime.engine import Engine
from runtime.handle import PipelineHandle
from runtime.modes import ExecutionMode
from runtime.sampling import SampleRequest
handle = PipelineHandle(source={tiny("flux1-schnell")!r}, pipeline_class="FluxPipeline",
                        mode=ExecutionMode.COMPILED, compile=CompileSpec(cache_dir={cache_dir!r}))
Engine().generate(handle, SampleRequest(prompt="a cat sitting on a red chair", width=64, height=64, steps=2, seed=3))
print(json.dumps(dict(counters["inductor"])))
"""
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    done = subprocess.run([sys.executable, "-c", script], cwd=root, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    inductor = json.loads(done.stdout.strip().splitlines()[-1])
    assert inductor.get("fxgraph_cache_hit", 0) > 0, inductor


def test_a_graph_break_fails_clearly_and_the_pipeline_still_runs_eager(tiny, cache_dir):
    engine = Engine()
    handle = flux(tiny, cache_dir)
    entry = engine.realise(handle)[0]
    hook = entry.pipe.transformer.register_forward_pre_hook(lambda *_: torch._dynamo.graph_break())
    try:
        with pytest.raises(CompileError, match=r"failed: .*Try: set scope to 'repeated_blocks', or turn "
                                               r"fullgraph off"):
            engine.generate(handle, request(80, 64))
    finally:
        hook.remove()
    eager = engine.generate(PipelineHandle(source=handle.source, pipeline_class="FluxPipeline"), request(80, 64))
    assert eager.info.compiled_now is None and eager.info.mode == "eager" and not eager.info.loaded
    assert engine.generate(handle, request(80, 64)).info.compiled_now is True  # compiled afresh, not "reused"


def test_hitting_the_recompile_limit_is_said_not_hidden(tiny, cache_dir, monkeypatch):
    monkeypatch.setattr(compile_cache, "RECOMPILE_LIMIT", 1)
    for name in ("recompile_limit", "fail_on_recompile_limit_hit"):
        monkeypatch.setattr(torch._dynamo.config, name, getattr(torch._dynamo.config, name))
    engine = Engine()
    handle = flux(tiny, cache_dir)
    engine.generate(handle, request(64, 64))
    with pytest.raises(CompileError, match="hit torch's recompile limit"):
        engine.generate(handle, request(128, 64))


def test_warmup_sizes_are_parsed_or_clearly_refused():
    assert parse_sizes("1024x1024, 768x1344;  512X512") == ((1024, 1024), (768, 1344), (512, 512))
    assert parse_sizes("") == ()
    with pytest.raises(UserInputError, match="warmup size '1024' is not WIDTHxHEIGHT"):
        parse_sizes("1024")


@pytest.mark.parametrize("name, pipeline_class", [("sd3", "StableDiffusion3Pipeline"), ("flux2", "Flux2Pipeline"),
                                                  ("qwenimage", "QwenImagePipeline")])
def test_the_other_families_compile_whole_and_match_eager(tiny, cache_dir, name, pipeline_class):
    compiled = PipelineHandle(source=tiny(name), pipeline_class=pipeline_class, mode=ExecutionMode.COMPILED,
                              compile=CompileSpec(cache_dir=cache_dir))
    result = Engine().generate(compiled, request())
    eager = Engine().generate(PipelineHandle(source=tiny(name), pipeline_class=pipeline_class), request())
    assert result.info.compiled_now is True
    torch.testing.assert_close(result.images, eager.images, atol=COMPILED_VS_EAGER_ATOL, rtol=0)
