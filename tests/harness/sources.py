"""The real upstream sources tests read: SGLang wheels from PyPI and the PR#20547 head.

- ``sglang_wheel(V)``: the PyPI wheel of sglang V, from the one wheel cache
  (``tests.harness.wheelhouse``: filled from PyPI by the test command, ``python -m tests.fleet
  prepare``, or here on first use);
- ``lay_ddtree_fork(site)`` / ``ddtree_fork_site()``: the DDTree fork's tree from
  ``../shared/fixtures/sglang-ddtree-fork/``, laid into a site-packages as its README says;
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

# Run on a host (``python3 -c RECORD_CHECK SITE``): every ``sglang/`` file of the installed
# wheel against its RECORD. Prints ``record: ok``, or ``record:`` and the paths that differ.
# No single quote inside: callers put it in a shell's '...'.
RECORD_CHECK = """
import base64, csv, hashlib, pathlib, sys
site = pathlib.Path(sys.argv[1])
record = next(site.glob("sglang-*.dist-info")) / "RECORD"
bad = []
for row in csv.reader(record.read_text().splitlines()):
    path, digest = row[0], row[1]
    if not digest or not path.startswith("sglang/"):
        continue
    algo, _, want = digest.partition("=")
    data = (site / path).read_bytes() if (site / path).exists() else b"<missing>"
    got = base64.urlsafe_b64encode(hashlib.new(algo, data).digest()).rstrip(b"=").decode()
    if got != want:
        bad.append(path)
print("record:", "ok" if not bad else " ".join(bad))
"""


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


# --------------------------------------------------------------------------------------------------
# The DDTree fork's tree (DB-Guo/sglang-ddtree-dev 514ea1f3e), as its fixture README lays it in
# --------------------------------------------------------------------------------------------------

DDTREE_FORK_DIR = SHARED / "fixtures" / "sglang-ddtree-fork"
DDTREE_FORK_COMMIT = "514ea1f3e"
DDTREE_FORK_TARBALL = DDTREE_FORK_DIR / f"sglang-ddtree-fork-{DDTREE_FORK_COMMIT}-python.tar.gz"
DDTREE_FORK_SHA256 = "926db23068f3fc5764bfddae6f7ed02cd3ba1f67943689f097c38fdcb12f48f4"
# setuptools-scm's fallback: the version a source build of this tree reports.
DDTREE_FORK_VERSION = "0.0.0.dev0"


def lay_ddtree_fork(site: Path) -> Path:
    """Lay the fork's ``python/sglang`` into the folder ``site`` (a site-packages) as a source
    install looks, with a ``sglang-0.0.0.dev0.dist-info`` (its pyproject needs a Rust extension
    and git, so pip cannot build it here; see the fixture README). Returns the ``sglang`` folder."""
    data = _need(DDTREE_FORK_TARBALL).read_bytes()
    if hashlib.sha256(data).hexdigest() != DDTREE_FORK_SHA256:
        raise ValueError(f"{DDTREE_FORK_TARBALL} does not have the recorded sha256")
    site.mkdir(parents=True, exist_ok=True)
    with tarfile.open(DDTREE_FORK_TARBALL) as tar:
        # Regular files and folders: a few links point into the repository outside python/.
        members = [m for m in tar.getmembers()
                   if m.name.startswith("python/sglang/") and (m.isfile() or m.isdir())]
        for m in members:
            m.name = m.name[len("python/"):]
        tar.extractall(site, members=members, filter="data")
    info = site / f"sglang-{DDTREE_FORK_VERSION}.dist-info"
    info.mkdir(exist_ok=True)
    (info / "METADATA").write_text(
        f"Metadata-Version: 2.1\nName: sglang\nVersion: {DDTREE_FORK_VERSION}\n"
    )
    (info / "INSTALLER").write_text("specfleet-tests (the DDTree fork's tree, laid in)\n")
    return site / "sglang"


@cache
def ddtree_fork_site() -> Path:
    """One laid-in copy of the fork per test process, in a temporary folder removed at exit."""
    import atexit
    import shutil
    import tempfile

    site = Path(tempfile.mkdtemp(prefix="specfleet-ddtree-fork-"))
    atexit.register(shutil.rmtree, site, ignore_errors=True)
    lay_ddtree_fork(site)
    return site


# Where the fleet tests and the demo lay the fork's tree on a host: its python/ folder as a
# checkout's, and a venv holding it as a source install of that folder looks (pip's
# direct_url.json names the folder, and the venv records the tree's content as sglang.installed
# does after a build: specfleet's sglang.kind "source" key).
DDTREE_FORK_HOST_SRC = "/opt/src/sglang-ddtree-fork/python"


def ddtree_fork_host_script(tarball: str, venv: str, src: str = DDTREE_FORK_HOST_SRC) -> str:
    """The shell that lays the fork's tree (the tarball, already copied to ``tarball`` on the
    host) into ``src`` and into a new ``venv`` as its fixture README says; idempotent."""
    import shlex

    from facts.sglang import SOURCE_TREE_SCRIPT
    from specfleet.core.layout import source_key_path

    parent = src.rsplit("/", 1)[0]
    record = source_key_path(venv)
    return "\n".join([
        "set -e",
        f"mkdir -p {parent}",
        f"[ -d {src}/sglang ] || tar xzf {tarball} -C {parent} python/",
        # The tarball's modes are group-writable: root's alone, as preflight requires of a tree
        # root builds from (a user's write would be code root runs).
        f"chmod -R go-w {src}",
        f"[ -x {venv}/bin/python ] || python3 -m venv {venv}",
        f"site=$({venv}/bin/python -c 'import sysconfig; print(sysconfig.get_paths()[\"purelib\"])')",
        # Regular files only: a few links in the tree point outside python/.
        f'[ -d "$site/sglang" ] || (cp -a {src}/sglang "$site/" && '
        'find "$site/sglang" -type l -delete && chmod -R go-w "$site/sglang")',
        f'info="$site/sglang-{DDTREE_FORK_VERSION}.dist-info"',
        'mkdir -p "$info"',
        f'printf "Metadata-Version: 2.1\\nName: sglang\\nVersion: {DDTREE_FORK_VERSION}\\n" '
        '> "$info/METADATA"',
        'printf "specfleet-tests (the DDTree fork\'s tree, laid in)\\n" > "$info/INSTALLER"',
        f'printf \'{{"url": "file://{src}", "dir_info": {{}}}}\\n\' > "$info/direct_url.json"',
        # The tree's content as facts.sglang.SourceTreeKey reads it, recorded as the install does.
        f"mkdir -p {record.rsplit('/', 1)[0]}",
        f"key=$(python3 -I -S -c {shlex.quote(SOURCE_TREE_SCRIPT)} {src} /dev/null | "
        "sed -n \"s/.*'sha256': '\\([0-9a-f]*\\)'.*/\\1/p\")",
        f'[ -n "$key" ] && printf \'%s\\n\' "$key {src}" > {record}',
    ])
