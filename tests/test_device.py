import json
import logging
import os
import subprocess
import sys

import pytest
import torch

from tpu_diffusers_runtime import device
from tpu_diffusers_runtime.handle import PipelineHandle
from tpu_diffusers_runtime.loading import load_pipeline

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
@pytest.mark.parametrize("row_dtype, loaded_dtype", [(None, torch.float32), ("bfloat16", torch.bfloat16)])
def test_the_device_table_row_decides_the_dtype_an_auto_pipeline_loads_in(tiny, monkeypatch, row_dtype,
                                                                            loaded_dtype):
    """None: the shipped cpu row (README: "auto" is float32 on CPU); else the row changed to that dtype."""
    if row_dtype:
        monkeypatch.setitem(device._DEVICE_TABLE, "cpu", {**device._DEVICE_TABLE["cpu"], "default_dtype": row_dtype})
    handle = PipelineHandle.of(source=tiny("flux1-schnell"), model_class="FluxPipeline", dtype="auto")
    pipe = load_pipeline(handle, device.device_info("cpu"))
    assert {p.dtype for p in pipe.transformer.parameters()} == {loaded_dtype}


@pytest.fixture
def fresh_detection():
    """detect_device() is cached for the process: detect anew here, and leave no result of this test behind."""
    device.detect_device.cache_clear()
    yield device.detect_device
    device.detect_device.cache_clear()


@pytest.mark.parametrize("on_pci_bus, autoload, why", [
    (False, None, "no TPU on the PCI bus"),
    (True, "0", "TORCH_DEVICE_BACKEND_AUTOLOAD=0 kept torch from loading torch_tpu; unset it"),
    (True, None, "a TPU is on the PCI bus but TorchTPU did not register it"),
])
def test_with_torch_tpu_and_no_usable_chip_the_log_says_why_and_falls_back(caplog, monkeypatch, fresh_detection,
                                                                         on_pci_bus, autoload, why, torch_tpu):
    monkeypatch.setattr(torch.accelerator, "current_accelerator", lambda check_available=False: None)
    monkeypatch.setattr(device, "tpu_on_pci_bus", lambda: on_pci_bus)
    if autoload is None:
        monkeypatch.delenv("TORCH_DEVICE_BACKEND_AUTOLOAD", raising=False)
    else:
        monkeypatch.setenv("TORCH_DEVICE_BACKEND_AUTOLOAD", autoload)
    with caplog.at_level(logging.INFO, logger="tpu_diffusers"):
        info = fresh_detection()
    assert info.type == "cpu"
    assert f"torch_tpu is installed but no TPU chip is usable ({why}" in caplog.text
    assert caplog.text.rstrip().endswith("falling back to cpu.")


def test_asking_for_an_absent_device_is_a_clear_error():
    from tpu_diffusers_runtime.errors import UserInputError

    with pytest.raises(UserInputError, match="device 'tpu' was asked for but this machine has cpu"):
        device.resolve_device("tpu")
    assert device.resolve_device("cpu").type == "cpu"


def test_metadata_server_query_is_skipped_only_without_a_tpu(monkeypatch):
    monkeypatch.delenv("TPU_SKIP_MDS_QUERY", raising=False)
    monkeypatch.setattr(device, "tpu_on_pci_bus", lambda: True)
    device.prepare_tpu_environment()
    assert "TPU_SKIP_MDS_QUERY" not in os.environ  # a TPU host needs the metadata server
    monkeypatch.setattr(device, "tpu_on_pci_bus", lambda: False)
    device.prepare_tpu_environment()
    assert os.environ["TPU_SKIP_MDS_QUERY"] == "1"
    monkeypatch.setenv("TPU_SKIP_MDS_QUERY", "0")  # a user's own choice is kept
    device.prepare_tpu_environment()
    assert os.environ["TPU_SKIP_MDS_QUERY"] == "0"


@pytest.mark.process
def test_with_torch_tpu_installed_and_no_chip_autograd_does_not_hang(torch_tpu):
    """As inside ComfyUI: torch is imported first, then the pack. Without the pack's env hygiene
    the first backward starts libtpu, which retries the metadata server for ~640 s."""
    if device.tpu_on_pci_bus():
        pytest.skip("this host has a TPU: the hang this guards against needs a host without one")
    script = (
        "import torch, os, runtime_package\n"
        "runtime_package.load()\n"
        "assert os.environ['TPU_SKIP_MDS_QUERY'] == '1'\n"
        "x = torch.ones(3, requires_grad=True); (x * x).sum().backward()\n"
        "print('backward ok')\n"
    )
    env = {k: v for k, v in os.environ.items() if k != "TPU_SKIP_MDS_QUERY"}
    result = subprocess.run([sys.executable, "-c", script], cwd=ROOT, env=env, capture_output=True, text=True,
                            timeout=180)
    assert result.returncode == 0, result.stderr[-2000:]
    assert "backward ok" in result.stdout


KEEP_OUT = '''
import json, os, sys
sys.path.insert(0, {pack!r})
import runtime_package
runtime_package.load()
from tpu_diffusers_runtime import device, process_env
device.tpu_chip_count = lambda: 4  # this host has no TPU: the PCI scan's answer is what is given here
process_env.keep_tpu_out_of_comfyui()  # what the prestartup script does, before torch
import torch
from tpu_diffusers_runtime.distributed.mesh import local_chips
info = device.detect_device()
print(json.dumps({{"torch_tpu_loaded": "torch_tpu" in sys.modules, "device": info.type, "reason": info.reason,
                  "chips": local_chips(info) if info.type == "tpu" else None,
                  "autoload": os.environ.get("TORCH_DEVICE_BACKEND_AUTOLOAD"),
                  "workers_get": device.worker_environment(os.environ).get("TORCH_DEVICE_BACKEND_AUTOLOAD", "unset")}}))
'''


@pytest.mark.parametrize("setting, users_autoload", [("tpu", None), ("always", "1"), ("never", None)])
def test_comfyuis_process_keeps_torch_tpu_out_when_runs_go_to_workers(torch_tpu, setting, users_autoload):
    """With a TPU on the bus, ComfyUI's process never loads TorchTPU (so it never opens the chips), still
    knows the device and its chips, and the workers get the user's own autoload setting back."""
    env = {k: v for k, v in os.environ.items() if k != "TORCH_DEVICE_BACKEND_AUTOLOAD"}
    env.update({"TPU_DIFFUSERS_WORKER_PROCESS": setting, "TPU_SKIP_MDS_QUERY": "1"})
    if users_autoload:
        env["TORCH_DEVICE_BACKEND_AUTOLOAD"] = users_autoload
    done = subprocess.run([sys.executable, "-c", KEEP_OUT.format(pack=ROOT)], env=env, capture_output=True,
                          text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    seen = json.loads(done.stdout.strip().splitlines()[-1])
    if setting == "never":
        assert seen["torch_tpu_loaded"] and seen["autoload"] != "0"  # as before: TorchTPU loads with torch
        return
    assert not seen["torch_tpu_loaded"] and seen["autoload"] == "0"
    assert seen["device"] == "tpu" and seen["chips"] == 4 and "worker processes" in seen["reason"]
    assert seen["workers_get"] == (users_autoload or "unset")


def test_an_op_the_device_lacks_is_named_with_what_to_do_and_the_pipeline_still_runs(tiny, monkeypatch):
    """TorchTPU 0.2.0 raises "'<op>' is not implemented for TPU. Please file a feature request" for an op it has
    no kernel for (its SDXL smoke test: upsample_nearest2d.out). Raised here where diffusers upsamples (Upsample2D:
    the UNet's up blocks and the VAE decoder)."""
    import diffusers.models.upsampling as upsampling

    from tpu_diffusers_runtime.engine import Engine
    from tpu_diffusers_runtime.errors import MissingDeviceOpError
    from tpu_diffusers_runtime.tasks import SampleRequest

    def no_kernel(*_args, **_kwargs):
        raise NotImplementedError("Operator 'aten::upsample_nearest2d.out' is not implemented for TPU. Please file a "
                                  "feature request")

    engine = Engine(distribute=False)
    handle = PipelineHandle.of(source=tiny("sdxl"), model_class="StableDiffusionXLPipeline")
    request = SampleRequest(prompt="a cat", width=64, height=64, steps=1, seed=1)
    with monkeypatch.context() as patched:
        patched.setattr(upsampling.Upsample2D, "forward", no_kernel)
        with pytest.raises(MissingDeviceOpError, match=r"has no kernel for the op aten::upsample_nearest2d.out, "
                                                       r"which StableDiffusionXLPipeline runs .*'cuda' or 'cpu'"):
            engine.generate(handle, request)
    assert torch.isfinite(engine.generate(handle, request).images).all()  # nothing was left broken
