"""Device memory (docs/memory.md): an out-of-memory error in a run frees what the pack holds and says what
to try; ComfyUI making room moves our idle pipelines to host memory, and the next run moves them back.

On CPU. The out-of-memory errors are the devices' own exception types, raised inside the transformer's
forward by a forward pre-hook, through a real Engine and tiny real pipelines. The ComfyUI side runs against
the real comfy.model_management of the ComfyUI the e2e tests serve (0.3.75, --cpu), with the pipelines on
cpu standing in for CUDA's: `share_device(..., "cpu")` is the one thing injected (on a real host it is only
installed for cuda). What a CPU cannot show: VRAM actually freed and copied back (docs/memory.md).
"""

import gc
import importlib.util
import sys
import weakref

import pytest
import torch

from comfy_host import ROOT, prepare_comfyui
from tpu_diffusers_runtime.device import is_out_of_memory
from tpu_diffusers_runtime.engine import Engine
from tpu_diffusers_runtime.errors import DeviceOutOfMemoryError, from_wire
from tpu_diffusers_runtime.handle import PipelineHandle
from tpu_diffusers_runtime.loading import inspect_source
from tpu_diffusers_runtime.specs import ExecutionMode, Placement
from tpu_diffusers_runtime.tasks import SampleRequest

CUDA_OOM = "CUDA out of memory. Tried to allocate 20.00 GiB. GPU 0 has a total capacity of 79.25 GiB"
# XLA's PjRt wording for an HBM allocation that does not fit, as TorchTPU's RuntimeError carries it
TPU_OOM = ("RESOURCE_EXHAUSTED: Error allocating device buffer: Attempting to allocate 20.00G. That was not "
           "possible. There are 3.10G free.")
DEVICE_ERRORS = {"cuda": lambda: torch.OutOfMemoryError(CUDA_OOM), "tpu": lambda: RuntimeError(TPU_OOM)}
MOVED_BACK = "moved back to cpu from host memory (ComfyUI needed the VRAM)"


def request(**overrides):
    values = dict(prompt="a cat sitting on a red chair", width=64, height=64, steps=2, guidance=3.5, seed=7)
    return SampleRequest(**{**values, **overrides})


@pytest.fixture
def flux(tiny):
    def make(**fields):
        source = tiny("flux1-schnell")
        return PipelineHandle.of(source=source, model_class=inspect_source(source), **fields)
    return make


def fail_in_transformer(engine: Engine, handle: PipelineHandle, error) -> None:
    """The loaded pipeline's transformer raises `error()` when it next runs, as the device would."""
    def forward_pre_hook(module, args):
        raise error()

    engine.realise(handle)[0].pipe.transformer.register_forward_pre_hook(forward_pre_hook)


def loaded_pipe(engine: Engine, handle: PipelineHandle) -> weakref.ref:
    return weakref.ref(engine.realise(handle)[0].pipe)


@pytest.mark.parametrize("error, expected", [
    (torch.OutOfMemoryError(CUDA_OOM), True),
    (torch.cuda.OutOfMemoryError(CUDA_OOM), True),
    (RuntimeError(TPU_OOM), True),
    (RuntimeError("the TPU ran out of memory while awaiting the materialization of value 12"), True),
    (RuntimeError("mat1 and mat2 shapes cannot be multiplied (2x3 and 4x5)"), False),
    (MemoryError(), False),  # host memory: not the device's
])
def test_device_out_of_memory_errors_are_told_from_others(error, expected):
    assert is_out_of_memory(error) is expected


@pytest.mark.parametrize("placement", list(Placement))
@pytest.mark.parametrize("device", sorted(DEVICE_ERRORS))
def test_out_of_memory_in_a_run_frees_the_pipeline_says_what_to_try_and_the_next_run_works(flux, device, placement):
    engine = Engine()
    handle = flux(placement=placement)
    before = engine.generate(handle, request(batch_size=2))
    pipe = loaded_pipe(engine, handle)
    fail_in_transformer(engine, handle, DEVICE_ERRORS[device])

    with pytest.raises(DeviceOutOfMemoryError) as failed:
        engine.generate(handle, request(batch_size=2, width=96))
    message = str(failed.value)
    assert isinstance(failed.value.__cause__, torch.OutOfMemoryError if device == "cuda" else RuntimeError)
    assert message.startswith(f"cpu ran out of memory running FluxPipeline with placement '{placement}', "
                              f"batch 2 at 96x64 ({(CUDA_OOM if device == 'cuda' else TPU_OOM)}).")
    assert "TPU Diffusers freed its loaded pipelines: the next run loads the model again." in message
    assert ("model CPU offload (the Mode Selector's placement 'model_cpu_offload'" in message) is (
        placement is Placement.DEVICE)
    assert "a smaller batch_size (it was 2) or image size" in message
    assert "or a TP Mesh (placement 'device'), which shards the model over several chips." in message
    assert len(engine.cache) == 0
    gc.collect()
    assert pipe() is None, "the failed run's pipeline is still referenced: its memory would not be freed"

    after = engine.generate(handle, request(batch_size=2))
    assert after.info.loaded is True
    assert torch.equal(after.images, before.images)


def test_an_error_that_is_not_out_of_memory_keeps_the_pipeline(flux):
    engine = Engine()
    handle = flux()
    engine.generate(handle, request())
    fail_in_transformer(engine, handle, lambda: RuntimeError("mat1 and mat2 shapes cannot be multiplied"))
    with pytest.raises(RuntimeError, match="mat1 and mat2"):
        engine.generate(handle, request())
    assert len(engine.cache) == 1


def test_out_of_memory_on_every_worker_rank_reaches_comfyui_as_the_same_error():
    error = from_wire("DeviceOutOfMemoryError", "tpu ran out of memory running FluxPipeline ...")
    assert type(error) is DeviceOutOfMemoryError and str(error).startswith("tpu ran out of memory")


# --- against the real comfy.model_management


@pytest.fixture(scope="module")
def comfy():
    """ComfyUI's model_management (and model_patcher), imported as ComfyUI --cpu does."""
    sys.path.append(str(prepare_comfyui()))
    from comfy.cli_args import args

    args.cpu = True
    import comfy.model_management
    import comfy.model_patcher

    assert comfy.model_management.get_torch_device() == torch.device("cpu")
    return comfy


@pytest.fixture
def shared(comfy, monkeypatch):
    """A fresh engine whose cpu pipelines ComfyUI's free_memory covers (ComfyUI's functions restored after)."""
    model_management = comfy.model_management
    monkeypatch.setattr(model_management, "free_memory", model_management.free_memory)
    engine = Engine()
    comfy_memory().share_device(model_management, engine.cache, "cpu")
    return engine, model_management


def comfy_memory():
    """nodes/comfy_memory.py alone: the nodes package's __init__ needs a running ComfyUI server."""
    spec = importlib.util.spec_from_file_location("comfy_memory", ROOT / "nodes" / "comfy_memory.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def comfy_model(comfy):
    """One of ComfyUI's own models, loaded the way its nodes load them (in its loaded-model list)."""
    patcher = comfy.model_patcher.ModelPatcher(torch.nn.Linear(8, 8), load_device=torch.device("cpu"),
                                               offload_device=torch.device("cpu"))
    comfy.model_management.load_models_gpu([patcher])
    assert patcher in comfy.model_management.loaded_models()
    return patcher


def test_comfyui_needing_the_memory_moves_our_pipeline_to_host_and_the_next_run_moves_it_back(shared, flux):
    engine, model_management = shared
    handle = flux()
    first = engine.generate(handle, request())
    cpu = torch.device("cpu")

    model_management.free_memory(2**20, cpu)  # what is free covers it: ComfyUI needs nothing of ours
    assert MOVED_BACK not in engine.generate(handle, request()).info.notes

    model_management.free_memory(model_management.get_free_memory(cpu) * 2, cpu)  # more than is free
    moved = engine.generate(handle, request())
    assert moved.info.loaded is False and MOVED_BACK in moved.info.notes
    assert torch.equal(moved.images, first.images)
    assert MOVED_BACK not in engine.generate(handle, request()).info.notes  # back on the device, once

    model_management.unload_all_models()  # ComfyUI's out-of-memory recovery, or another pack's routine call
    again = engine.generate(handle, request())
    assert again.info.loaded is False and MOVED_BACK in again.info.notes  # a copy back, not a load from disk
    assert engine.cache.stats.loads == 1


def test_comfyui_making_room_during_our_run_leaves_its_pipeline_alone(shared, flux):
    """ComfyUI calls free_memory on the thread our Sampler runs on; a call from inside the run (here from the
    progress callback, between steps) must neither wait for the run nor move its pipeline."""
    engine, model_management = shared
    handle = flux()
    engine.generate(handle, request())
    calls = []

    def on_progress(done, total, what, *preview):
        if what == "sampling" and not calls:
            calls.append(model_management.unload_all_models())

    during = engine.generate(handle, request(steps=3), on_progress=on_progress)
    assert calls and MOVED_BACK not in during.info.notes
    assert MOVED_BACK not in engine.generate(handle, request()).info.notes


def test_a_pipeline_under_model_cpu_offload_stays_as_it_is(shared, flux):
    """Its weights are on the host between runs already: nothing to move back."""
    engine, model_management = shared
    handle = flux(placement=Placement.MODEL_CPU_OFFLOAD)
    first = engine.generate(handle, request())
    model_management.unload_all_models()
    after = engine.generate(handle, request())
    assert MOVED_BACK not in after.info.notes and after.info.loaded is False
    assert torch.equal(after.images, first.images)


def test_our_out_of_memory_error_also_frees_comfyuis_models_as_its_own_recovery_would(shared, comfy, flux):
    """Our DeviceOutOfMemoryError is not a torch.OutOfMemoryError, so ComfyUI's execution does not run its
    recovery (unload_all_models) for it: the pack asks for it itself."""
    engine, model_management = shared
    handle = flux()
    engine.generate(handle, request())
    theirs = comfy_model(comfy)
    fail_in_transformer(engine, handle, DEVICE_ERRORS["cuda"])
    with pytest.raises(DeviceOutOfMemoryError):
        engine.generate(handle, request())
    assert theirs not in model_management.loaded_models()
    assert engine.generate(handle, request()).info.loaded is True


def test_moving_back_asks_comfyui_for_the_room(shared, comfy, flux, monkeypatch):
    """With --disable-smart-memory ComfyUI frees all its idle models whenever it is asked for room, which
    shows on cpu that the move back asked (with smart memory it frees only what is short)."""
    engine, model_management = shared
    handle = flux()
    engine.generate(handle, request())
    model_management.unload_all_models()
    theirs = comfy_model(comfy)
    monkeypatch.setattr(model_management, "DISABLE_SMART_MEMORY", True)
    assert MOVED_BACK in engine.generate(handle, request()).info.notes
    assert theirs not in model_management.loaded_models()


def test_a_compiled_transformer_keeps_its_graphs_after_the_move_back(shared, flux):
    engine, model_management = shared
    handle = flux(mode=ExecutionMode.COMPILED)
    first = engine.generate(handle, request())
    assert first.info.compiled_now is True
    model_management.unload_all_models()
    after = engine.generate(handle, request())
    assert MOVED_BACK in after.info.notes and after.info.compiled_now is False
    assert torch.allclose(after.images, first.images)
