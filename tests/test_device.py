import logging
import os
import subprocess
import sys

from runtime import device

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def test_cpu_row_of_the_device_table():
    info = device.device_info("cpu")
    assert (info.compile_backend, info.process_group_backend, info.default_dtype) == ("inductor", "gloo", "float32")
    assert not info.has_fused_eager
    tpu = device.device_info("tpu")
    assert (tpu.compile_backend, tpu.process_group_backend, tpu.default_dtype) == ("tpu", "tpu_dist", "bfloat16")


def test_detects_cpu_here_and_says_why_tpu_was_not_used(caplog):
    device.detect_device.cache_clear()
    with caplog.at_level(logging.INFO, logger="tpu_diffusers"):
        info = device.detect_device()
    assert info.type == "cpu"
    assert "torch_tpu is installed but no TPU chip is usable (no TPU on the PCI bus); falling back to cpu" in caplog.text


def test_asking_for_an_absent_device_is_a_clear_error():
    import pytest

    from runtime.errors import UserInputError

    with pytest.raises(UserInputError, match="device 'tpu' was asked for but this machine has cpu"):
        device.resolve_device("tpu")
    assert device.resolve_device("cpu").type == "cpu"


def test_metadata_server_query_is_skipped_without_a_tpu(monkeypatch):
    monkeypatch.delenv("TPU_SKIP_MDS_QUERY", raising=False)
    device.prepare_tpu_environment()
    assert os.environ["TPU_SKIP_MDS_QUERY"] == "1"
    monkeypatch.setenv("TPU_SKIP_MDS_QUERY", "0")  # a user's own choice is kept
    device.prepare_tpu_environment()
    assert os.environ["TPU_SKIP_MDS_QUERY"] == "0"


def test_with_torch_tpu_installed_and_no_chip_autograd_does_not_hang():
    """As inside ComfyUI: torch is imported first, then the pack. Without the pack's env hygiene
    the first backward starts libtpu, which retries the metadata server for ~640 s."""
    script = (
        "import torch, runtime, os\n"
        "assert os.environ['TPU_SKIP_MDS_QUERY'] == '1'\n"
        "x = torch.ones(3, requires_grad=True); (x * x).sum().backward()\n"
        "print('backward ok')\n"
    )
    env = {k: v for k, v in os.environ.items() if k != "TPU_SKIP_MDS_QUERY"}
    result = subprocess.run([sys.executable, "-c", script], cwd=ROOT, env=env, capture_output=True, text=True,
                            timeout=180)
    assert result.returncode == 0, result.stderr[-2000:]
    assert "backward ok" in result.stdout
