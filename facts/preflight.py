"""Facts only preflight and the run lock ask: a pip wheel resolution and the lock file."""

from __future__ import annotations

import json
import shlex
from typing import Any

from pyinfra.api import FactBase, QuoteString, StringCommand
from typing_extensions import override

WHEEL_OK = "specfleet-wheel-ok"


def parse_wheel_check(output: list[str]) -> str | None:
    """None when pip resolved a wheel, else pip's error (its last lines)."""
    if any(line.strip() == WHEEL_OK for line in output):
        return None
    tail = [line for line in output if line.strip()][-6:]
    return "\n".join(tail) or "pip found no matching distribution"


class SGLangWheel(FactBase[Any]):
    """
    Whether pip on the host resolves ``requirement`` for the host's interpreter and glibc, with
    the given pip source arguments, without installing anything. ``None`` when it does, else pip's
    error text.

    .. code:: python

        "ERROR: Could not find a version that satisfies the requirement sglang==0.5.13 ..."
    """

    @override
    def command(self, python: str, requirement: str, pip_args: list[str] | None = None):
        # --target keeps Debian's externally-managed guard out of a dry resolution.
        return StringCommand(
            QuoteString(python), "-m", "pip", "install", "--dry-run", "--no-deps",
            "--ignore-installed", "--disable-pip-version-check", "--quiet",
            "--target", "/tmp/specfleet-wheel-check",
            *[QuoteString(a) for a in pip_args or []], QuoteString(requirement),
            "2>&1", "&&", "echo", WHEEL_OK, "||", "true",
        )

    @override
    def process(self, output: list[str]) -> str | None:
        return parse_wheel_check(output)


LOCK_META = "##specfleet-lock-meta"


def parse_run_lock(output: list[str]) -> dict | None:
    """The RunLock value from its command's output: ``None`` when there is no lock, else the
    lock's JSON with ``host_now`` (the host's clock) and ``mtime`` (when it was last written);
    a lock that is not a JSON object reads as ``{"owner": "unknown", "unreadable": ...}``."""
    meta: dict[str, float] = {}
    body = []
    for line in output:
        if line.startswith(LOCK_META):
            words = line[len(LOCK_META) :].split()
            for key, word in zip(("host_now", "mtime"), words, strict=False):
                try:
                    meta[key] = float(word)
                except ValueError:
                    pass
        else:
            body.append(line)
    text = "\n".join(body).strip()
    if not text and not meta:
        return None
    try:
        value = json.loads(text) if text else None
    except ValueError:
        value = None
    if not isinstance(value, dict):
        value = {"owner": "unknown", "unreadable": text[:200]}
    value.update(meta)
    return value


class RunLock(FactBase[Any]):
    """
    The per-host run lock (``specfleet.core.runlock``): who holds it, since when and until when,
    or ``None`` when nobody does. ``host_now`` is the host's clock when it was read, ``mtime``
    when the lock was last written (taken or renewed).

    .. code:: python

        {"owner": "ops@laptop", "control_host": "laptop", "machine_id": "9f1c...",
         "boot_id": "2d7a...", "pid": 4242, "pid_start": 81723, "run_id": "5e0b7c1d2a9f4e63",
         "command": "pyinfra inventories/ct200.py deploys/kimi_k26.py",
         "taken_at": 1796050620.0, "expires_at": 1796050860.0, "lease_s": 180.0,
         "host_now": 1796050700.2, "mtime": 1796050680.0}
    """

    @override
    def command(self, path: str) -> str:
        q = shlex.quote(path)
        return (f'! test -f {q} || {{ echo "{LOCK_META} $(date +%s) $(stat -c %Y {q})"; '
                f"cat {q}; }}")

    @override
    def process(self, output: list[str]) -> dict | None:
        return parse_run_lock(output)


class WritableByOthers(FactBase[dict[str, str]]):
    """
    Of each given path (a venv, an SGLang source tree), the first place a user other than root
    could change what root runs from it: the path or a folder above it not owned by root or
    writable by group or others (a sticky folder too: its other users' files), or, with
    ``trees``, a file or folder inside it, or, with ``venvs``, a venv's entry that decides what
    its interpreter runs first (``bin/``, ``pyvenv.cfg``, the site-packages folder and what is
    directly in it: its ``.pth`` files, its packages' folders). A path that does not exist yet
    is checked from its nearest existing folder. ``{path: "PLACE (uid U, mode M)"}``; a path
    with nothing is left out.

    + paths: absolute paths checked with their parents
    + trees: those of ``paths`` whose whole tree is checked too
    + venvs: those of ``paths`` that are venvs, whose top levels are checked too

    .. code:: python

        {"/home/alice/sglang/python": "/home/alice (uid 1000, mode 755)"}
    """

    @staticmethod
    def default() -> dict[str, str]:
        return {}

    @override
    def command(self, paths: list[str], trees: list[str] | None = None,
                venvs: list[str] | None = None) -> str:
        parts = []
        for path in paths:
            q = shlex.quote(path)
            # The whole tree, or a venv's top levels (the globs stay outside the quotes).
            starts = q if path in (trees or []) else (
                f"{q} {q}/bin {q}/lib* {q}/lib*/python* {q}/lib*/python*/site-packages "
                "-maxdepth 1" if path in (venvs or []) else None)
            inner = (f'bad=$(find {starts} -xdev \\( ! -user 0 -o -perm /022 \\) ! -type l '
                     "-printf '%p (uid %U, mode %m)\\n' 2>/dev/null | head -n 1); "
                     f'[ -n "$bad" ] && echo "{TRUST_MARK}{path}=$bad" && continue; ') if starts \
                else ""  # fmt: skip
            parts.append(
                f"for once in 1; do {inner}p={q}; "
                'while [ ! -e "$p" ] && [ "$p" != / ]; do p=$(dirname "$p"); done; '
                'while :; do s=$(stat -L -c "%u %a" "$p" 2>/dev/null) || break; '
                'set -- $s; m=$((0$2)); '
                'if [ "$1" != 0 ] || [ $((m & 18)) -ne 0 ]; then '
                f'echo "{TRUST_MARK}{path}=$p (uid $1, mode $2)"; continue 2; fi; '
                '[ "$p" = / ] && break; p=$(dirname "$p"); done; done')
        return "; ".join(parts) + "; true"

    @override
    def process(self, output: list[str]) -> dict[str, str]:
        out = {}
        for line in output:
            if line.startswith(TRUST_MARK) and "=" in line:
                path, _, where = line[len(TRUST_MARK):].partition("=")
                out[path] = where
        return out


TRUST_MARK = "##untrusted "


def trust_args(venv: str, source_path: str | None = None) -> dict[str, Any]:
    """``WritableByOthers``' arguments for SGLang's venv and an SGLang source tree: the venv
    with its top levels, the tree with all that is in it, each with the folders above it. One
    builder, so that the preflight's, the probe's and the install's ask the same fact."""
    paths, trees = [venv], []
    if source_path:
        paths.append(source_path)
        trees.append(source_path)
    return {"paths": paths, "trees": trees, "venvs": [venv]}
