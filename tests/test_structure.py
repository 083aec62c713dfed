"""The runtime's structure: no import circles, each family in its own module, one import name."""

import ast
import sys
from pathlib import Path

import tpu_diffusers_runtime
from tpu_diffusers_runtime.families import FAMILIES, FILE_KINDS

RUNTIME = Path(tpu_diffusers_runtime.__file__).parent


def module_name(path: Path) -> str:
    parts = path.relative_to(RUNTIME.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def imports_of(path: Path, modules: set[str]) -> set[str]:
    """The runtime modules a module imports with relative imports (at the top or inside functions)."""
    name = module_name(path)
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom) and node.level:
            base = package.split(".")[: len(package.split(".")) - node.level + 1]
            target = ".".join(base + ([node.module] if node.module else []))
            for candidate in [f"{target}.{alias.name}" for alias in node.names] + [target]:
                if candidate in modules and candidate != name:
                    found.add(candidate)
                    break
    return found


def test_the_runtime_has_no_import_circles():
    paths = {module_name(p): p for p in RUNTIME.rglob("*.py")}
    graph = {name: imports_of(path, set(paths)) for name, path in paths.items()}
    done, on_path = set(), []

    def visit(name):
        if name in on_path:
            raise AssertionError("import circle: " + " -> ".join(on_path[on_path.index(name):] + [name]))
        if name in done:
            return
        on_path.append(name)
        for target in sorted(graph[name]):
            visit(target)
        on_path.pop()
        done.add(name)

    for name in sorted(graph):
        visit(name)


def test_each_family_lives_in_a_module_of_its_own_and_its_file_kinds_are_detected():
    modules = [module for name, module in list(sys.modules.items())
               if name.startswith("tpu_diffusers_runtime.families.") and hasattr(module, "FAMILY")]
    assert sorted(module.FAMILY.name for module in modules) == sorted(family.name for family in FAMILIES)
    kinds = {family.denoiser_kind for family in FAMILIES} | {slot.kind for f in FAMILIES for slot in f.file_slots}
    assert kinds <= set(FILE_KINDS), "a family's file kind is missing from families.FILE_KINDS"


def test_the_runtime_is_loaded_once_under_one_name():
    assert not [name for name in sys.modules if name == "runtime" or name.startswith("runtime.")]
    assert [name for name in sys.modules if name.endswith("families.base")] == ["tpu_diffusers_runtime.families.base"]
