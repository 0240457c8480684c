"""An SGLang source tree on the host (sglang.kind "source"): the fork's real pyproject.toml needs a
Rust extension whose sources are not in the tarball, said before anything changes; the folder pip
recorded is the idempotence key; a tree goes beside a release venv."""

from __future__ import annotations

import shutil
import subprocess
import tarfile

import pytest

from facts.sglang import FileHashes, SourceTree
from specfleet.core.errors import SettingsError
from specfleet.core.settings import settings_from_dict
from specfleet.core.sglang.install import (
    choose_venv,
    decide_source_install,
    rust_extensions,
    source_build_problem,
    source_label,
    source_url,
)
from tests.harness.sources import DDTREE_FORK_TARBALL

TREE = "/opt/src/sglang-ddtree-fork/python"


@pytest.fixture(scope="module")
def fork_python(tmp_path_factory):
    """The fork's python/ folder's build files, from the shared tarball."""
    root = tmp_path_factory.mktemp("fork")
    with tarfile.open(DDTREE_FORK_TARBALL) as tar:
        members = [m for m in tar.getmembers() if m.name.startswith("python/pyproject")]
        tar.extractall(root, members=members, filter="data")
    return root / "python"


def run_fact(fact, **kwargs):
    cmd = fact.command(**kwargs)
    done = subprocess.run(["sh", "-c", str(cmd)], capture_output=True, text=True, check=True)
    return fact.process(done.stdout.splitlines())


@pytest.mark.local
def test_the_forks_rust_extension_is_read_from_its_pyproject(fork_python):
    rust = rust_extensions((fork_python / "pyproject.toml").read_text())
    assert rust == [{"target": "sglang.srt.grpc._core", "path": "../rust/sglang-grpc/Cargo.toml",
                     "binding": "PyO3"}]  # fmt: skip


@pytest.mark.local
def test_no_cargo_is_a_clear_error_before_anything_changes(fork_python):
    tree = run_fact(SourceTree(), path=str(fork_python))
    assert tree["pyproject"].strip() == (fork_python / "pyproject.toml").read_text().strip()
    assert tree["cargo"] is bool(shutil.which("cargo"))
    problem, fix = source_build_problem(str(fork_python), tree["pyproject"], cargo=False,
                                        missing=[])  # fmt: skip
    assert "sglang.srt.grpc._core" in problem and "no Rust toolchain (cargo not found)" in problem
    assert "nothing was changed" in problem and "Rust toolchain" in fix


@pytest.mark.local
def test_cargo_but_no_rust_sources_is_named(fork_python):
    found = run_fact(FileHashes(), directory=str(fork_python),
                     paths=("../rust/sglang-grpc/Cargo.toml", "pyproject.toml"))  # fmt: skip
    assert found["../rust/sglang-grpc/Cargo.toml"] is None and found["pyproject.toml"]
    problem, fix = source_build_problem(
        str(fork_python), (fork_python / "pyproject.toml").read_text(), cargo=True,
        missing=["../rust/sglang-grpc/Cargo.toml"],
    )  # fmt: skip
    assert "../rust/sglang-grpc/Cargo.toml, which is not on the host" in problem
    assert "whole repository" in fix


@pytest.mark.local
def test_a_folder_without_pyproject(tmp_path):
    tree = run_fact(SourceTree(), path=str(tmp_path))
    assert tree["pyproject"] is None
    problem, _ = source_build_problem(str(tmp_path), None, cargo=True, missing=[])
    assert "no pyproject.toml" in problem


@pytest.mark.local
def test_a_pure_python_tree_builds(tmp_path):
    (tmp_path / "pyproject.toml").write_text('[build-system]\nrequires = ["setuptools"]\n')
    tree = run_fact(SourceTree(), path=str(tmp_path))
    assert source_build_problem(str(tmp_path), tree["pyproject"], cargo=False, missing=[]) is None


def test_the_recorded_folder_is_the_key():
    assert decide_source_install(None, None, TREE).action == "install"
    same = {"url": f"file://{TREE}"}
    assert decide_source_install("0.0.0.dev0", same, TREE).action == "noop"
    assert decide_source_install("0.5.23", None, TREE).action == "reinstall"
    other = {"url": "file:///opt/src/other/python"}
    assert decide_source_install("0.0.0.dev0", other, TREE).action == "reinstall"
    assert source_url(TREE + "/") == f"file://{TREE}"


def test_a_tree_goes_beside_a_release_venv():
    release = {"sglang": "0.5.23"}
    choice = choose_venv("/opt/v", release, version="0.5.23", git=False, side_by_side=True,
                         source_path=TREE)  # fmt: skip
    assert choice.venv == "/opt/v-sglang-src-sglang-ddtree-fork"
    assert "kept as it is" in choice.reason
    assert source_label(TREE) == "src-sglang-ddtree-fork"
    laid = {"sglang": "0.0.0.dev0", "direct_urls": {"sglang": {"url": f"file://{TREE}"}}}
    assert choose_venv("/opt/v", laid, version="0.5.23", git=False, side_by_side=True,
                       source_path=TREE).venv == "/opt/v"  # fmt: skip
    assert choose_venv("/opt/v", {}, version="0.5.23", git=False, side_by_side=True,
                       source_path=TREE).venv == "/opt/v"  # fmt: skip


def test_source_settings_are_checked():
    s = settings_from_dict({"sglang": {"kind": "source", "source_path": TREE}})
    assert s.sglang.source_path == TREE
    with pytest.raises(SettingsError, match="sglang.source_path"):
        settings_from_dict({"sglang": {"kind": "source"}})
    with pytest.raises(SettingsError, match="sglang.source_path"):
        settings_from_dict({"sglang": {"kind": "source", "source_path": "relative/python"}})
