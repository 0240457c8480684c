"""The SGLang fact fixtures the plan tests use, and how they were made.

tests/fixtures/sglang/<name>.json hold ``facts.sglang.SGLangInstall`` values read from real SGLang
code: the PyPI wheels 0.5.11, 0.5.14 and 0.5.23 (``pip download --no-deps --python-version 3.11
--only-binary=:all: sglang==V``) and, for the PR#20547 build, the PR's head commit e67a0d488
(modal-labs/sglang branch dflash_v2, the branch `refs/pull/20547/head` points at).

Regenerate (needs the wheels in $SPECFLEET_WHEELS, default /var/cache/specfleet/wheels-plan, and
for pr20547 a git clone of modal-labs/sglang in $SPECFLEET_PR20547_GIT)::

    .venv/bin/python -m tests.test_plan_sglang_fixtures --write

The tests below re-read the sources when they are present and compare with the fixtures, so a
fixture cannot drift from what the code says. When facts.sglang exists, its parser is the one to
use; until then ``extract`` reads the same files the facts contract names.
"""

from __future__ import annotations

import ast
import json
import os
import re
import subprocess
import sys
import zipfile
from collections.abc import Callable
from pathlib import Path

import pytest

FIXTURES = Path(__file__).parent / "fixtures" / "sglang"
WHEELS = Path(os.environ.get("SPECFLEET_WHEELS", "/var/cache/specfleet/wheels-plan"))
PR20547_GIT = Path(os.environ.get("SPECFLEET_PR20547_GIT", "/work/.mirror/modal-labs+sglang/repo"))
PR20547_COMMIT = "e67a0d488"
RELEASES = ("0.5.11", "0.5.14", "0.5.23")

Reader = Callable[[str], "str | None"]


def _enum_members(source: str, cls: str) -> list[str]:
    tree = ast.parse(source)
    for node in ast.walk(tree):
        if isinstance(node, ast.ClassDef) and node.name == cls:
            names = []
            for stmt in node.body:
                if isinstance(stmt, ast.Assign) and len(stmt.targets) == 1:
                    target = stmt.targets[0]
                    if isinstance(target, ast.Name) and target.id.isupper():
                        names.append(target.id)
            return names
    return []


def extract(read: Reader, names: list[str], location: str | None) -> dict:
    """The SGLangInstall value for a tree given as a file reader (paths under ``sglang/``)."""
    files = set(names)
    spec = "sglang/srt/speculative/"
    version_src = read("sglang/_version.py") or read("sglang/version.py") or ""
    # The wheels' _version.py (vcs-versioning) reads `__version__ = version = '0.5.11'`.
    m = re.search(r"^__version__\s*=[^'\"\n]*['\"]([^'\"]+)['\"]", version_src, re.M)
    environ = read("sglang/srt/environ.py") or ""
    has_v1 = spec + "dflash_worker.py" in files
    has_v2 = spec + "dflash_worker_v2.py" in files
    spec_info = read(spec + "spec_info.py") or ""
    algos = _enum_members(spec_info, "SpeculativeAlgorithm")
    registry = read("sglang/srt/layers/attention/attention_registry.py") or ""
    deepseek = read("sglang/srt/models/deepseek_v2.py") or ""
    return {
        "version": m.group(1) if m else None,
        "location": location,
        "features": {
            "dflash": "v2" if has_v2 else "v1" if has_v1 else None,
            "dflash_pr20547": has_v2 and "SGLANG_ENABLE_DFLASH_SPEC_V2" in environ,
            "ddtree": any(n.startswith(spec + "ddtree") for n in files) or "DDTREE" in algos,
            "kimi_k25_model": "sglang/srt/models/kimi_k25.py" in files,
            "deepseek_v3_model": "DeepseekV3ForCausalLM" in deepseek,
            "compressed_tensors_quant": any(
                n.startswith("sglang/srt/layers/quantization/compressed_tensors/") for n in files
            ),
        },
        "speculative_algorithms": algos,
        "attention_backends": sorted(
            set(re.findall(r"register_attention_backend\(\s*['\"]([\w-]+)['\"]", registry))
        ),
    }


def _location(version: str) -> str:
    # Where the fleet's venv (settings.venv) puts it on a bookworm host (python3.11).
    return "/opt/specfleet/sglang/lib/python3.11/site-packages/sglang"


def from_wheel(version: str) -> dict | None:
    wheels = sorted(WHEELS.glob(f"sglang-{version}-*.whl"))
    if not wheels:
        return None
    with zipfile.ZipFile(wheels[0]) as zf:
        names = zf.namelist()

        def read(name: str) -> str | None:
            try:
                return zf.read(name).decode("utf-8")
            except KeyError:
                return None

        return extract(read, names, _location(version))


def from_pr20547() -> dict | None:
    if not (PR20547_GIT / "HEAD").exists() and not (PR20547_GIT / ".git").exists():
        return None
    git = ["git", "-C", str(PR20547_GIT)]
    listing = subprocess.run(
        [*git, "ls-tree", "-r", "--name-only", PR20547_COMMIT, "python/sglang/"],
        capture_output=True,
        text=True,
    )
    if listing.returncode != 0:
        return None
    names = [n[len("python/") :] for n in listing.stdout.splitlines()]

    def read(name: str) -> str | None:
        out = subprocess.run(
            [*git, "show", f"{PR20547_COMMIT}:python/{name}"], capture_output=True, text=True
        )
        return out.stdout if out.returncode == 0 else None

    # version is None: the source tree has no sglang/_version.py (setuptools-scm writes it at
    # build time, from upstream tags this mirror lacks).
    return extract(read, names, _location("pr20547"))


SOURCES: dict[str, Callable[[], dict | None]] = {
    **{v: (lambda v=v: from_wheel(v)) for v in RELEASES},
    "pr20547": from_pr20547,
}


def load(name: str) -> dict:
    return json.loads((FIXTURES / f"{name}.json").read_text())["fact"]


@pytest.mark.parametrize("name", sorted(SOURCES))
def test_fixture_matches_source(name):
    fact = SOURCES[name]()
    if fact is None:
        pytest.skip(f"source for {name} not here (wheel cache / PR#20547 clone)")
    assert load(name) == fact


@pytest.mark.parametrize("name", RELEASES)
def test_version_table_agrees_with_wheel_fixture(name):
    """deploys.versions predicts what the real wheel has."""
    from deploys.versions import predicted_install

    fact = load(name)
    predicted = predicted_install(fact["version"])
    assert predicted["features"] == fact["features"]
    assert predicted["speculative_algorithms"] == fact["speculative_algorithms"]
    assert predicted["attention_backends"] == fact["attention_backends"]


def test_pr20547_row_agrees_with_fixture():
    from deploys.versions import PR20547

    fact = load("pr20547")
    assert fact["features"] == PR20547.features()
    assert fact["speculative_algorithms"] == list(PR20547.speculative_algorithms)
    assert fact["attention_backends"] == sorted(PR20547.attention_backends)


def _write() -> int:
    FIXTURES.mkdir(parents=True, exist_ok=True)
    notes = {
        **{
            v: f"read from the PyPI wheel sglang-{v}-cp311-cp311-manylinux_2_34_x86_64.whl "
            "(pip download --no-deps --python-version 3.11 --only-binary=:all:)"
            for v in RELEASES
        },
        "pr20547": f"read from modal-labs/sglang commit {PR20547_COMMIT} (branch dflash_v2, the "
        "head of sgl-project/sglang PR#20547); version null: the source tree has no _version.py "
        "(setuptools-scm writes it when a git install is built)",
    }
    for name, source in SOURCES.items():
        fact = source()
        if fact is None:
            print(f"skip {name}: source not here", file=sys.stderr)
            continue
        doc = {
            "note": notes[name] + "; made by tests/test_plan_sglang_fixtures.py --write. "
            "location is where settings.venv puts it on a fleet host.",
            "fact": fact,
        }
        (FIXTURES / f"{name}.json").write_text(json.dumps(doc, indent=2) + "\n")
        print(f"wrote {name}")
    return 0


if __name__ == "__main__":
    if sys.argv[1:] != ["--write"]:
        print("usage: python -m tests.test_plan_sglang_fixtures --write", file=sys.stderr)
        sys.exit(2)
    sys.exit(_write())
