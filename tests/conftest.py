"""Shared fixtures: the runtime importable without ComfyUI, and tiny real pipelines built once."""

import os
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
os.environ.setdefault("HF_HUB_OFFLINE", "1")  # nothing is ever downloaded in tests
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "tools"))
sys.path.insert(0, str(ROOT / "tests"))  # shared test helpers, also for tests/e2e

import tiny_models  # noqa: E402

@pytest.fixture(scope="session")
def tiny_dir(tmp_path_factory) -> Path:
    """Every supported family, built once per test session with random weights."""
    root = tmp_path_factory.mktemp("models") / "diffusers"
    for name in tiny_models.FAMILIES:
        tiny_models.build(name, root / f"tiny-{name}")
    return root


@pytest.fixture
def tiny(tiny_dir):
    return lambda name: str(tiny_dir / f"tiny-{name}")
