"""The fleet's wheelhouse: real PyPI wheels for the hosts' Python (CPython 3.11, manylinux x86_64).

Downloaded once into ``/var/cache/specfleet/wheelhouse`` (outside the repository) and served by
each fleet on its bridge (``Fleet.wheelhouse_url``, a find-links directory listing; a PEP 503 index
of the same files is at ``<url>simple/``). The hosts have no route out, so this is all they get.
"""

from __future__ import annotations

import fcntl
import hashlib
import html
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

from tests.harness.releases import WHEELHOUSE
from tests.harness.rootfs import CACHE_DIR

WHEELHOUSE_DIR = CACHE_DIR / "wheelhouse"

# Bookworm's interpreter. SGLang wheels are cp311 manylinux_2_34; everything else is manylinux
# 2014/2_17 or pure Python.
TARGET = [
    "--only-binary=:all:", "--python-version", "3.11", "--implementation", "cp", "--abi", "cp311",
    "--platform", "manylinux_2_34_x86_64", "--platform", "manylinux_2_28_x86_64",
    "--platform", "manylinux_2_17_x86_64", "--platform", "manylinux2014_x86_64",
]
# Each entry is one `pip download` (pins of one project must not share a resolve).
# (requirements, with_dependencies)
DOWNLOADS: list[tuple[list[str], bool]] = [
    *(([f"sglang=={release}"], False) for release in WHEELHOUSE),
    (["compressed-tensors==0.9.4"], False),
    (["compressed-tensors==0.18.0"], False),
    (["huggingface_hub", "packaging"], True),
]

# Wheels that are only upstream text for a recipe (the PR#20547 port's pinned sources, #52), not
# releases the tests install or judge (the version table and its tests read DOWNLOADS).
RECIPE_SOURCES: list[tuple[list[str], bool]] = [
    (["sglang==0.5.18"], False),
]


def _fingerprint() -> str:
    return hashlib.sha256(repr(DOWNLOADS + RECIPE_SOURCES).encode()).hexdigest()[:16]


def _marker() -> Path:
    return WHEELHOUSE_DIR / ".specfleet-wheelhouse"


def is_built() -> bool:
    m = _marker()
    return m.exists() and m.read_text().strip() == _fingerprint()


def _normalize(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def write_simple_index(d: Path) -> None:
    """A PEP 503 ``simple/`` index over the wheels in ``d`` (links point at ``../../<file>``)."""
    projects: dict[str, list[str]] = {}
    for whl in sorted(d.glob("*.whl")):
        projects.setdefault(_normalize(whl.name.split("-")[0]), []).append(whl.name)
    simple = d / "simple"
    shutil.rmtree(simple, ignore_errors=True)
    simple.mkdir()
    links = "".join(f'<a href="{p}/">{p}</a>\n' for p in sorted(projects))
    (simple / "index.html").write_text(f"<!DOCTYPE html>\n<html><body>\n{links}</body></html>\n")
    for project, files in projects.items():
        (simple / project).mkdir()
        links = "".join(f'<a href="../../{html.escape(f)}">{html.escape(f)}</a>\n' for f in files)
        (simple / project / "index.html").write_text(
            f"<!DOCTYPE html>\n<html><body>\n{links}</body></html>\n")


def ensure_wheelhouse(log=sys.stderr) -> Path:
    """Return the wheelhouse directory, downloading what is missing first (once per machine)."""
    if is_built():
        return WHEELHOUSE_DIR
    WHEELHOUSE_DIR.mkdir(parents=True, exist_ok=True)
    with open(CACHE_DIR / "wheelhouse.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if is_built():
            return WHEELHOUSE_DIR
        print(f"fleet: downloading wheels into {WHEELHOUSE_DIR} (once)...", file=log, flush=True)
        for reqs, deps in DOWNLOADS + RECIPE_SOURCES:
            argv = [sys.executable, "-m", "pip", "download", "--disable-pip-version-check",
                    "--quiet", "--dest", str(WHEELHOUSE_DIR), *TARGET, *reqs]
            if not deps:
                argv.append("--no-deps")
            r = subprocess.run(argv, capture_output=True, text=True)
            if r.returncode:
                raise RuntimeError(f"pip download {' '.join(reqs)} failed:\n{r.stderr[-3000:]}")
        write_simple_index(WHEELHOUSE_DIR)
        _marker().write_text(_fingerprint() + "\n")
        os.chmod(WHEELHOUSE_DIR, 0o755)
    return WHEELHOUSE_DIR


def contents() -> list[str]:
    return sorted(p.name for p in WHEELHOUSE_DIR.glob("*.whl"))
