"""The floor plan, read from the source: every import (module-level, inside functions, and
``importlib.import_module``/``__import__`` with a literal name) goes down a floor, never up, and no
module imports itself back through others.

Floors, top to bottom: ``specfleet.fleet``/``specfleet.cli``/``specfleet.plan`` (the CLI) ->
``deploys`` -> ``operations`` -> ``facts`` -> ``specfleet.core``. ``specfleet.hostside`` stands
apart: stdlib only (the weights agent also uses huggingface_hub, installed beside it in the hosts'
tools venv), importing nothing of the project; any floor may read it.
"""

from __future__ import annotations

import ast
import re
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
PACKAGES = ("specfleet", "deploys", "operations", "facts")
# Third-party modules a host-side program may import, and why.
HOSTSIDE_THIRD_PARTY = {"huggingface_hub"}  # the weights agent, in the hosts' tools venv


def floor(module: str) -> str:
    if module.startswith(("specfleet.fleet", "specfleet.cli", "specfleet.plan",
                          "specfleet.profiles")):
        return "top"
    if module.startswith("specfleet.hostside"):
        return "hostside"
    if module.startswith("specfleet.core") or module == "specfleet":
        return "core"
    return module.split(".")[0]


RANK = {"core": 0, "facts": 1, "operations": 2, "deploys": 3, "top": 4}
# What each floor may import from the project, besides itself and hostside.
ALLOWED = {
    "core": {"core"},
    "facts": {"core", "facts"},
    "operations": {"core", "facts", "operations"},
    "deploys": {"core", "facts", "operations"},
    # The controllers run deploy files by path; they never import the floors between.
    "top": {"core", "top"},
}


def module_name(path: Path) -> str:
    rel = path.relative_to(ROOT).with_suffix("")
    parts = list(rel.parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def project_files() -> list[Path]:
    files = []
    for pkg in PACKAGES:
        files += sorted((ROOT / pkg).rglob("*.py"))
    return files


def imports_of(path: Path, me: str | None = None) -> list[tuple[str, int, bool]]:
    """(module imported, line, inside a function) for every import in ``path`` (module ``me``)."""
    tree = ast.parse(path.read_text(), str(path))
    found: list[tuple[str, int, bool]] = []
    me = me or module_name(path)

    def visit(node: ast.AST, nested: bool) -> None:
        for child in ast.iter_child_nodes(node):
            inner = nested or isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda))
            if isinstance(child, ast.Import):
                found.extend((a.name, child.lineno, nested) for a in child.names)
            elif isinstance(child, ast.ImportFrom):
                base = child.module or ""
                if child.level:
                    pkg = me.split(".")
                    if not path.name == "__init__.py":
                        pkg = pkg[:-1]
                    pkg = pkg[: len(pkg) - (child.level - 1)]
                    base = ".".join(pkg + ([base] if base else []))
                found.append((base, child.lineno, nested))
                # `from pkg import module` imports pkg.module when it is one
                for a in child.names:
                    sub = f"{base}.{a.name}"
                    if (ROOT / (sub.replace(".", "/") + ".py")).exists() or (
                        ROOT / sub.replace(".", "/") / "__init__.py"
                    ).exists():
                        found.append((sub, child.lineno, nested))
            elif isinstance(child, ast.Call):
                fn = child.func
                name = fn.attr if isinstance(fn, ast.Attribute) else getattr(fn, "id", "")
                if name in ("import_module", "__import__") and child.args:
                    arg = child.args[0]
                    if isinstance(arg, ast.Constant) and isinstance(arg.value, str):
                        found.append((arg.value, child.lineno, True))
            visit(child, inner)

    visit(tree, False)
    return found


def project_import(name: str) -> bool:
    return name.split(".")[0] in PACKAGES


GRAPH = {
    module_name(p): [(m, line, nested) for m, line, nested in imports_of(p) if project_import(m)]
    for p in project_files()
}


def violations(module: str, imports: list[tuple[str, int, bool]]) -> list[str]:
    mine = floor(module)
    wrong = []
    for imported, line, _ in imports:
        theirs = floor(imported)
        if theirs == "hostside" and mine != "hostside":
            continue  # anyone may read the host-side programs
        if mine == "hostside" or theirs not in ALLOWED[mine]:
            wrong.append(f"line {line}: {imported} ({theirs}) from {mine}")
    return wrong


@pytest.mark.parametrize("module", sorted(GRAPH))
def test_imports_only_go_down(module):
    wrong = violations(module, GRAPH[module])
    assert not wrong, f"{module} imports against the floor plan: {wrong}"


# The console script imports each subcommand's modules when it runs: ``--help`` works anywhere
# without pyinfra, gevent or matplotlib (tests/unit/test_cli.py). Its imports still only go down.
LAZY_BY_DESIGN = ("specfleet.cli",)


def test_no_function_level_imports_of_the_project():
    """Imports inside functions are how circles hide: none of the project's own modules."""
    hidden = [
        f"{module}:{line} {imported}"
        for module, imports in GRAPH.items()
        for imported, line, nested in imports
        if nested and not floor(imported) == "hostside" and module not in LAZY_BY_DESIGN
    ]
    assert not hidden, hidden


def script_lines(path: Path) -> set[int]:
    """The lines of ``path``'s ``if __name__ == "__main__":`` block: they run only when the file
    is the program (``python -m specfleet.plan``), as the module ``__main__``, never on import, so
    their imports cannot close a circle."""
    lines: set[int] = set()
    for node in ast.parse(path.read_text(), str(path)).body:
        test = node.test if isinstance(node, ast.If) else None
        if (isinstance(test, ast.Compare) and isinstance(test.left, ast.Name)
                and test.left.id == "__name__" and isinstance(test.comparators[0], ast.Constant)
                and test.comparators[0].value == "__main__"):
            lines |= set(range(node.lineno, (node.end_lineno or node.lineno) + 1))
    return lines


# The circle check covers the benchmarks and drills too (they import each other and the
# project; a circle there is the same trap).
CIRCLE_PACKAGES = (*PACKAGES, "bench")
IMPORTED = {  # every import among them, but those of a script's ``__main__`` block
    module_name(p): [i for i in imports_of(p) if i[0].split(".")[0] in CIRCLE_PACKAGES
                     and i[1] not in script_lines(p)]
    for p in sorted(f for pkg in CIRCLE_PACKAGES for f in (ROOT / pkg).rglob("*.py"))
}


def test_no_circles():
    """No module of specfleet, operations, facts, deploys or bench imports itself back through
    others (imports inside functions included)."""
    assert {"bench.drills.run", "specfleet.cli", "deploys.kimi_k26"} <= set(IMPORTED)

    def resolve(name: str) -> str | None:
        while name and name not in IMPORTED:
            name = name.rpartition(".")[0]
        return name or None

    edges = {m: {r for i, _, _ in imps if (r := resolve(i)) and r != m}
             for m, imps in IMPORTED.items()}
    # A package's __init__ importing its own submodules is how packages re-export, not a circle.
    edges = {m: {r for r in rs if not r.startswith(m + ".")} for m, rs in edges.items()}
    index, low, stack, on, cycles, counter = {}, {}, [], set(), [], [0]

    def strong(v: str) -> None:
        index[v] = low[v] = counter[0]
        counter[0] += 1
        stack.append(v)
        on.add(v)
        for w in edges.get(v, ()):
            if w not in index:
                strong(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                cycles.append(sorted(comp))

    for v in sorted(edges):
        if v not in index:
            strong(v)
    assert not cycles, cycles


def test_hostside_is_stdlib_only():
    stdlib = set(sys.stdlib_module_names) | {"__future__"}
    wrong = []
    for path in sorted((ROOT / "specfleet" / "hostside").rglob("*.py")):
        for imported, line, _ in imports_of(path):
            top = imported.split(".")[0]
            sibling = (path.parent / f"{top}.py").exists()  # a program next to it on the host
            if top not in stdlib and top not in HOSTSIDE_THIRD_PARTY and not sibling:
                wrong.append(f"{path.relative_to(ROOT)}:{line} {imported}")
    assert not wrong, wrong


def test_deploys_holds_only_deploy_files():
    files = sorted(p.name for p in (ROOT / "deploys").iterdir())
    assert files and all(f.endswith(".py") for f in files), files
    assert "__init__.py" not in files  # deploy files are run by path, never imported
    importers = [m for m, imps in GRAPH.items() for i, _, _ in imps if i.split(".")[0] == "deploys"]
    assert not importers, importers


def test_templates_holds_only_jinja2():
    files = sorted(p.name for p in (ROOT / "templates").iterdir())
    assert files and all(f.endswith(".j2") for f in files), files


def test_the_checker_sees_upward_and_hidden_imports(tmp_path):
    """The checks above are not vacuous: a core module importing operations at the top, facts
    inside a function and deploys through importlib is refused on all three counts."""
    bad = tmp_path / "probe.py"
    bad.write_text(
        "import importlib\nimport operations.serving\n\n"
        "def f():\n    from facts import gpu\n    importlib.import_module('deploys.x')\n"
    )
    found = [i for i in imports_of(bad, "specfleet.core.probe") if project_import(i[0])]
    assert ("operations.serving", 2, False) in found
    assert ("facts.gpu", 5, True) in found
    assert ("deploys.x", 6, True) in found
    assert {w.split(": ")[1].split(" ")[0] for w in violations("specfleet.core.probe", found)} == {
        "operations.serving", "facts", "facts.gpu", "deploys.x"}
    assert violations("specfleet.fleet.x", [("operations.serving", 1, False)])
    assert violations("specfleet.hostside.x", [("specfleet.core.errors", 1, False)])


# ---------------------------------------------------------------------------------------------
# No reaching into another module's private names; no fact named by a string
# ---------------------------------------------------------------------------------------------

FACT_NAME = re.compile(r"facts\.[a-z_]+\.[A-Z]\w*")


def _rel(path: Path) -> Path:
    return path.relative_to(ROOT) if path.is_relative_to(ROOT) else path


def private_imports(path: Path, me: str | None = None) -> list[str]:
    """``from other import _name`` (or ``other._name``) for a project module ``other`` that is
    not ``path``'s own: a private name is its module's alone; what siblings share is public."""
    me = me or module_name(path)
    tree = ast.parse(path.read_text(), str(path))
    found = []
    modules = {a.asname or a.name: a.name for n in ast.walk(tree) if isinstance(n, ast.Import)
               for a in n.names if project_import(a.name)}  # fmt: skip
    # ``from operations import serving``: a module imported by name.
    modules.update({a.asname or a.name: f"{n.module}.{a.name}" for n in ast.walk(tree)
                    if isinstance(n, ast.ImportFrom) and n.module and project_import(n.module)
                    for a in n.names if f"{n.module}.{a.name}" in GRAPH})  # fmt: skip
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.module and project_import(node.module):
            if node.module == me:
                continue
            for alias in node.names:
                private = alias.name.startswith("_") and not alias.name.startswith("__")
                if private:
                    found.append(f"{_rel(path)}:{node.lineno} "
                                 f"from {node.module} import {alias.name}")  # fmt: skip
        elif (isinstance(node, ast.Attribute) and node.attr.startswith("_")
              and not node.attr.startswith("__") and isinstance(node.value, ast.Name)
              and node.value.id in modules and modules[node.value.id] != me):  # fmt: skip
            found.append(f"{_rel(path)}:{node.lineno} {node.value.id}.{node.attr}")
    return found


def facts_named_by_strings(path: Path) -> list[str]:
    """A fact spec whose fact is a string (``("facts.gpu.Gpus", {...})``), or an
    ``importlib.import_module`` of a computed name: the floor checks could not see either."""
    tree = ast.parse(path.read_text(), str(path))
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Tuple) and len(node.elts) == 2:
            first = node.elts[0]
            if (isinstance(first, ast.Constant) and isinstance(first.value, str)
                    and FACT_NAME.fullmatch(first.value)
                    and isinstance(node.elts[1], ast.Dict)):  # fmt: skip
                found.append(f"{_rel(path)}:{node.lineno} {first.value!r}")
        elif (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)
              and node.func.attr == "import_module"
              and not (node.args and isinstance(node.args[0], ast.Constant))):  # fmt: skip
            found.append(f"{_rel(path)}:{node.lineno} {ast.unparse(node)}")
    return found


def test_no_module_imports_another_modules_private_names():
    found = [hit for path in project_files() for hit in private_imports(path)]
    assert not found, found


def test_facts_are_imported_not_named_by_strings():
    found = [hit for path in project_files() for hit in facts_named_by_strings(path)]
    assert not found, found


def test_the_checker_sees_private_imports_and_facts_by_name(tmp_path):
    bad = tmp_path / "bad.py"
    bad.write_text(
        "import importlib\nfrom operations import serving\nfrom operations.serving import _gather\n"
        "SPECS = {'gpus': ('facts.gpu.Gpus', {})}\n\n"
        "def f(name):\n    serving._per_host(None)\n    importlib.import_module(name)\n"
    )
    privates = private_imports(bad, "operations.bad")
    by_name = facts_named_by_strings(bad)
    assert len(privates) == 2, privates
    assert len(by_name) == 2, by_name


MAX_FUNCTION_LINES = 80


def test_no_function_in_operations_or_hostside_is_over_80_lines():
    """A function that long does several jobs: split it along them (a pure decision, then the
    commands), as pyinfra's operations read. Docstrings count: they are read too."""
    long = []
    for folder in (ROOT / "operations", ROOT / "specfleet" / "hostside"):
        for path in sorted(folder.rglob("*.py")):
            for node in ast.walk(ast.parse(path.read_text(), str(path))):
                if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                    lines = node.end_lineno - node.lineno + 1
                    if lines > MAX_FUNCTION_LINES:
                        long.append(f"{_rel(path)}:{node.lineno} {node.name} ({lines} lines)")
    assert not long, long


MAX_SERVING_LINES = 600


def test_serving_is_its_operations_not_a_hub():
    """``operations/serving.py`` keeps only its operations (its pure half is ``core/unit.py``,
    the facts it reads ``operations/server_facts.py``): under 600 lines, and no other operation
    module but the deploy (``kimi_k26``) and ``status`` (which compares the unit it would
    render) imports it."""
    lines = len((ROOT / "operations" / "serving.py").read_text().splitlines())
    assert lines < MAX_SERVING_LINES, f"operations/serving.py has {lines} lines"
    importers = sorted(
        path.name for path in (ROOT / "operations").glob("*.py")
        if path.name != "serving.py"
        and re.search(r"^from operations(\.serving)? import .*\bserving\b|^from operations\.serving",
                      path.read_text(), re.M)
    )
    assert importers == ["kimi_k26.py", "status.py"], importers
