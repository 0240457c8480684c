"""What of specfleet's footprint is on a host: the fact ``operations.removal`` works from."""

from __future__ import annotations

import shlex
from typing import Any

from pyinfra.api import FactBase
from typing_extensions import override

from specfleet.core.sglang.install import CREATED_MARKER

# Inside a venv: specfleet's own folder (PR#20547's journal and marker, a rejected port, the
# created-by-specfleet marker).
VENV_STATE_DIR = CREATED_MARKER.split("/", 1)[0]


def shell_glob(pattern: str) -> str:
    """``pattern`` for a shell word: quoted, with a trailing ``*`` left to the shell."""
    if pattern.endswith("*"):
        return shlex.quote(pattern[:-1]) + "*"
    return shlex.quote(pattern)


class Leftovers(FactBase[dict[str, Any]]):
    """
    Which of the given paths, units and venvs are on the host. A pattern may end in ``*`` (a
    prefix glob, expanded on the host).

    + paths: files and folders (patterns)
    + units: systemd unit names (patterns): loaded units and unit files
    + dirs: folders, reported only when they exist and are empty
    + venvs: venvs (patterns): whether specfleet created each, whether it has specfleet's
      folder in it, and whether it is a venv at all (its ``pyvenv.cfg``)

    .. code:: python

        {
            "paths": ["/etc/specfleet/specfleet-sglang.env", "/var/lib/specfleet/hf"],
            "units": {"specfleet-sglang.service": {"active": "active", "enabled": "enabled"}},
            "empty_dirs": [],
            "venvs": {"/opt/specfleet/sglang": {"created": True, "specfleet": True, "venv": True}},
        }
    """

    @staticmethod
    def default() -> dict[str, Any]:
        return parse_leftovers([])

    @override
    def command(self, paths: list[str], units: list[str], dirs: list[str],
                venvs: list[str]) -> str:
        globs = " ".join(shell_glob(p) for p in paths)
        names = " ".join(shlex.quote(u) for u in units)
        folders = " ".join(shlex.quote(d) for d in dirs)
        envs = " ".join(shell_glob(v) for v in venvs)
        parts = [
            f'for p in {globs}; do if [ -e "$p" ] || [ -L "$p" ]; then echo "path=$p"; fi; done',
            f'for p in {folders}; do if [ -d "$p" ] && [ -z "$(ls -A "$p")" ]; then '
            'echo "empty=$p"; fi; done',
            f'for p in {envs}; do if [ -d "$p" ]; then '
            f'c=0; [ -e "$p/{CREATED_MARKER}" ] && c=1; s=0; [ -d "$p/{VENV_STATE_DIR}" ] && s=1; '
            'v=0; [ -f "$p/pyvenv.cfg" ] && v=1; echo "venv=$c$s$v$p"; fi; done',
        ]
        if units:
            parts += [
                f"systemctl list-units --all --plain --no-legend --no-pager {names} 2>/dev/null "
                "| while read -r u load active rest; do echo \"unit=$u $active\"; done",
                f"systemctl list-unit-files --no-legend --no-pager {names} 2>/dev/null "
                "| while read -r u st rest; do echo \"unitfile=$u $st\"; done",
            ]
        return "; ".join(parts) + "; true"

    @override
    def process(self, output: list[str]) -> dict[str, Any]:
        return parse_leftovers(output)


def parse_leftovers(output: list[str]) -> dict[str, Any]:
    """``Leftovers``' output -> its value (pure)."""
    value: dict[str, Any] = {"paths": [], "units": {}, "empty_dirs": [], "venvs": {}}
    for line in output:
        key, _, rest = line.partition("=")
        if key == "path" and rest:
            value["paths"].append(rest)
        elif key == "empty" and rest:
            value["empty_dirs"].append(rest)
        elif key == "venv" and len(rest) > 3:
            value["venvs"][rest[3:]] = {"created": rest[0] == "1", "specfleet": rest[1] == "1",
                                        "venv": rest[2] == "1"}
        elif key in ("unit", "unitfile") and " " in rest:
            name, state = rest.split(" ", 1)
            unit = value["units"].setdefault(name, {"active": "inactive", "enabled": None})
            unit["active" if key == "unit" else "enabled"] = state.strip()
    value["paths"] = sorted(set(value["paths"]))
    return value
