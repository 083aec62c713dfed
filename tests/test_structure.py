"""The runtime's structure: each family in its own module, one import name (its import graph: test_import_graph.py)."""

import sys

from tpu_diffusers_runtime.families import FAMILIES, FILE_KINDS


def test_each_family_lives_in_a_module_of_its_own_and_its_file_kinds_are_detected():
    modules = [module for name, module in list(sys.modules.items())
               if name.startswith("tpu_diffusers_runtime.families.") and hasattr(module, "FAMILY")]
    assert sorted(module.FAMILY.name for module in modules) == sorted(family.name for family in FAMILIES)
    kinds = {family.denoiser_kind for family in FAMILIES} | {slot.kind for f in FAMILIES for slot in f.file_slots}
    assert kinds <= set(FILE_KINDS), "a family's file kind is missing from families.FILE_KINDS"


def test_the_runtime_is_loaded_once_under_one_name():
    assert not [name for name in sys.modules if name == "runtime" or name.startswith("runtime.")]
    assert [name for name in sys.modules if name.endswith("families.base")] == ["tpu_diffusers_runtime.families.base"]
