"""What a user's ComfyUI installs from us: never torch; torch_tpu only as the TPU extra."""

import re
import tomllib
from pathlib import Path

from PIL import Image

ROOT = Path(__file__).resolve().parent.parent


def names(requirements):
    return {re.split(r"[<>=!~\[; ]", line.strip(), maxsplit=1)[0].lower().replace("_", "-")
            for line in requirements if line.strip() and not line.strip().startswith("#")}


def requirement_lines(name):
    return (ROOT / name).read_text().splitlines()


def test_the_pack_never_installs_torch_and_keeps_requirements_and_pyproject_in_step():
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    requirements = names(requirement_lines("requirements.txt"))
    assert requirements == names(project["dependencies"])
    assert not requirements & {"torch", "torchvision", "torchaudio", "torch-tpu"}
    assert names(project["optional-dependencies"]["tpu"]) == {"torch-tpu"}


def test_the_lock_pins_every_requirement_exactly():
    """setup_env.sh installs with the lock as constraints: anything it leaves out would float."""
    lock = [line for line in requirement_lines("requirements-lock.txt") if line.strip() and not line.startswith("#")]
    assert all(re.fullmatch(r"[A-Za-z0-9_.-]+==[^\s=]+", line) for line in lock), "only name==version lines"
    wanted = names(requirement_lines("requirements.txt")) | names(requirement_lines("requirements-test.txt"))
    assert wanted <= names(lock)
    assert {"torch", "torchvision"} <= names(lock)  # the pair ComfyUI runs on, for the project's own venv


def test_registry_metadata_is_what_the_comfy_registry_specifies():
    config = tomllib.loads((ROOT / "pyproject.toml").read_text())
    project, comfy = config["project"], config["tool"]["comfy"]
    assert re.fullmatch(r"\d+\.\d+\.\d+", project["version"])
    assert "comfyui" not in project["name"].lower()  # the registry's rule for node ids
    assert project["license"] and project["urls"]["Repository"] and project["classifiers"]
    assert {"PublisherId", "DisplayName", "Icon", "requires-comfyui"} <= set(comfy)
    icon = ROOT / comfy["Icon"].split("/main/", 1)[1]  # the URL serves this file of the repository
    with Image.open(icon) as image:
        assert image.width == image.height <= 400
