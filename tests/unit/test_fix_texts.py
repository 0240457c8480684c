"""The texts specfleet shows (errors, their fixes, docstrings) name modules that exist: a module
renamed (``server`` became ``operations/serving.py``) must not live on in a fix that tells a user
to run ``server.unit``. Every string constant of the project's Python is read (AST), and each
``operations.X``, ``facts.X``, ``deploys/X.py`` it names must be a file of the checkout."""

from __future__ import annotations

import ast
import re
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
FOLDERS = ("specfleet", "operations", "facts", "deploys")
NAMED_RE = re.compile(r"(?<![\w./])(operations|facts)\.([a-z_]+)\b|\bdeploys/([a-z_0-9]+)\.py\b")
# The operations that lived in a module called `server` before it became operations/serving.py.
OLD_RE = re.compile(r"(?<![\w.])server\.(unit|service|restart_pending|ready|group_restart)\b")


def strings() -> list[tuple[str, str]]:
    out = []
    for folder in FOLDERS:
        for path in sorted((REPO / folder).rglob("*.py")):
            for node in ast.walk(ast.parse(path.read_text(), str(path))):
                if isinstance(node, ast.Constant) and isinstance(node.value, str):
                    out.append((f"{path.relative_to(REPO)}:{node.lineno}", node.value))
    return out


def exists(folder: str, name: str) -> bool:
    return (REPO / folder / f"{name}.py").is_file() or (REPO / folder / name).is_dir()


def test_no_text_names_the_old_server_module():
    found = [f"{where}: {m.group(0)}" for where, text in strings() for m in OLD_RE.finditer(text)]
    assert found == []


def test_every_module_a_text_names_exists():
    missing = []
    for where, text in strings():
        for m in NAMED_RE.finditer(text):
            folder, name = ("deploys", m.group(3)) if m.group(3) else (m.group(1), m.group(2))
            if not exists(folder, name):
                missing.append(f"{where}: {m.group(0)}")
    assert missing == []


def test_the_checks_see_what_they_look_for():
    assert OLD_RE.search("fix: run server.unit before server.service")
    assert not OLD_RE.search("serving.unit") and not OLD_RE.search("paths.server.unit")
    assert not exists("operations", "server") and exists("operations", "serving")
