"""Process-wide settings (runtime/process_env.py, applied by prestartup_script.py before torch starts)."""

import json
import logging
import os
import subprocess
import sys

import pytest

from tpu_diffusers_runtime import process_env
from tpu_diffusers_runtime.device import tpu_on_pci_bus

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
NAMES = (process_env.COMPILE_CACHE_ENV, process_env.XLA_LEVEL_ENV, process_env.APPLIED_ENV,
         process_env.INDUCTOR_CACHE, process_env.TPU_TIER2_CACHE, process_env.TPU_TIER3_CACHE,
         process_env.TPU_TIER3_LOCAL_BACKUP, process_env.TPU_XLA_OPTIONS)


def without_settings(environ) -> dict:
    return {name: value for name, value in environ.items() if name not in NAMES}


@pytest.fixture
def environ():
    """os.environ without the pack's settings, restored whole afterwards (apply() adds names)."""
    saved = dict(os.environ)
    os.environ.clear()
    os.environ.update(without_settings(saved))
    yield os.environ
    os.environ.clear()
    os.environ.update(saved)


def test_defaults_go_under_the_root_and_a_users_own_values_are_kept(environ, tmp_path):
    environ[process_env.TPU_TIER2_CACHE] = "my-tier2"
    root = process_env.default_root(str(tmp_path / "user"))
    effective = process_env.apply(root)
    assert root == str(tmp_path / "user" / "tpu_diffusers" / "compile_cache")
    assert effective == {process_env.INDUCTOR_CACHE: os.path.join(root, "inductor"),
                         process_env.TPU_TIER2_CACHE: "my-tier2",
                         process_env.TPU_TIER3_CACHE: os.path.join(root, "tpu"),
                         process_env.TPU_TIER3_LOCAL_BACKUP: "1"}
    assert {name: environ[name] for name in effective} == effective
    assert os.path.isdir(os.path.join(root, "inductor")) and os.path.isdir(os.path.join(root, "tpu"))
    assert environ[process_env.APPLIED_ENV] == "after torch"  # this test process imported torch long ago
    assert process_env.compile_cache_settings()["applied"] == "after torch"


def test_the_cache_variable_overrides_the_root_and_a_gs_root_is_passed_through(environ, tmp_path):
    environ[process_env.COMPILE_CACHE_ENV] = str(tmp_path / "elsewhere")
    assert process_env.wanted_settings(str(tmp_path / "root"))[process_env.INDUCTOR_CACHE] == \
        str(tmp_path / "elsewhere" / "inductor")

    environ[process_env.COMPILE_CACHE_ENV] = "gs://bucket/fleet-cache"
    settings = process_env.wanted_settings(str(tmp_path / "root"))
    assert settings[process_env.TPU_TIER3_CACHE] == "gs://bucket/fleet-cache"
    assert settings[process_env.INDUCTOR_CACHE] == str(tmp_path / "root" / "inductor")  # inductor needs a folder
    assert process_env.TPU_TIER3_LOCAL_BACKUP not in settings  # the docs set it for a local folder only

    del environ[process_env.COMPILE_CACHE_ENV]
    environ[process_env.TPU_TIER3_CACHE] = "gs://users-own/bucket"  # kept by apply(), and no local backup task
    assert process_env.TPU_TIER3_LOCAL_BACKUP not in process_env.wanted_settings(str(tmp_path / "root"))


def test_a_bad_cache_variable_is_said_in_the_log_and_the_default_root_is_used(environ, tmp_path, caplog):
    environ[process_env.COMPILE_CACHE_ENV] = "s3://bucket/cache"
    with caplog.at_level(logging.ERROR, logger="tpu_diffusers"):
        settings = process_env.wanted_settings(str(tmp_path / "root"))
    assert settings[process_env.TPU_TIER3_CACHE] == str(tmp_path / "root" / "tpu")
    assert "TPU_DIFFUSERS_COMPILE_CACHE is 's3://bucket/cache', which cannot be used" in caplog.text
    assert f"The compile cache stays in {tmp_path / 'root'}" in caplog.text


def test_the_xla_optimisation_level_is_passed_on_and_a_bad_one_is_refused_in_the_log(environ, tmp_path, caplog):
    environ[process_env.XLA_LEVEL_ENV] = "o1"
    assert process_env.wanted_settings(str(tmp_path))[process_env.TPU_XLA_OPTIONS] == "xla_optimization_level=O1"
    environ[process_env.XLA_LEVEL_ENV] = "fast"
    with caplog.at_level(logging.WARNING, logger="tpu_diffusers"):
        assert process_env.TPU_XLA_OPTIONS not in process_env.wanted_settings(str(tmp_path))
    assert "TPU_DIFFUSERS_XLA_OPTIMIZATION_LEVEL" in caplog.text and "'fast'" in caplog.text


def test_the_prestartup_script_sets_everything_before_torch_inside_comfyuis_user_folder(tmp_path):
    """As ComfyUI's main.py runs it: folder_paths imported and configured, torch not imported yet.
    The script must import nothing that imports torch."""
    user = tmp_path / "comfy" / "user"
    script = f"""
import json, logging, os, runpy, sys, types
logging.basicConfig(level=logging.INFO)  # ComfyUI sets up logging before it runs prestartup scripts
folder_paths = types.ModuleType("folder_paths")
folder_paths.get_user_directory = lambda: {str(user)!r}
sys.modules["folder_paths"] = folder_paths
runpy.run_path({os.path.join(ROOT, "prestartup_script.py")!r})
print(json.dumps({{"torch imported": "torch" in sys.modules, "environ": dict(os.environ)}}))
"""
    env = {k: v for k, v in without_settings(os.environ).items() if k != "TPU_SKIP_MDS_QUERY"}
    done = subprocess.run([sys.executable, "-c", script], cwd=str(tmp_path), env=env, capture_output=True,
                          text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-3000:]
    result = json.loads(done.stdout.strip().splitlines()[-1])
    environ, root = result["environ"], user / "tpu_diffusers" / "compile_cache"
    assert result["torch imported"] is False
    assert environ[process_env.APPLIED_ENV] == "before torch"
    assert environ[process_env.INDUCTOR_CACHE] == str(root / "inductor")
    assert environ[process_env.TPU_TIER3_CACHE] == str(root / "tpu")
    assert environ[process_env.TPU_TIER2_CACHE] == process_env.TIER2_NAME
    assert (environ.get("TPU_SKIP_MDS_QUERY") == "1") == (not tpu_on_pci_bus())
    assert "process settings applied before torch was imported" in done.stderr
