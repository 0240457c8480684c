"""The real upstream sources tests read: SGLang wheels from PyPI and the PR#20547 head.

- ``sglang_wheel(V)``: the PyPI wheel of sglang V, from the one wheel cache
  (``tests.harness.wheelhouse``: filled from PyPI by the test command, ``python -m tests.fleet
  prepare``, or here on first use);
- ``pr20547_tree()``: the PR#20547 head's Python package (``modal-labs/sglang`` e67a0d488), read
  from ``../shared/fixtures/sglang-pr20547/`` (no network; ``SPECFLEET_SHARED`` overrides).

Neither skips: a test that needs them fails with what is missing and how to get it.
"""

from __future__ import annotations

import hashlib
import os
import tarfile
from collections.abc import Callable
from functools import cache
from pathlib import Path

from tests.harness.wheelhouse import WHEELHOUSE_DIR, ensure_wheelhouse

REPO_ROOT = Path(__file__).resolve().parents[2]
SHARED = Path(os.environ.get("SPECFLEET_SHARED") or REPO_ROOT.parent / "shared")
PR20547_DIR = SHARED / "fixtures" / "sglang-pr20547"
PR20547_COMMIT = "e67a0d488"
PR20547_TARBALL = PR20547_DIR / f"sglang-pr20547-{PR20547_COMMIT}-python.tar.gz"
PR20547_DIFF = PR20547_DIR / f"pr20547-head-{PR20547_COMMIT}.diff"
PR20547_DIFF_SHA256 = "1c844c0fdcab59266c0b1bb46e2099b86469364ffd5ad5ac436f1a7f2847d252"

Reader = Callable[[str], "str | None"]


def sglang_wheel(version: str) -> Path:
    """The cp311 manylinux wheel of sglang ``version`` (downloaded into the cache if missing)."""
    found = sorted(WHEELHOUSE_DIR.glob(f"sglang-{version}-cp311-*.whl"))
    if not found:
        ensure_wheelhouse()
        found = sorted(WHEELHOUSE_DIR.glob(f"sglang-{version}-cp311-*.whl"))
    if not found:
        raise FileNotFoundError(
            f"sglang {version} is not in the wheel cache {WHEELHOUSE_DIR}: add it to "
            "tests.harness.wheelhouse.DOWNLOADS and run `python -m tests.fleet prepare`"
        )
    return found[0]


def _need(path: Path) -> Path:
    if not path.is_file():
        raise FileNotFoundError(
            f"{path} is missing: the PR#20547 fixtures live in ../shared/fixtures/sglang-pr20547/ "
            "beside the checkout (or set SPECFLEET_SHARED to the shared/ folder)"
        )
    return path


@cache
def pr20547_files() -> dict[str, bytes]:
    """{path under ``python/`` (``sglang/srt/...``): bytes} of the PR head's package."""
    out = {}
    with tarfile.open(_need(PR20547_TARBALL)) as tar:
        for member in tar.getmembers():
            # members are sglang-pr20547-e67a0d488/python/...
            _, _, rel = member.name.partition("/python/")
            if member.isfile() and rel:
                out[rel] = tar.extractfile(member).read()
    return out


def pr20547_tree() -> tuple[Reader, list[str]]:
    """A reader of the PR head's files (paths ``sglang/...``) and their names."""
    files = pr20547_files()

    def read(name: str) -> str | None:
        data = files.get(name)
        return None if data is None else data.decode("utf-8")

    return read, sorted(files)


def pr20547_diff() -> bytes:
    """The PR's whole diff against its merge base, checked against its recorded sha256."""
    data = _need(PR20547_DIFF).read_bytes()
    if hashlib.sha256(data).hexdigest() != PR20547_DIFF_SHA256:
        raise ValueError(f"{PR20547_DIFF} does not have the recorded sha256 {PR20547_DIFF_SHA256}")
    return data
