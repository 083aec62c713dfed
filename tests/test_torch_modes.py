"""Which torch modes wrap a run: inference mode off and autograd off on every device (ComfyUI runs
nodes under torch.inference_mode(), where TorchTPU cannot compile), and TorchTPU's experimental
set_eager_mode only around eager runs, never around compiled ones."""

import contextlib
import enum
import logging
import types

import pytest
import torch
from diffusers import FluxTransformer2DModel

from tpu_diffusers_runtime import device as device_module
from tpu_diffusers_runtime.specs import CompileSpec
from tpu_diffusers_runtime.engine import Engine
from tpu_diffusers_runtime.handle import PipelineHandle
from tpu_diffusers_runtime.modes import execution_mode
from tpu_diffusers_runtime.specs import ExecutionMode, Placement
from tpu_diffusers_runtime.tasks import SampleRequest

OUTSIDE_INFERENCE_MODE = "inference mode off, grad off"


@pytest.mark.parametrize("mode, placement, scope, compiled_scope", [
    (ExecutionMode.EAGER, Placement.DEVICE, None, None),
    (ExecutionMode.EAGER, Placement.MODEL_CPU_OFFLOAD, None, None),
    (ExecutionMode.COMPILED, Placement.DEVICE, "whole", "whole"),
    (ExecutionMode.COMPILED, Placement.MODEL_CPU_OFFLOAD, "auto", "repeated_blocks"),
], ids=["eager", "offload", "compiled-whole", "compiled-repeated-blocks-offload"])
def test_inside_comfyuis_inference_mode_the_transformer_runs_outside_it(tiny, monkeypatch, mode, placement,
                                                                        scope, compiled_scope):
    """The transformer's calls are observed from outside any compiled code (a forward pre-hook would be
    traced into the whole-compiled graph), so each records the state the compiled call was entered in."""
    seen = []
    call = FluxTransformer2DModel.__call__

    def observed_call(self, *args, **kwargs):
        seen.append((torch.is_inference_mode_enabled(), torch.is_grad_enabled()))
        return call(self, *args, **kwargs)

    monkeypatch.setattr(FluxTransformer2DModel, "__call__", observed_call)
    handle = PipelineHandle.of(source=tiny("flux1-schnell"), model_class="FluxPipeline", mode=mode,
                            placement=placement, compile=scope and CompileSpec(scope=scope))
    engine = Engine()
    with torch.inference_mode():  # as ComfyUI runs every node
        info = engine.generate(handle, SampleRequest(prompt="a cat", width=64, height=64, steps=1)).info

    assert seen and set(seen) == {(False, False)}
    assert info.grad_mode == OUTSIDE_INFERENCE_MODE
    entry = engine.realise(handle)[0]
    compiled = entry.states.get("compilation")
    assert (compiled and compiled.scope) == compiled_scope
    if compiled_scope:
        assert info.compiled_now is True
    parameters = [p for module in entry.pipe.components.values() if isinstance(module, torch.nn.Module)
                  for p in module.parameters()]
    assert parameters and not any(p.is_inference() for p in parameters)


class FakeEagerMode(enum.Enum):
    DEFER_NEVER = 0
    DEFER_AND_FUSE = 1


@pytest.fixture
def fake_torch_tpu(monkeypatch):
    """A torch.tpu namespace that records which eager modes were entered (no chip needed)."""
    entered = []

    @contextlib.contextmanager
    def set_eager_mode(mode):
        entered.append(mode)
        yield

    monkeypatch.setattr(torch, "tpu", types.SimpleNamespace(EagerMode=FakeEagerMode, set_eager_mode=set_eager_mode),
                        raising=False)
    device_module.note_experimental.cache_clear()
    return entered


def test_compiled_mode_never_enters_set_eager_mode_on_a_tpu(fake_torch_tpu):
    with execution_mode(ExecutionMode.COMPILED, device_module.device_info("tpu")) as ran:
        assert fake_torch_tpu == []
    assert ran == "compiled (backend tpu)" and fake_torch_tpu == []


def test_eager_modes_enter_set_eager_mode_and_say_once_that_it_is_experimental(fake_torch_tpu, caplog):
    tpu = device_module.device_info("tpu")
    with caplog.at_level(logging.INFO, logger="tpu_diffusers"):
        for mode in (ExecutionMode.EAGER, ExecutionMode.FUSED_EAGER, ExecutionMode.EAGER):
            with execution_mode(mode, tpu):
                pass
    assert fake_torch_tpu == [FakeEagerMode.DEFER_NEVER, FakeEagerMode.DEFER_AND_FUSE, FakeEagerMode.DEFER_NEVER]
    assert caplog.text.count("torch.tpu.set_eager_mode is experimental in torch_tpu 0.2.0") == 1
    assert "never compiled ones" in caplog.text
