"""envtools' rooms stay as envtools/__init__.py describes them: the benchmarks reach the
other rooms through public names only, and no module imports envtools inside a function
to dodge an import cycle (import-linter's contracts in .importlinter check the order of
the rooms and that no cycle is left: ``make imports``)."""

from __future__ import annotations

import ast
from pathlib import Path

import envtools

PKG = Path(envtools.__file__).parent

#: where a function imports an envtools module on purpose, and why
LAZY = {
    "cli.py": "each command imports its module only when it runs (start-up time)",
    "api.py": "each function imports the command it runs (import envtools.api stays light)",
    "commands/clone.py": "clone --add alone needs the solve, which loads py-rattler",
    "image/": "each image command imports what it needs when it runs (envtools run IMAGE "
              "starts every rank of a job)",
}


def _modules() -> list[Path]:
    return sorted(PKG.rglob("*.py"))


def _imports_in_functions(tree: ast.AST) -> list[tuple[int, str]]:
    found = []

    def visit(node: ast.AST, in_function: bool) -> None:
        for child in ast.iter_child_nodes(node):
            inner = in_function or isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef))
            if inner and isinstance(child, ast.ImportFrom) and (
                    child.level or (child.module or "").split(".")[0] == "envtools"):
                found.append((child.lineno, child.module or "."))
            visit(child, inner)

    visit(tree, False)
    return found


def test_the_rooms_are_packages_and_the_tree_was_read():
    rooms = {p.parent.name for p in _modules() if p.parent != PKG}
    assert {"base", "prefix", "cache", "place", "solve", "validate", "commands",
            "bench"} <= rooms, rooms
    assert len(_modules()) > 40


def test_no_envtools_import_inside_a_function_but_the_deliberate_ones():
    bad = []
    for p in _modules():
        rel = str(p.relative_to(PKG))
        if rel in LAZY or any(k.endswith("/") and rel.startswith(k) for k in LAZY):
            continue
        for line, mod in _imports_in_functions(ast.parse(p.read_text())):
            bad.append(f"{rel}:{line}: from {mod} import ...")
    assert not bad, "imports inside functions (import at the top; a cycle means a room " \
        "is in the wrong place):\n" + "\n".join(bad)


def test_bench_uses_public_names_only():
    bad = []
    for p in sorted((PKG / "bench").glob("*.py")):
        for node in ast.walk(ast.parse(p.read_text())):
            if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("envtools"):
                bad += [f"{p.name}:{node.lineno}: {node.module}.{a.name}" for a in node.names
                        if a.name.startswith("_") or any(
                            part.startswith("_") for part in node.module.split("."))]
            elif isinstance(node, ast.Attribute) and node.attr.startswith("_") and \
                    isinstance(node.value, ast.Name) and node.value.id in {
                        "elf", "asuser", "bench_add", "measure", "readonly"}:
                bad.append(f"{p.name}:{node.lineno}: {node.value.id}.{node.attr}")
    assert not bad, "the benchmarks use private names of other modules:\n" + "\n".join(bad)
