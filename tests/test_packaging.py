"""What a user's ComfyUI installs from us: never torch; torch_tpu only as the TPU extra."""

import re
import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def names(requirements):
    return {re.split(r"[<>=!~\[; ]", line.strip(), maxsplit=1)[0].lower().replace("_", "-")
            for line in requirements if line.strip() and not line.strip().startswith("#")}


def test_the_pack_never_installs_torch_and_keeps_requirements_and_pyproject_in_step():
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    requirements = names((ROOT / "requirements.txt").read_text().splitlines())
    assert requirements == names(project["dependencies"])
    assert not requirements & {"torch", "torchvision", "torchaudio", "torch-tpu"}
    assert names(project["optional-dependencies"]["tpu"]) == {"torch-tpu"}


def test_registry_metadata_is_complete():
    config = tomllib.loads((ROOT / "pyproject.toml").read_text())
    assert re.fullmatch(r"\d+\.\d+\.\d+", config["project"]["version"])
    assert config["project"]["license"] and config["project"]["urls"]["Repository"]
    assert {"PublisherId", "DisplayName", "Icon"} <= set(config["tool"]["comfy"])
