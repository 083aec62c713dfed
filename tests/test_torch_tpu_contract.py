"""The torch_tpu 0.2.0 names the pack calls or relies on, checked against the installed wheel.

No TPU is needed: the wheel installs `torch.tpu` (and its submodules) on import even without a
chip, and the names resolve lazily to the modules that define them. The pack's TPU code paths
cannot run without a chip, so a rename or a changed signature in a new torch_tpu would otherwise
first show on a user's TPU VM; here it fails in CI.

The suite claims to run on a TPU user's software stack, so a missing torch_tpu fails these tests;
set TPU_DIFFUSERS_SKIP_TORCH_TPU_CONTRACT=1 to skip them on purpose (e.g. a CUDA-only stack).
"""

import ast
import importlib.util
import inspect
import logging
import mmap
import re
import subprocess
import sys
from pathlib import Path

import pytest

from tpu_diffusers_runtime import device
from tpu_diffusers_runtime.device import device_info, tpu_on_pci_bus
from tpu_diffusers_runtime.modes import execution_mode
from tpu_diffusers_runtime.specs import ExecutionMode

# Environment variables the pack sets for TorchTPU (compile caches, XLA options) and for libtpu.
TORCH_TPU_ENV_NAMES = ("TORCH_TPU_TIER2_COMPILATION_CACHE", "TORCH_TPU_TIER3_COMPILATION_CACHE_ROOT",
                       "TORCH_TPU_INTERNAL_TIER3_COMPILATION_CACHE_LOCAL_BACKUP_TASK",
                       "TORCH_TPU_INTERNAL_XLA_OPTIONS", "xla_optimization_level")
LIBTPU_ENV_NAMES = ("TPU_SKIP_MDS_QUERY",)
# Every name the pack's code calls on torch.tpu and torch.accelerator (test_the_lists_below_name_every_call checks).
TORCH_TPU_NAMES = ("EagerMode", "set_eager_mode", "_get_cache_stats", "get_device_name",
                   "distributed.set_tpu_launch_env")
ACCELERATOR_NAMES = ("current_accelerator", "device_count", "synchronize", "current_device_index")
# torch.accelerator's memory calls, which reach TorchTPU's allocator (TpuAllocator in its glue library) on a TPU;
# runtime/device.py guards each (an untried path: a failure there leaves the figure unknown, never fails a run).
ACCELERATOR_MEMORY_NAMES = {"empty_cache": "emptyCache", "max_memory_allocated": "getDeviceStats",
                            "reset_peak_memory_stats": "resetPeakStats"}
PACK_CODE = [path for folder in ("runtime", "nodes", "tools", "benchmarks")
             for path in sorted((Path(__file__).resolve().parent.parent / folder).rglob("*.py"))]


pytestmark = pytest.mark.usefixtures("torch_tpu")  # tests/conftest.py: fails clearly without torch_tpu


@pytest.fixture(scope="module")
def tpu(torch_tpu):
    """The public `torch.tpu` module, as the pack reaches it (`import torch; torch.tpu.X`)."""
    import torch.tpu

    return torch.tpu


def test_eager_mode_members_the_pack_and_its_docs_name(tpu):
    members = set(tpu.EagerMode.__members__)
    assert {"DEFER_NEVER", "DEFER_AND_FUSE", "DEFER_NEVER_AND_LAUNCH_BLOCKING"} <= members, members
    assert tpu.EagerMode.DEFER_AND_FUSE.name == "DEFER_AND_FUSE"  # the run info shows the name


def test_set_eager_mode_is_a_context_manager_taking_a_mode(tpu):
    assert list(inspect.signature(tpu.set_eager_mode).parameters) == ["mode"]
    before = tpu.eager_mode
    with tpu.set_eager_mode(tpu.EagerMode.DEFER_NEVER_AND_LAUNCH_BLOCKING):
        assert tpu.eager_mode == tpu.EagerMode.DEFER_NEVER_AND_LAUNCH_BLOCKING
    assert tpu.eager_mode == before


@pytest.mark.parametrize("mode, expected", [(ExecutionMode.EAGER, "DEFER_NEVER"),
                                            (ExecutionMode.FUSED_EAGER, "DEFER_AND_FUSE")])
def test_the_runtime_switches_torch_tpu_eager_mode(tpu, mode, expected):
    """The runtime's own TPU branch, run against the wheel (switching the mode needs no chip)."""
    with execution_mode(mode, device_info("tpu")) as ran:
        assert tpu.eager_mode == getattr(tpu.EagerMode, expected)
        assert f"EagerMode.{expected}" in ran


def test_device_name_needs_no_argument(tpu):
    """tools/verify_device.py names the TPU in its report without taking a chip."""
    assert isinstance(tpu.get_device_name(), str)


def test_launch_env_helper_takes_nproc_per_node(torch_tpu):
    import torch.tpu.distributed

    signature = inspect.signature(torch.tpu.distributed.set_tpu_launch_env)
    signature.bind(nproc_per_node=4)  # how runtime/distributed/group.py calls it
    assert signature.parameters["nproc_per_node"].kind is inspect.Parameter.KEYWORD_ONLY


@pytest.mark.process
def test_the_launch_env_printer_the_readme_documents_runs(torch_tpu):
    """`python -m torch.tpu.distributed` (docs/parallelism.md, multi-host): prints the launch environment on a TPU
    host; without a chip it stops with TorchTPU's own message (not an ImportError)."""
    done = subprocess.run([sys.executable, "-m", "torch.tpu.distributed"], capture_output=True, text=True,
                          timeout=300)  # inherits TPU_SKIP_MDS_QUERY=1 where there is no TPU (the runtime sets it)
    if tpu_on_pci_bus():
        assert done.returncode == 0 and "WORLD_SIZE=" in done.stdout, done.stderr[-2000:]
    else:
        assert done.returncode != 0 and "expected TPU devices" in done.stderr, done.stderr[-2000:]


def test_topology_aware_mesh_takes_a_mesh_shape_and_a_dcn_shape(torch_tpu):
    import torch.tpu.distributed

    inspect.signature(torch.tpu.distributed.topology_aware_mesh).bind((2, 4), dcn_mesh_shape=(1, 1))


def test_the_tpu_dynamo_backend_is_registered(torch_tpu):
    """The pack compiles with backend=device_info("tpu").compile_backend; TorchTPU registers it on import."""
    import torch._dynamo
    from torch._dynamo.backends.registry import lookup_backend

    name = device_info("tpu").compile_backend
    assert name in torch._dynamo.list_backends(exclude_tags=())
    assert callable(lookup_backend(name))


def test_the_tpu_dist_process_group_backend_is_registered_when_the_device_loads(torch_tpu):
    """TorchTPU registers `tpu_dist` only when a chip initialises; without one, check the registration
    in the loader and the creator it registers."""
    import torch.distributed as dist
    from torch_tpu import _loader
    from torch_tpu._internal.distributed import tpu_distributed

    name = device_info("tpu").process_group_backend
    source = inspect.getsource(_loader)
    assert re.search(rf'register_backend\(\s*"{name}"\s*,\s*tpu_distributed\.create_process_group', source)
    assert callable(tpu_distributed.create_process_group)
    if _loader._LOADED:
        assert name in dist.Backend.backend_list


def test_cache_statistics_helper_reports_hits_requests_and_compilations(tpu):
    assert not inspect.signature(tpu._get_cache_stats).parameters
    stats = tpu._get_cache_stats()
    for field in ("num_cache_hits", "num_cache_reqs", "num_compilations"):
        assert isinstance(getattr(stats, field), int), field


def _names_in_files(folder: Path, names) -> set[str]:
    """Which of `names` occur (as bytes) in some file under `folder`: env vars are read in compiled code."""
    missing = set(names)
    for path in sorted(folder.rglob("*")):
        if not missing:
            break
        if not path.is_file() or path.stat().st_size == 0:
            continue
        with open(path, "rb") as f, mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as data:
            missing = {name for name in missing if data.find(name.encode()) == -1}
    return set(names) - missing


@pytest.mark.parametrize("package, names", [("torch_tpu", TORCH_TPU_ENV_NAMES), ("libtpu", LIBTPU_ENV_NAMES)])
def test_the_environment_variables_the_pack_sets_are_read_by_the_wheel(torch_tpu, package, names):
    folder = Path(importlib.util.find_spec(package).origin).parent
    assert _names_in_files(folder, names) == set(names)


def _attribute_chain(node) -> str:
    """'torch.tpu.distributed.set_tpu_launch_env' for that attribute access; '' for anything else."""
    parts = []
    while isinstance(node, ast.Attribute):
        parts.append(node.attr)
        node = node.value
    return ".".join([node.id, *reversed(parts)]) if isinstance(node, ast.Name) else ""


def _names_the_pack_calls() -> set[str]:
    """'tpu.X' and 'accelerator.X' for every torch.tpu.X / torch.accelerator.X in the pack's code (longest chains
    only), and the memory calls runtime/device.py makes by name (_memory_call("X"))."""
    found = set()
    for path in PACK_CODE:
        for node in ast.walk(ast.parse(path.read_text())):
            chain = _attribute_chain(node)
            if chain.startswith(("torch.tpu.", "torch.accelerator.")):
                found.add(chain.removeprefix("torch."))
            if isinstance(node, ast.Call) and getattr(node.func, "id", None) == "_memory_call":
                found.add(f"accelerator.{node.args[0].value}")
    return {name for name in found if not any(other.startswith(name + ".") for other in found)}


def test_the_lists_below_name_every_call_the_pack_makes_on_torch_tpu_and_torch_accelerator():
    listed = {f"tpu.{name}" for name in TORCH_TPU_NAMES} | {
        f"accelerator.{name}" for name in (*ACCELERATOR_NAMES, *ACCELERATOR_MEMORY_NAMES)}
    assert _names_the_pack_calls() == listed


@pytest.mark.parametrize("name", TORCH_TPU_NAMES)
def test_each_torch_tpu_name_the_pack_calls_exists_in_the_wheel(tpu, name):
    target = tpu
    for part in name.split("."):
        target = getattr(target, part)
    assert target is not None


@pytest.mark.parametrize("name", [*ACCELERATOR_NAMES, *ACCELERATOR_MEMORY_NAMES])
def test_each_torch_accelerator_call_exists_and_the_memory_ones_reach_torch_tpus_allocator(torch_tpu, name):
    """torch.accelerator.X is torch's; on a TPU its memory calls go to the device's allocator, which torch_tpu 0.2.0
    implements as TpuAllocator (its methods are in the glue library; reset_accumulated_memory_stats, which the pack
    never calls, raises "not implemented for TPU" there)."""
    import torch

    assert callable(getattr(torch.accelerator, name))
    if name in ACCELERATOR_MEMORY_NAMES:
        method = ACCELERATOR_MEMORY_NAMES[name]
        mangled = f"12TpuAllocator{len(method)}{method}"  # torch_tpu::TpuAllocator::<method>, as the linker names it
        assert _names_in_files(Path(torch_tpu.__file__).parent / "csrc", [mangled]) == {mangled}


@pytest.mark.parametrize("failure", [RuntimeError("torch.accelerator.memory.max_memory_allocated is not implemented "
                                                  "for TPU."), None])
def test_memory_calls_that_fail_or_count_nothing_on_a_tpu_never_fail_a_run(torch_tpu, monkeypatch, caplog, failure):
    """What a chip's allocator may do (a fake: no TPU here): raise, or keep no statistics (0 bytes). The run's peak
    is then unknown and the cache stays; nothing raises, and the log says so once per call."""
    import torch

    def call(*args):
        if failure is not None:
            raise failure
        return 0

    for name in ACCELERATOR_MEMORY_NAMES:
        monkeypatch.setattr(torch.accelerator, name, call)
    tpu = device_info("tpu")
    with caplog.at_level(logging.WARNING, logger="tpu_diffusers"):
        for _ in range(2):
            device.reset_peak_memory(tpu)
            assert device.peak_memory_bytes(tpu) is None
            device.empty_cache(tpu)
    failed = [record.getMessage() for record in caplog.records if "failed on this device" in record.getMessage()]
    assert len(failed) == (3 if failure else 0), failed


def test_the_rank_counts_the_pack_launches_are_the_wheels_launch_topologies(torch_tpu):
    """device.TPU_WORLD_SIZES (what check_mesh, the memory plan and verify_device use) is torch_tpu 0.2.0's table of
    single-host launch topologies (set_tpu_launch_env raises "No TPU topology found for count: n" for others)."""
    from torch_tpu._internal.utils import hardware

    by_kind = {device.TPU_KIND_BY_PCI_DEVICE[pci]: tuple(sorted(topologies))
               for pci, topologies in hardware._TOPOLOGY_BY_TPU_PCI_DEVICE_ID.items()}
    assert by_kind == device.TPU_WORLD_SIZES
    assert {pci: f"TPU {kind}" for pci, kind in device.TPU_KIND_BY_PCI_DEVICE.items()} == dict(
        hardware._PCI_DEVICE_ID_TO_NAME)
