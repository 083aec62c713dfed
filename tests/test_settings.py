"""The pack's environment variables: read when used, a bad value named in the error, never an import failure."""

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from processes import launched_workers

from tpu_diffusers_runtime import settings
from tpu_diffusers_runtime.device import device_info
from tpu_diffusers_runtime.distributed import channel
from tpu_diffusers_runtime.distributed.mesh import check_mesh
from tpu_diffusers_runtime.specs import MeshSpec, Workers
from tpu_diffusers_runtime.engine import Engine
from tpu_diffusers_runtime.errors import SettingError
from tpu_diffusers_runtime.handle import PipelineHandle
from tpu_diffusers_runtime.tasks import SampleRequest

ROOT = Path(__file__).resolve().parent.parent

BAD_VALUES = {
    "TPU_DIFFUSERS_LAUNCH_TIMEOUT": ("10m", "a number of seconds above 0, without a unit"),
    "TPU_DIFFUSERS_WORKER_SILENCE_TIMEOUT": ("-5", "a number of seconds above 0"),
    "TPU_DIFFUSERS_CONTROL_KEY": ("0123abcd", "the control key has 8 hex digits; it must be 64"),
    "TPU_DIFFUSERS_ATTACH_ALLOW": ("10.0.0.2:port", "'10.0.0.2:port' is not host:port or host"),
    "TPU_DIFFUSERS_RECOMPILE_LIMIT": ("lots", "a whole number of at least 1"),
    "TPU_DIFFUSERS_COMPILE_CACHE": ("s3://bucket/cache", "a local folder or a gs:// location"),
    "TPU_DIFFUSERS_XLA_OPTIMIZATION_LEVEL": ("fast", "one of O0, O1, O2, O3"),
    "TPU_DIFFUSERS_WORKER_PROCESS": ("sometimes", "one of tpu, always, never"),
    "TPU_DIFFUSERS_DOWNLOADS": ("no", "one of allow, forbid"),
    "TPU_DIFFUSERS_MEMORY_PLAN": ("ignore", "one of refuse, warn"),
    "TPU_DIFFUSERS_PIPELINE_KIND": ("auto", "one of classic, modular"),
}


def test_every_variable_has_a_bad_value_tested_here():
    assert set(BAD_VALUES) == set(settings.SETTINGS)


@pytest.mark.parametrize("name", BAD_VALUES)
def test_a_bad_value_fails_when_read_and_the_error_names_the_variable_and_the_value(monkeypatch, name):
    value, reason = BAD_VALUES[name]
    monkeypatch.setenv(name, value)
    with pytest.raises(SettingError, match=re.escape(reason)) as raised:
        settings.get(name)
    message = str(raised.value)
    assert message.startswith(f"environment variable {name} ")
    if settings.SETTINGS[name].secret:
        assert value not in message and "value not shown" in message
    else:
        assert repr(value) in message


@pytest.mark.parametrize("name, text, value", [
    ("TPU_DIFFUSERS_LAUNCH_TIMEOUT", " 90 ", 90.0),
    ("TPU_DIFFUSERS_WORKER_SILENCE_TIMEOUT", "", 3600.0),
    ("TPU_DIFFUSERS_RECOMPILE_LIMIT", "128", 128),
    ("TPU_DIFFUSERS_COMPILE_CACHE", "gs://bucket/cache", "gs://bucket/cache"),
    ("TPU_DIFFUSERS_COMPILE_CACHE", "~/cache", os.path.join(os.path.expanduser("~"), "cache")),
    ("TPU_DIFFUSERS_CONTROL_KEY", "", None),
    ("TPU_DIFFUSERS_ATTACH_ALLOW", "", None),
    ("TPU_DIFFUSERS_ATTACH_ALLOW", "10.0.0.2:7777, Host-1,[fd00::2]:7777,::1,",
     (("10.0.0.2", 7777), ("host-1", None), ("fd00::2", 7777), ("::1", None))),
    ("TPU_DIFFUSERS_XLA_OPTIMIZATION_LEVEL", "o1", "O1"),
    ("TPU_DIFFUSERS_PIPELINE_KIND", "Modular", "modular"),
])
def test_good_values_and_unset_variables_read_as_what_the_pack_uses(monkeypatch, name, text, value):
    monkeypatch.setenv(name, text)
    assert settings.get(name) == value


@pytest.mark.process
@pytest.mark.parametrize("name", BAD_VALUES)
def test_the_runtime_imports_with_a_bad_value(name):
    """As ComfyUI imports the pack: every runtime module, with the variable set badly."""
    script = ("import runtime_package; runtime_package.load(); "
              "import tpu_diffusers_runtime.engine, tpu_diffusers_runtime.settings, tpu_diffusers_runtime.worker_program")
    env = {**os.environ, name: BAD_VALUES[name][0]}
    done = subprocess.run([sys.executable, "-c", script], cwd=ROOT, env=env, capture_output=True, text=True,
                          timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]


def test_a_bad_launch_timeout_fails_the_tp_run_before_anything_launches(tiny, monkeypatch):
    monkeypatch.setenv("TPU_DIFFUSERS_LAUNCH_TIMEOUT", "10m")
    handle = PipelineHandle.of(source=tiny("flux1-schnell"), model_class="FluxPipeline", mesh=MeshSpec(chips=2))
    engine = Engine()
    with pytest.raises(SettingError, match="TPU_DIFFUSERS_LAUNCH_TIMEOUT is '10m'"):
        engine.generate(handle, SampleRequest(prompt="a cat", width=64, height=64, steps=1))
    assert launched_workers() == [] and engine.workers.current is None


def test_a_bad_control_key_in_the_environment_is_refused_before_attaching_without_showing_it(tiny, monkeypatch):
    key = "zz" + channel.new_key()[2:]  # one typo away from a real key
    monkeypatch.setenv(channel.KEY_ENV, key)
    with pytest.raises(SettingError, match=f"{channel.KEY_ENV} \\(value not shown.*the control key is not hex") \
            as raised:
        check_mesh(MeshSpec(chips=2, workers=Workers.ATTACH, address="127.0.0.1:7777"), tiny("flux1-schnell"),
                   device_info("cpu"))
    assert key[2:] not in str(raised.value)


def test_the_environment_page_documents_every_variable_as_the_settings_table_says():
    page = (ROOT / "docs" / "environment.md").read_text()
    assert settings.markdown_table() in page, "docs/environment.md's table differs from:\n" + \
        settings.markdown_table()
