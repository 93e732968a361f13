"""The import graph of redpack/ and strategies/: no cycles, and strategies reached only through
their contract.

Every import counts, at module level or inside a function (a cycle broken by a function-level
import is still a cycle), and so do imports under TYPE_CHECKING.
"""

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PACKAGES = ("redpack", "strategies")
# What the rest of the project may import from strategies/: the contract, the registry, the
# Redis client, the combiner (the lab reads its batch sizes), and the package itself (its BUILTIN
# names for settings). Never a strategy module.
CONTRACT = {
    "strategies",
    "strategies.base",
    "strategies.registry",
    "strategies.lua",
    "strategies.combiner",
    "strategies.holds",
}


def module_name(path: Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def source_modules() -> dict[str, Path]:
    return {
        module_name(path): path
        for package in PACKAGES
        for path in (ROOT / package).rglob("*.py")
        if "migrations" not in path.parts
    }


def imports_of(name: str, path: Path, known: set[str]) -> set[str]:
    """The project modules `name` imports, anywhere in its body."""
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")
                base = base[: len(base) - (node.level - 1)]
                target = ".".join(base + ([node.module] if node.module else []))
            else:
                target = node.module or ""
            for alias in node.names:
                submodule = f"{target}.{alias.name}"
                found.add(submodule if submodule in known else target)
    return {module for module in found if module in known and module != name}


def graph() -> dict[str, set[str]]:
    modules = source_modules()
    known = set(modules)
    return {name: imports_of(name, path, known) for name, path in modules.items()}


def cycles(edges: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components with more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for target in sorted(edges[node]):
            if target not in index:
                visit(target)
                low[node] = min(low[node], low[target])
            elif target in on_stack:
                low[node] = min(low[node], index[target])
        if low[node] == index[node]:
            component = []
            while True:
                member = stack.pop()
                on_stack.discard(member)
                component.append(member)
                if member == node:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for node in sorted(edges):
        if node not in index:
            visit(node)
    return found


def test_the_checker_finds_a_cycle_and_a_function_level_import(tmp_path):
    edges = {"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}
    assert cycles(edges) == [["a", "b", "c"]]
    module = tmp_path / "m.py"
    module.write_text("def f():\n    from strategies import registry\n")
    assert imports_of("redpack.m", module, {"strategies.registry"}) == {"strategies.registry"}


def test_no_import_cycle_in_redpack_and_strategies():
    assert cycles(graph()) == []


def test_outside_strategies_only_the_contract_is_imported():
    named = {
        (module, target)
        for module, targets in graph().items()
        if not module.startswith("strategies")
        for target in targets
        if target.startswith("strategies") and target not in CONTRACT
    }
    assert named == set()


def test_no_module_outside_strategies_names_a_strategy_class():
    from django.conf import settings
    from django.utils.module_loading import import_string

    classes = {import_string(path).__name__ for path in settings.REDPACK_STRATEGIES.values()}
    for name, path in source_modules().items():
        if name.startswith("strategies"):
            continue
        identifiers = {
            node.id if isinstance(node, ast.Name) else node.attr
            for node in ast.walk(ast.parse(path.read_text()))
            if isinstance(node, ast.Name | ast.Attribute)
        }
        assert not identifiers & classes, f"{path} names {identifiers & classes}"
