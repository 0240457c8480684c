"""The SGLang fact fixtures the plan tests use, and how they were made.

tests/fixtures/sglang/<name>.json hold ``facts.sglang.SGLangInstall`` values read from real SGLang
code: the PyPI wheels 0.5.11, 0.5.14 and 0.5.23 (``pip download --no-deps --python-version 3.11
--only-binary=:all: sglang==V``) and, for the PR#20547 build, the PR's head commit e67a0d488
(modal-labs/sglang branch dflash_v2, the branch `refs/pull/20547/head` points at).

Regenerate (the wheels come from the wheel cache, the PR head from
``../shared/fixtures/sglang-pr20547/``; tests.harness.sources)::

    .venv/bin/python -m tests.unit.test_plan_sglang_fixtures --write

The values are what facts.sglang.SGLangInstall computes: its host-side collector is run (python -I)
on a minimal copy of each tree, then its parser. ``extract`` below is an independent reading of the
same files; a test checks that both agree. The tests re-read the sources when they are present
(the wheel cache, the PR#20547 fixture tarball) and compare with the fixtures, so a fixture cannot drift.
"""

from __future__ import annotations

import ast
import json
import re
import subprocess
import sys
import tempfile
import zipfile
from collections.abc import Callable
from pathlib import Path

import pytest

from facts import sglang as fact
from tests.harness.releases import EACH_KIND
from tests.harness.sources import PR20547_COMMIT, pr20547_tree, sglang_wheel

FIXTURES = Path(__file__).parents[1] / "fixtures" / "sglang"
RELEASES = EACH_KIND

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


def via_fact(read: Reader, names: list[str], location: str) -> dict:
    """The value facts.sglang.SGLangInstall computes for this tree: its real host-side collector
    run (python -I) on a minimal copy of the tree (the listed directories' entries, empty, plus
    the files it reads), then its parser."""
    request = {"dirs": fact.DIRS, "texts": fact.TEXTS, "lines": fact.LINES}
    with tempfile.TemporaryDirectory() as tmp:
        pkg = Path(tmp) / "sglang"
        pkg.mkdir()
        (pkg / "__init__.py").write_text("")
        for rel in request["dirs"]:
            prefix = f"sglang/{rel}/"
            for name in names:
                if name.startswith(prefix):
                    first, _, rest = name[len(prefix) :].partition("/")
                    if not first:
                        continue
                    target = pkg / rel / first
                    if rest or name.endswith("/"):
                        target.mkdir(parents=True, exist_ok=True)
                    elif not target.exists():
                        target.parent.mkdir(parents=True, exist_ok=True)
                        target.touch()
        for rel in [*request["texts"], *request["lines"]]:
            text = read(f"sglang/{rel}")
            if text is not None:
                (pkg / rel).parent.mkdir(parents=True, exist_ok=True)
                (pkg / rel).write_text(text)
        out = subprocess.run(
            [sys.executable, "-I", "-c", fact.COLLECT, fact.collect_request(), tmp],
            capture_output=True,
            text=True,
            timeout=60,
        )
    if out.returncode != 0:
        raise RuntimeError(out.stderr)
    value = fact.parse_collected_output(out.stdout.splitlines())
    if value is not None:
        value["location"] = location
    return value


def _zip_source(version: str):
    zf = zipfile.ZipFile(sglang_wheel(version))

    def read(name: str) -> str | None:
        try:
            return zf.read(name).decode("utf-8")
        except KeyError:
            return None

    return read, zf.namelist()


SOURCES: dict[str, Callable[[], tuple[Reader, list[str]] | None]] = {
    **{v: (lambda v=v: _zip_source(v)) for v in RELEASES},
    "pr20547": pr20547_tree,
}


def from_source(name: str) -> dict:
    """The fixture value: what facts.sglang makes of the source. The PR#20547 tree has no
    _version.py (setuptools-scm writes it when a git install is built, from upstream tags the
    archive lacks), so its version is None."""
    read, names = SOURCES[name]()
    value = via_fact(read, names, _location(name))
    if name == "pr20547":
        value["version"] = None
    return value


def load(name: str) -> dict:
    return json.loads((FIXTURES / f"{name}.json").read_text())["fact"]


@pytest.mark.local
@pytest.mark.parametrize("name", sorted(SOURCES))
def test_fixture_matches_source(name):
    assert load(name) == from_source(name)


@pytest.mark.local
@pytest.mark.parametrize("name", sorted(SOURCES))
def test_fact_parser_agrees_with_independent_reading(name):
    """facts.sglang (host collector + parser) and this file's reading agree on every field."""
    read, names = SOURCES[name]()
    by_fact = via_fact(read, names, "L")
    mine = extract(read, names, "L")
    if name == "pr20547":
        by_fact["version"] = mine["version"] = None
    assert by_fact == mine


@pytest.mark.parametrize("name", RELEASES)
def test_version_table_agrees_with_wheel_fixture(name):
    """specfleet.core.tables.sglang_versions predicts what the real wheel has."""
    from specfleet.core.tables.sglang_versions import predicted_install

    fact = load(name)
    predicted = predicted_install(fact["version"])
    assert predicted["features"] == fact["features"]
    assert predicted["speculative_algorithms"] == fact["speculative_algorithms"]
    assert predicted["attention_backends"] == fact["attention_backends"]


def test_pr20547_row_agrees_with_fixture():
    from specfleet.core.tables.sglang_versions import PR20547

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
    for name in SOURCES:
        fact = from_source(name)
        doc = {
            "note": notes[name] + "; made by tests/unit/test_plan_sglang_fixtures.py --write: the "
            "value facts.sglang.SGLangInstall computes (its host collector run on the tree's "
            "files). location is where settings.venv puts it on a fleet host.",
            "fact": fact,
        }
        (FIXTURES / f"{name}.json").write_text(json.dumps(doc, indent=2) + "\n")
        print(f"wrote {name}")
    return 0


if __name__ == "__main__":
    if sys.argv[1:] != ["--write"]:
        print("usage: python -m tests.unit.test_plan_sglang_fixtures --write", file=sys.stderr)
        sys.exit(2)
    sys.exit(_write())
