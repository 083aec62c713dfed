"""The runtime's import graph (every import, at the top or inside a function, relative or by the runtime's one
import name): no circle, and `distributed/` strictly below the engine.

The rule for distributed/: it reaches (directly or through what it imports) only its own modules and the leaf
modules below, which know nothing of a request's run: errors, specs, settings, device, the model folder readers
(model_folder, sources, downloads, model_files: names inside the model folders) and the families. The engine, the plan, the tasks, the local run, loading,
features and the worker program sit above it; group.py starts the worker program by its path.
"""

import ast
from pathlib import Path

import tpu_diffusers_runtime

RUNTIME = Path(tpu_diffusers_runtime.__file__).parent
PACKAGE = tpu_diffusers_runtime.__name__
DISTRIBUTED = f"{PACKAGE}.distributed"
LEAVES = {f"{PACKAGE}.{name}" for name in ("errors", "specs", "settings", "device", "model_folder", "sources",
                                            "downloads", "model_files", "families")}


def module_name(path: Path) -> str:
    parts = (PACKAGE, *path.relative_to(RUNTIME).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def imports_of(path: Path, modules: set[str]) -> set[str]:
    """The runtime modules a module imports, wherever the import statement is."""
    name = module_name(path)
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom):
            if node.level:
                base = ".".join(package.split(".")[: len(package.split(".")) - node.level + 1])
                target = ".".join(filter(None, (base, node.module)))
            else:
                target = node.module or ""
            # `from package import module` imports that module; `from module import name`, the module
            found |= {f"{target}.{alias.name}" if f"{target}.{alias.name}" in modules else target
                      for alias in node.names}
        elif isinstance(node, ast.Import):
            found |= {alias.name for alias in node.names}
    return {target for target in found if target in modules and target != name}


def import_graph() -> dict[str, set[str]]:
    paths = {module_name(p): p for p in RUNTIME.rglob("*.py")}
    return {name: imports_of(path, set(paths)) for name, path in paths.items()}


def reached_from(graph: dict[str, set[str]], start: str) -> set[str]:
    seen, todo = set(), [start]
    while todo:
        for target in graph[todo.pop()] - seen:
            seen.add(target)
            todo.append(target)
    return seen


def is_under(name: str, package: str) -> bool:
    return name == package or name.startswith(package + ".")


def test_the_graph_sees_function_level_and_absolute_imports():
    graph = import_graph()
    assert f"{PACKAGE}.engine" in graph[f"{PACKAGE}.worker_program"]  # inside RankWorker.__init__, absolute
    assert f"{PACKAGE}.distributed.mesh" in graph[f"{PACKAGE}.memory_plan"]  # inside check_fits, relative


def test_the_runtime_has_no_import_circles():
    graph = import_graph()
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


def test_distributed_sits_below_the_engine():
    graph = import_graph()
    for name in sorted(n for n in graph if is_under(n, DISTRIBUTED)):
        above = sorted(target for target in reached_from(graph, name)
                       if not is_under(target, DISTRIBUTED) and not any(is_under(target, leaf) for leaf in LEAVES))
        assert not above, f"{name} reaches {above}: distributed/ may reach only itself and {sorted(LEAVES)}"
