"""Shared fixtures: the runtime importable without ComfyUI, and tiny real pipelines built once.

Test tiers. Every test gets markers from where it lives and what it is called (see
`pytest_collection_modifyitems`), so a tier can be picked or left out with `-m`:

    e2e          tests/e2e/: a real ComfyUI 0.3.75 server with the pack (starts in 10-25 s)
    browser      tests/e2e/test_browser.py: the real frontend in headless Chromium
    compile      test_compile*.py, and any test with "compile" in its name: torch.compile
                 on CPU costs 20-60 s per shape
    tp           test_tensor_parallel.py, test_tp_*.py: torchrun worker groups of 2 gloo ranks
    reliability  tests/reliability/: soak, bad inputs, faults through a real server (~10 min)
    process      tests that start fresh Python processes importing torch (test_verify_device.py, and
                 tests marked @pytest.mark.process): 5-30 s each

    pytest tests -m "not (e2e or compile or tp or browser or reliability or process)"   # inner loop
    pytest tests -m "not reliability"                                         # what the suite covered before
    pytest tests                                                              # everything (CI)
    pytest tests/reliability -s                                               # soak/bad-input/fault counts
"""

import os
import shutil
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
os.environ.setdefault("HF_HUB_OFFLINE", "1")  # nothing is ever downloaded in tests
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "tools"))
sys.path.insert(0, str(ROOT / "tests"))  # shared test helpers (processes.py, serving.py), also for subfolders

import runtime_package  # noqa: E402

runtime_package.load()  # the runtime under its one import name, as in ComfyUI and the workers

import tiny_models  # noqa: E402

TESTS = Path(__file__).resolve().parent
MARKERS = {
    "e2e": "through a real ComfyUI server (tests/e2e)",
    "browser": "the real frontend in headless Chromium (tests/e2e/test_browser.py)",
    "compile": "torch.compile on CPU: tens of seconds per shape",
    "tp": "tensor parallelism: torchrun worker groups",
    "reliability": "soak, bad inputs and faults through a real server (tests/reliability)",
    "process": "starts fresh Python processes that import torch: 5-30 s each",
}


def pytest_configure(config):
    for name, meaning in MARKERS.items():
        config.addinivalue_line("markers", f"{name}: {meaning}")


def tier_markers(path: Path, test_name: str) -> set[str]:
    """The tiers of a test, from its file's place under tests/ and its name."""
    try:
        parts = path.resolve().relative_to(TESTS).parts
    except ValueError:  # collected from outside tests/
        return set()
    markers = set()
    if parts[0] == "e2e":
        markers.add("e2e")
    if parts[0] == "reliability":
        markers.add("reliability")
    if path.name == "test_browser.py":
        markers.add("browser")
    if path.name.startswith("test_compile") or "compile" in test_name:
        markers.add("compile")
    if path.name == "test_tensor_parallel.py" or path.name.startswith("test_tp_"):
        markers.add("tp")
    if path.name == "test_verify_device.py":
        markers.add("process")
    return markers


def pytest_collection_modifyitems(config, items):
    for item in items:
        for name in sorted(tier_markers(Path(str(item.path)), item.name)):
            item.add_marker(name)


TORCH_TPU_OPT_OUT = "TPU_DIFFUSERS_SKIP_TORCH_TPU_CONTRACT"


@pytest.fixture(scope="session")
def torch_tpu():
    """The installed torch_tpu. The suite runs on a TPU user's stack (scripts/test.sh installs it): without
    it, a test of the pack next to torch_tpu would pass without checking anything, so it fails and says why,
    unless TPU_DIFFUSERS_SKIP_TORCH_TPU_CONTRACT=1 asks to skip on purpose."""
    import importlib.util

    if importlib.util.find_spec("torch_tpu") is None:
        if os.environ.get(TORCH_TPU_OPT_OUT) == "1":
            pytest.skip(f"torch_tpu is not installed and {TORCH_TPU_OPT_OUT}=1")
        pytest.fail(f"torch_tpu is not installed, but this test checks the pack against a TPU user's stack: "
                    f"install it (EXTRAS=test bash scripts/setup_env.sh installs torch_tpu==0.2.0) or set "
                    f"{TORCH_TPU_OPT_OUT}=1 to skip it on purpose.", pytrace=False)
    import torch_tpu

    return torch_tpu


@pytest.fixture(autouse=True)
def fresh_dynamo(request):
    """No compile-tier test sees code an earlier one compiled (dynamo's caches are per process)."""
    if request.node.get_closest_marker("compile"):
        import torch

        torch.compiler.reset()


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


@pytest.fixture(scope="session")
def single_files(tiny_dir, tmp_path_factory):
    """ComfyUI-style single files (tools/tiny_single_files.py) of every family, written once:
    {family: (configs folder, {kind: path})}. FLUX.1's transformer file needs FLUX's real width (diffusers'
    BFL converter hard-codes it), so FLUX.1 comes from a real-width folder with one block of each kind; its
    Kontext folder shares those weights (hard links), its Fill folder only adds a 384-channel input layer
    (together ~7 s more than FLUX.1-dev's ~18 s). The Qwen-Image-Edit-2509/2511 folders are the tiny
    qwenimage-edit-plus one (2511: zero_cond_t). FLUX.2 [klein]'s folder has the real context width (7680), which
    tells its files from FLUX.2 [dev]'s. Z-Image's folder has bf16-valued transformer weights (its file is
    bf16), Krea 2's is Turbo with fp8-valued ones (its files are scaled fp8), FLUX 3 [klein]'s base model has bf16-valued
    ones (its file is bf16), LTX-2.3's fp8-valued and LTX-2.5's int8-ConvRot-valued ones. Wan 2.2 A14B's folders have a VAE of Wan 2.1's block structure (diffusers' converter needs it)."""
    import tiny_single_files as tsf

    root = tmp_path_factory.mktemp("single_files")
    wide = tsf.flux1_wide(root / "flux1-wide")
    qwenimage = Path(shutil.copytree(tiny_dir / "tiny-qwenimage", root / "qwenimage"))
    tsf.wan_sized_vae(qwenimage)  # diffusers' Wan VAE converter (QwenImage's VAE files) needs Wan's block structure
    edit_2509 = Path(shutil.copytree(tiny_dir / "tiny-qwenimage-edit-plus", root / "qwenimage-edit-2509"))
    tsf.wan_sized_vae(edit_2509)
    edit_2511 = Path(shutil.copytree(edit_2509, root / "qwenimage-edit-2511"))
    tsf.qwen_edit_2511_configs(edit_2511)
    zimage = Path(shutil.copytree(tiny_dir / "tiny-zimage", root / "zimage"))
    tsf.bf16_valued_transformer(zimage)  # z_image_turbo_bf16.safetensors then holds exactly the folder's weights
    qwenimage21 = Path(shutil.copytree(tiny_dir / "tiny-qwenimage21", root / "qwenimage21"))
    tsf.bf16_valued_transformer(qwenimage21)  # as Z-Image's: qwen_image_2.1_bf16.safetensors
    flux3 = Path(shutil.copytree(tiny_dir / "tiny-flux3", root / "flux3"))
    tsf.bf16_valued_transformer(flux3)  # as Qwen-Image 2.1's: flux3-image-klein-base-bf16.safetensors
    ltx23 = Path(shutil.copytree(tiny_dir / "tiny-ltx23", root / "ltx23"))
    tsf.transformer_holding(ltx23, tsf.fp8_valued)  # its ltx-2.3-22b-dev-fp8 checkpoint then holds the folder's weights
    ltx25 = Path(shutil.copytree(tiny_dir / "tiny-ltx25", root / "ltx25"))
    ltx25_files = tsf.ltx25_files(ltx25, root / "files-ltx25")  # its int8 ConvRot file quantizes the folder's weights;
    tsf.transformer_holding(ltx25, tsf.ltx25_transformer_values)  # then the folder holds what that file loads as
    krea2 = Path(shutil.copytree(tiny_dir / "tiny-krea2", root / "krea2"))
    tsf.krea2_turbo_folder(krea2)  # Turbo; its scaled fp8 files then hold exactly the folder's weights
    wan_a14b = {}  # Wan 2.2 A14B's wan_2.1_vae: diffusers' converter needs Wan 2.1's block structure, as QwenImage's
    for name in ("wan22-t2v-a14b", "wan22-i2v-a14b"):
        wan_a14b[name] = Path(shutil.copytree(tiny_dir / f"tiny-{name}", root / name))
        tsf.wan_sized_vae(wan_a14b[name])

    def wan22_writer(model: str):
        return lambda folder, out: tsf.wan22_files(folder, out, model)

    writers = {"flux1-wide": (wide, tsf.flux1_files), "flux1-dev": (tiny_dir / "tiny-flux1-dev", tsf.flux1_files),
               "flux1-kontext-wide": (tsf.flux1_kontext_wide(wide, root / "flux1-kontext-wide"), tsf.flux1_kontext_files),
               "flux1-fill-wide": (tsf.flux1_fill_wide(wide, root / "flux1-fill-wide"), tsf.flux1_fill_files),
               "sd3": (tiny_dir / "tiny-sd3", tsf.sd3_files), "flux2": (tiny_dir / "tiny-flux2", tsf.flux2_files),
               "qwenimage": (qwenimage, tsf.qwenimage_files),
               "qwenimage-edit-2509": (edit_2509, lambda folder, out: tsf.qwenimage_edit_files(folder, out, "2509")),
               "qwenimage-edit-2511": (edit_2511, lambda folder, out: tsf.qwenimage_edit_files(folder, out, "2511")),
               "flux2-klein-wide": (tsf.flux2_klein_wide(root / "flux2-klein-wide"), tsf.flux2_klein_files),
               "sdxl": (tiny_dir / "tiny-sdxl", tsf.sdxl_files),
               "zimage": (zimage, tsf.zimage_files),
               "qwenimage21": (qwenimage21, tsf.qwenimage21_files),
               "krea2": (krea2, tsf.krea2_files),
               "flux3": (flux3, tsf.flux3_files),
               "flux3-distilled": (tiny_dir / "tiny-flux3-distilled", tsf.flux3_files),
               "wan22-t2v-a14b": (wan_a14b["wan22-t2v-a14b"], wan22_writer("t2v")),
               "wan22-i2v-a14b": (wan_a14b["wan22-i2v-a14b"], wan22_writer("i2v")),
               "wan22-ti2v-5b": (tiny_dir / "tiny-wan22-ti2v-5b", wan22_writer("ti2v")),
               "ltx2": (tiny_dir / "tiny-ltx2", tsf.ltx2_files),
               "ltx23": (ltx23, lambda folder, out: tsf.ltx2_files(folder, out, "ltx-2.3-22b-dev-fp8")),
               "ltx25": (ltx25, lambda folder, out: ltx25_files)}
    yield {family: (folder, {kind: Path(path) for kind, path in write(folder, root / f"files-{family}").items()})
           for family, (folder, write) in writers.items()}
    shutil.rmtree(root)  # ~5 GB (the real-width FLUX.1 files): pytest keeps its last 3 runs' folders, never these
