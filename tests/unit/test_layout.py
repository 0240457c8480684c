"""Every host path has one home: ``specfleet/core/layout.py``. Nothing else joins one.

The scan reads the source of every floor (``specfleet/`` but the host-side programs, which run
alone on the host, ``operations/``, ``facts/``, ``deploys/``) for a path joined onto one of the
roots a host path starts from: a ``Settings`` folder (``venv``, ``state_dir``, ``models_root``, a
textfile folder), the tools' venv, or a literal root of specfleet's own (``/etc/specfleet``,
``/opt/specfleet``, ...), by ``posixpath.join``/``os.path.join`` or an f-string, and a venv's
``bin/python`` spelled out anywhere.
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

from specfleet.core import layout
from specfleet.core.settings import settings_from_dict
from specfleet.hostside import fanout_agent

ROOT = Path(__file__).resolve().parents[2]
LAYOUT = ROOT / "specfleet" / "core" / "layout.py"
SCANNED = ("specfleet", "operations", "facts", "deploys")
# Names that hold a folder a host path is joined onto (settings fields, the tools' venv).
ROOT_NAMES = {"venv", "state_dir", "models_root", "textfile_dir", "tools_path", "TOOLS_PATH"}
LITERAL_ROOTS = ("/etc/specfleet", "/etc/systemd", "/opt/specfleet", "/var/lib/specfleet",
                 "/root/.cache")  # fmt: skip


def _root_name(node: ast.AST) -> str | None:
    """The root a path expression starts from: ``s.venv``, ``venv.rstrip('/')``, ``TOOLS_PATH``."""
    while isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute):
        node = node.func.value  # venv.rstrip("/")
    if isinstance(node, ast.Attribute) and node.attr in ROOT_NAMES:
        return node.attr
    if isinstance(node, ast.Name) and node.id in ROOT_NAMES:
        return node.id
    return None


def hand_joins(path: Path) -> list[str]:
    tree = ast.parse(path.read_text(), str(path))
    found = []
    for node in ast.walk(tree):
        where = f"{path.relative_to(ROOT) if path.is_relative_to(ROOT) else path}:" \
            f"{getattr(node, 'lineno', '?')}"
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute):
            f = node.func
            if (f.attr == "join" and isinstance(f.value, (ast.Name, ast.Attribute))
                    and ast.unparse(f.value) in ("posixpath", "os.path") and node.args
                    and _root_name(node.args[0])):  # fmt: skip
                found.append(f"{where}: {ast.unparse(node)}")
        elif isinstance(node, ast.JoinedStr) and node.values:
            first = node.values[0]
            if isinstance(first, ast.FormattedValue) and _root_name(first.value) and any(
                isinstance(v, ast.Constant) and str(v.value).startswith("/") for v in node.values
            ):
                found.append(f"{where}: {ast.unparse(node)}")
            elif isinstance(first, ast.Constant) and str(first.value).startswith(LITERAL_ROOTS):
                found.append(f"{where}: {ast.unparse(node)}")
        elif isinstance(node, ast.Constant) and isinstance(node.value, str):
            if re.fullmatch(r"(\S*/)?bin/python", node.value):
                found.append(f"{where}: {node.value!r}")
    return found


def scanned_files() -> list[Path]:
    files = []
    for top in SCANNED:
        for path in sorted((ROOT / top).rglob("*.py")):
            if path == LAYOUT or "hostside" in path.parts:
                continue
            files.append(path)
    return files


def test_no_host_path_is_joined_outside_the_layout():
    found = [hit for path in scanned_files() for hit in hand_joins(path)]
    assert not found, "host paths joined outside specfleet/core/layout.py:\n" + "\n".join(found)


def test_the_scan_sees_each_kind_of_hand_join(tmp_path):
    # The scan itself: each way a path was joined by hand before the layout existed is caught.
    sample = tmp_path / "sample.py"
    sample.write_text(
        "import posixpath\n"
        "def f(s, venv, TOOLS_PATH):\n"
        "    a = posixpath.join(s.venv, 'bin', 'python')\n"
        "    b = f\"{venv.rstrip('/')}/lib\"\n"
        "    c = f'/etc/specfleet/{s.service_name}.env'\n"
        "    d = f'{TOOLS_PATH}/weights_agent.py'\n"
        "    return a, b, c, d\n"
    )
    hits = hand_joins(sample)
    assert len(hits) == 4, hits


def test_paths_are_the_ones_the_hosts_have():
    s = settings_from_dict({"venv": "/root/venv/", "models_root": "/srv/models",
                            "service_name": "kimi"})  # fmt: skip
    server = layout.server_paths(s)
    assert server.unit == "/etc/systemd/system/kimi.service"
    assert server.env == "/etc/specfleet/kimi.env"
    assert server.secret == "/etc/specfleet/secrets/kimi.yaml"
    assert server.marker == "/var/lib/specfleet/kimi.restart-pending"
    assert server.cache_root == "/srv/models/.cache"
    assert server.log_module == "/etc/specfleet/kimi.logging/specfleet_log_redact.py"
    assert layout.sglang_python(s) == "/root/venv/bin/python"
    assert layout.model_root(s, "drafter") == "/srv/models/z-lab--Kimi-K2.6-DFlash"
    assert layout.lock_path(s) == "/var/lib/specfleet/run.lock"
    assert layout.control_token_path(s) == "/var/lib/specfleet/hf/token"
    assert layout.tools_python() == "/opt/specfleet/tools/bin/python"
    assert layout.watchdog_paths(s).program == "/opt/specfleet/watchdog/kimi/watchdog.py"


def test_the_fanout_agent_names_the_progress_files_where_the_layout_does():
    # The agent runs alone on the host and computes them itself: both must agree.
    s = settings_from_dict({})
    root = layout.model_root(s, "target")
    name = root.rsplit("/", 1)[1]
    assert fanout_agent.weights_progress_path(s.state_dir, name) == (
        layout.weights_job_paths(s.state_dir, root).progress
    )
    assert fanout_agent.pull_progress_path(s.state_dir, name).startswith(
        layout.fanout_dir(s.state_dir) + "/"
    )
