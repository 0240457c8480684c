"""Facts about a host's rollback point: what was kept before a change, and what is there now."""

from __future__ import annotations

import shlex
from typing import Any

from pyinfra.api import FactBase
from typing_extensions import override

# The files of a server that a rollback point keeps, by the name they have in it: the server's
# own files (``ServerPaths.files``), the one list.
from specfleet.core.layout import FILE_KEYS, join, patch_state_dir, rope_state_dir, venv_python

# The patch states a point keeps, by the name of their folder in it: PR#20547's port and the
# drafter RoPE patch (each a state folder beside the venv, its marker ``sha256`` written last).
PATCH_KEYS = ("patch", "rope")

ABSENT = "-"


class RollbackState(FactBase[dict[str, Any]]):
    """
    A rollback point kept on the host (``directory``) beside the state it would return to, read
    with one command: the sha1 of the server's files (unit, env, secret, logging config and its
    module), the PR#20547 marker's sha256 (``patch``), the drafter RoPE patch's marker (``rope``,
    issue #52) and the venv's ``pip freeze``, each as saved and as it is now, plus the wheels in
    the cache. A point taken before it kept the RoPE state has ``rope`` None: not applied then.
    ``saved`` is None until a rollback point exists; a file that was absent when it was taken is
    ``None`` in ``saved``, as it is in ``current`` while it does not exist.

    + directory: the rollback point's folder (``<state_dir>/rollback/<service>``)
    + unit, env, secret, log_config, log_module: the live paths of the server's files
    + venv: the SGLang venv
    + wheels: the wheel cache folder

    .. code:: python

        {
            "saved": {"unit": "0b5c...", "env": "9e1d...", "secret": None, "patch": None,
                      "rope": "4e07...", "freeze": ["compressed-tensors==0.9.4", "sglang==0.5.11"],
                      "taken": "2026-11-30T15:20:01+00:00"},
            "current": {"unit": "77aa...", "env": "9e1d...", "secret": None, "patch": None,
                        "rope": None, "freeze": ["compressed-tensors==0.9.4", "sglang==0.5.14"],
                        "freeze_error": None},
            "wheels": ["sglang-0.5.11-py3-none-any.whl"],
        }
    """

    @staticmethod
    def default() -> dict[str, Any]:
        return parse_rollback_state([])

    @override
    def command(
        self, directory: str, unit: str, env: str, secret: str, venv: str, wheels: str,
        log_config: str = "", log_module: str = "",
    ) -> str:
        d = shlex.quote(directory)
        py = shlex.quote(venv_python(venv))
        # The markers of an applied PR#20547 and drafter RoPE patch (operations.sglang writes
        # each last).
        markers = {"patch": patch_state_dir(venv), "rope": rope_state_dir(venv)}
        parts = []
        live = (unit, env, secret, log_config, log_module)
        for key, path in zip(FILE_KEYS, live, strict=True):
            if not path:
                continue
            saved = shlex.quote(join(directory, key))
            for side, q in (("cur", shlex.quote(path)), ("saved", saved)):
                parts.append(
                    f'if test -e {q}; then echo "{side}.{key}=$(sha1sum < {q} | cut -c1-40)"; fi'
                )
        for key in PATCH_KEYS:
            cur = shlex.quote(join(markers[key], "sha256"))
            saved = shlex.quote(join(directory, key, "sha256"))
            parts += [
                f'if test -e {cur}; then echo "cur.{key}=$(cat {cur})"; fi',
                f'if test -e {saved}; then echo "saved.{key}=$(cat {saved})"; fi',
            ]
        parts += [
            f"if test -e {d}/taken; then echo \"saved.taken=$(cat {d}/taken)\"; fi",
            f"if test -e {d}/freeze.txt; then sed 's/^/saved.freeze:/' {d}/freeze.txt; fi",
            # pip's own answer: direct references (git, file) come out as `name @ url`. Its
            # output goes to a file in a folder of mktemp's (a random name, made with O_EXCL,
            # mode 0700: this user's alone), never to a predictable path another user could
            # plant a link at first.
            f"if test -x {py}; then if t=$(mktemp -d); then "
            f"if {py} -m pip freeze --disable-pip-version-check > \"$t/freeze\" 2>&1; "
            "then sed 's/^/cur.freeze:/' \"$t/freeze\"; "
            "else sed 's/^/cur.freeze-error:/' \"$t/freeze\"; fi; rm -rf \"$t\"; "
            "else echo 'cur.freeze-error:mktemp -d failed: no temporary folder'; fi; fi",
            f"if test -d {shlex.quote(wheels)}; then ls -1 {shlex.quote(wheels)} "
            "| sed 's/^/wheel:/'; fi",
        ]
        return "; ".join(parts)

    @override
    def process(self, output: list[str]) -> dict[str, Any]:
        return parse_rollback_state(output)


def parse_rollback_state(output: list[str]) -> dict[str, Any]:
    """``RollbackState``'s output -> its value (pure)."""
    cur: dict[str, Any] = {k: None for k in (*FILE_KEYS, *PATCH_KEYS)}
    cur["freeze"], cur["freeze_error"] = [], None
    saved: dict[str, Any] = {k: None for k in (*FILE_KEYS, *PATCH_KEYS, "taken")}
    saved["freeze"] = []
    wheels: list[str] = []
    errors: list[str] = []
    for line in output:
        if line.startswith("cur.freeze:"):
            cur["freeze"].append(line[len("cur.freeze:") :])
        elif line.startswith("cur.freeze-error:"):
            errors.append(line[len("cur.freeze-error:") :])
        elif line.startswith("saved.freeze:"):
            saved["freeze"].append(line[len("saved.freeze:") :])
        elif line.startswith("wheel:"):
            wheels.append(line[len("wheel:") :])
        elif "=" in line and line.split("=", 1)[0] in (
            *(f"cur.{k}" for k in (*FILE_KEYS, *PATCH_KEYS)),
            *(f"saved.{k}" for k in (*FILE_KEYS, *PATCH_KEYS, "taken")),
        ):
            key, value = line.split("=", 1)
            side, name = key.split(".", 1)
            (cur if side == "cur" else saved)[name] = value.strip() or None
    if errors:
        cur["freeze_error"] = "\n".join(errors)
    return {
        "saved": saved if saved["taken"] else None,
        "current": cur,
        "wheels": sorted(wheels),
    }
